#include "bench/bench_workers.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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
  pid_t pid = -1;
  int rank = 0;
  bool exited = false;
  int wait_status = 0;
};

void KillAll(std::vector<Child>& children) {
  for (Child& c : children) {
    if (!c.exited && c.pid > 0) kill(c.pid, SIGKILL);
  }
  for (Child& c : children) {
    if (!c.exited && c.pid > 0) {
      waitpid(c.pid, &c.wait_status, 0);
      c.exited = true;
    }
  }
}

std::string DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exit code ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    return absl::StrCat("signal ", WTERMSIG(wait_status), " (", strsignal(WTERMSIG(wait_status)),
                        ")");
  }
  return "unknown status";
}

// fork + exec with everything prepared before fork: the parent runs gRPC
// threads, so the child may only make async-signal-safe calls.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& args, int stdout_fd, pid_t parent) {
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::UnavailableError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    // Workers never outlive the bench: SIGKILL when the parent dies, and
    // the parent may already be gone by the time the flag is set.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (stdout_fd >= 0) dup2(stdout_fd, STDOUT_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
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

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe: ", strerror(errno)));
  }
  const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  std::vector<Child> children(options.nproc);
  const pid_t self = getpid();
  absl::Status spawn_status;
  for (int r = 0; r < options.nproc; ++r) {
    auto pid = Spawn(args(r, (*server)->address(), job), r == 0 ? pipe_fds[1] : devnull, self);
    if (!pid.ok()) {
      spawn_status = pid.status();
      break;
    }
    children[r].pid = *pid;
    children[r].rank = r;
  }
  close(pipe_fds[1]);
  if (devnull >= 0) close(devnull);
  if (!spawn_status.ok()) {
    KillAll(children);
    close(pipe_fds[0]);
    return spawn_status;
  }

  absl::Status failure;
  std::string pending;
  bool eof = false;
  const absl::Time deadline = absl::Now() + options.deadline;
  auto all_exited = [&] {
    return std::all_of(children.begin(), children.end(), [](const Child& c) { return c.exited; });
  };
  while (failure.ok() && !(eof && all_exited())) {
    if (absl::Now() > deadline) {
      failure = absl::DeadlineExceededError(absl::StrCat(
          options.job_prefix, " did not finish within ", absl::FormatDuration(options.deadline)));
      break;
    }
    if (!eof) {
      struct pollfd pfd = {pipe_fds[0], POLLIN, 0};
      if (poll(&pfd, 1, 100) > 0) {
        char buf[4096];
        const ssize_t got = read(pipe_fds[0], buf, sizeof(buf));
        if (got <= 0) {
          eof = true;
        } else {
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
      if (c.exited) continue;
      if (waitpid(c.pid, &c.wait_status, WNOHANG) == c.pid) {
        c.exited = true;
        if (!WIFEXITED(c.wait_status) || WEXITSTATUS(c.wait_status) != 0) {
          failure = absl::InternalError(absl::StrCat("worker rank ", c.rank, " (pid ", c.pid,
                                                     ") failed: ", DescribeExit(c.wait_status),
                                                     "; its stderr is above"));
        }
      }
    }
  }
  close(pipe_fds[0]);
  KillAll(children);
  (*server)->Shutdown(absl::Seconds(1));
  return failure;
}

}  // namespace mesh::bench
