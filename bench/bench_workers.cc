#include "bench/bench_workers.h"

#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <utility>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "coordinator/coordinator_server.h"
#include "mesh/coordinator_store.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::bench {
namespace {

absl::Status JoinJob(const std::string& coordinator, const std::string& job, int rank,
                     uint64_t incarnation, absl::Duration timeout) {
  auto stub = v1::WorkerService::NewStub(
      grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
  v1::JoinRequest request;
  request.mutable_context()->set_job_id(job);
  request.mutable_context()->set_generation(0);
  request.mutable_context()->set_rank(rank);
  request.mutable_context()->set_incarnation(incarnation);
  request.set_host("127.0.0.1");
  request.set_timeout_seconds(absl::ToDoubleSeconds(timeout));
  v1::JoinResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(5)));
  const grpc::Status status = stub->Join(&ctx, request, &response);
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("join ", coordinator, ": ", status.error_message()));
}

struct Child {
  int rank = 0;
  std::optional<Subprocess> process;  // Unset when it could not be started.
};

void KillAll(std::vector<Child>& children) {
  for (Child& c : children) {
    if (c.process.has_value() && c.process->running()) c.process->Signal(SIGKILL).IgnoreError();
  }
  for (Child& c : children) {
    if (c.process.has_value()) c.process->Wait().IgnoreError();
  }
}

}  // namespace

void EmitRow(const nlohmann::json& row) {
  std::printf("%s%s\n", kRowPrefix, row.dump().c_str());
  std::fflush(stdout);
}

absl::StatusOr<std::unique_ptr<GlooProcessGroupFactory>> ConnectBenchWorker(
    const std::string& coordinator, const std::string& job, int rank, int nproc,
    const GlooOptions& gloo, absl::Duration timeout) {
  const uint64_t incarnation = std::random_device{}() | (uint64_t{1} << 40);
  if (absl::Status s = JoinJob(coordinator, job, rank, incarnation, timeout); !s.ok()) return s;
  CoordinatorStoreOptions store_options;
  store_options.address = coordinator;
  store_options.identity = RankIdentity{job, 0, rank, incarnation};
  store_options.timeout = timeout;
  auto store = CoordinatorStore::Create(store_options);
  if (!store.ok()) return store.status();
  return GlooProcessGroupFactory::Create(std::shared_ptr<Store>(*std::move(store)), rank, nproc,
                                         gloo);
}

absl::Status RunBenchWorkers(const BenchWorkersOptions& options, const WorkerArgsFn& args,
                             const std::function<absl::Status(const nlohmann::json&)>& on_row) {
  if (options.nproc < 1) return absl::InvalidArgumentError("need at least one process");
  coordinator::CoordinatorConfig config;
  config.port = 0;
  // Workers of the bench do not heartbeat; keep them alive for the run.
  config.coordination.heartbeat_timeout = options.deadline + absl::Minutes(1);
  auto server = coordinator::CoordinatorServer::Start(config);
  if (!server.ok()) return server.status();
  const std::string job = absl::StrCat(options.job_prefix, "-", getpid());
  coordinator::JobLayout layout;
  layout.job_id = job;
  layout.world_size = options.nproc;
  if (auto created = (*server)->coordination().CreateJob(layout); !created.ok()) {
    return created.status();
  }

  // The parent runs gRPC threads: Subprocess only makes async-signal-safe
  // calls between fork and exec. Workers never outlive the bench (SIGKILL
  // when it dies); rank 0's stdout carries the rows, the others' is dropped.
  std::vector<Child> children(options.nproc);
  absl::Status spawn_status;
  for (int r = 0; r < options.nproc; ++r) {
    SpawnOptions spawn;
    spawn.argv = args(r, (*server)->address(), job);
    spawn.stdout_to = r == 0 ? Redirect::Pipe() : Redirect::Null();
    absl::StatusOr<Subprocess> process = Subprocess::Spawn(spawn);
    if (!process.ok()) {
      spawn_status = process.status();
      break;
    }
    children[r].process.emplace(*std::move(process));
    children[r].rank = r;
  }
  if (!spawn_status.ok()) {
    KillAll(children);
    return spawn_status;
  }
  const int rows_fd = children[0].process->stdout_fd();

  absl::Status failure;
  std::string pending;
  bool eof = false;
  const absl::Time deadline = absl::Now() + options.deadline;
  auto all_exited = [&] {
    return std::all_of(children.begin(), children.end(),
                       [](const Child& c) { return !c.process->running(); });
  };
  while (failure.ok() && !(eof && all_exited())) {
    if (absl::Now() > deadline) {
      failure = absl::DeadlineExceededError(absl::StrCat(
          options.job_prefix, " did not finish within ", absl::FormatDuration(options.deadline)));
      break;
    }
    if (!eof) {
      struct pollfd pfd = {rows_fd, POLLIN, 0};
      if (poll(&pfd, 1, 100) > 0) {
        char buf[4096];
        const ssize_t got = read(rows_fd, buf, sizeof(buf));
        // The pipe is non-blocking: EAGAIN and EINTR only mean "not now".
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
          eof = true;
        } else if (got > 0) {
          pending.append(buf, static_cast<size_t>(got));
          for (size_t nl; failure.ok() && (nl = pending.find('\n')) != std::string::npos;) {
            const std::string line = pending.substr(0, nl);
            pending.erase(0, nl + 1);
            if (line.rfind(kRowPrefix, 0) != 0) continue;
            auto json = nlohmann::json::parse(line.substr(sizeof(kRowPrefix) - 1), nullptr,
                                              /*allow_exceptions=*/false);
            if (json.is_discarded()) {
              failure = absl::InternalError(absl::StrCat("malformed row from rank 0: ", line));
            } else if (on_row) {
              failure = on_row(json);
            }
          }
        }
      }
    } else {
      absl::SleepFor(absl::Milliseconds(20));
    }
    for (Child& c : children) {
      if (!c.process->running()) continue;
      if (std::optional<ExitStatus> exit = c.process->TryWait(); exit.has_value()) {
        if (!exit->success()) {
          failure = absl::InternalError(
              absl::StrCat("worker rank ", c.rank, " (pid ", c.process->pid(),
                           ") failed: ", exit->ToString(), "; its stderr is above"));
        }
      }
    }
  }
  KillAll(children);
  (*server)->Shutdown(absl::Seconds(1));
  return failure;
}

}  // namespace mesh::bench
