#include "bench/ping_bench.h"

#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include <grpcpp/client_context.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cli/admin_client.h"
#include "common/grpc_status.h"
#include "coordinator/coordinator_server.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::bench {

namespace {

constexpr char kKey[] = "bench/ping";

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  return context;
}

// Creates a one-rank job, joins it as rank 0 and sets kKey: the state KvGet
// and Heartbeat need. Returns the rank's context.
absl::StatusOr<v1::RankContext> JoinOneRankJob(const std::shared_ptr<grpc::Channel>& channel,
                                               absl::Duration timeout) {
  auto admin = v1::AdminService::NewStub(channel);
  v1::CreateJobRequest create;
  create.set_world_size(1);
  v1::CreateJobResponse created;
  if (grpc::Status s = admin->CreateJob(Context(timeout).get(), create, &created); !s.ok()) {
    return FromGrpcStatus(s);
  }
  v1::RankContext rank;
  rank.set_job_id(created.job_id());
  rank.set_generation(created.generation());
  rank.set_rank(0);
  rank.set_incarnation(std::random_device{}() | 1);
  auto worker = v1::WorkerService::NewStub(channel);
  v1::JoinRequest join;
  *join.mutable_context() = rank;
  join.set_host("bench-ping");
  join.set_timeout_seconds(absl::ToDoubleSeconds(timeout));
  v1::JoinResponse joined;
  if (grpc::Status s = worker->Join(Context(timeout).get(), join, &joined); !s.ok()) {
    return FromGrpcStatus(s);
  }
  v1::KvSetRequest set;
  *set.mutable_context() = rank;
  set.set_key(kKey);
  set.set_value(std::string(128, 'm'));
  v1::KvSetResponse set_reply;
  if (grpc::Status s = worker->KvSet(Context(timeout).get(), set, &set_reply); !s.ok()) {
    return FromGrpcStatus(s);
  }
  return rank;
}

}  // namespace

absl::StatusOr<PingBenchResult> RunPingBench(const PingBenchOptions& options) {
  if (options.iterations <= 0 || options.warmup < 0 || options.block <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("iterations and block must be > 0 and warmup >= 0; got ", options.iterations,
                     ", ", options.block, ", ", options.warmup));
  }
  std::unique_ptr<coordinator::CoordinatorServer> server;
  PingBenchResult result;
  result.coordinator = options.coordinator;
  if (result.coordinator.empty()) {
    coordinator::CoordinatorConfig config;
    config.port = 0;
    // The joined rank does not heartbeat between the measured calls of the
    // other methods; the default timeout would fail its job mid-run.
    config.coordination.heartbeat_timeout = absl::Hours(1);
    auto started = coordinator::CoordinatorServer::Start(config);
    if (!started.ok()) return started.status();
    server = *std::move(started);
    result.coordinator = server->address();
  }

  const std::shared_ptr<grpc::Channel> channel = cli::MakeChannel(result.coordinator);
  cli::AdminClient client(channel);
  const absl::Duration timeout = absl::Seconds(10);
  auto rank = JoinOneRankJob(channel, timeout);
  if (!rank.ok()) {
    return absl::Status(rank.status().code(),
                        absl::StrCat("setting up a one-rank job for KvGet and Heartbeat: ",
                                     rank.status().message()));
  }
  auto worker = v1::WorkerService::NewStub(channel);
  v1::KvGetRequest get;
  *get.mutable_context() = *rank;
  get.set_key(kKey);
  v1::HeartbeatRequest beat;
  *beat.mutable_context() = *rank;

  // One entry per method; blocks of each alternate in this order.
  struct Method {
    std::function<absl::Status()> call;
    std::vector<absl::Duration> samples;
  };
  std::vector<Method> methods(4);
  methods[0].call = [&]() -> absl::Status { return client.CheckHealth("", timeout).status(); };
  methods[1].call = [&]() -> absl::Status { return client.GetServerInfo(timeout).status(); };
  methods[2].call = [&]() -> absl::Status {
    v1::KvGetResponse reply;
    if (grpc::Status s = worker->KvGet(Context(timeout).get(), get, &reply); !s.ok()) {
      return FromGrpcStatus(s);
    }
    return reply.value().size() == 128
               ? absl::OkStatus()
               : absl::InternalError(absl::StrCat("KvGet returned ", reply.value().size(),
                                                  " bytes, not the 128 set"));
  };
  methods[3].call = [&]() -> absl::Status {
    v1::HeartbeatResponse reply;
    return FromGrpcStatus(worker->Heartbeat(Context(timeout).get(), beat, &reply));
  };

  for (int i = 0; i < options.warmup; ++i) {
    for (Method& m : methods) {
      if (absl::Status s = m.call(); !s.ok()) return s;
    }
  }
  for (Method& m : methods) m.samples.reserve(options.iterations);
  int done = 0;
  while (done < options.iterations) {
    const int n = std::min(options.block, options.iterations - done);
    for (Method& m : methods) {
      for (int i = 0; i < n; ++i) {
        const absl::Time start = absl::Now();
        if (absl::Status s = m.call(); !s.ok()) return s;
        m.samples.push_back(absl::Now() - start);
      }
    }
    done += n;
  }
  result.health_check = Summarize(std::move(methods[0].samples));
  result.get_server_info = Summarize(std::move(methods[1].samples));
  result.kv_get = Summarize(std::move(methods[2].samples));
  result.heartbeat = Summarize(std::move(methods[3].samples));
  const LatencyStats& floor = result.health_check;
  result.p50_ratio = result.get_server_info.p50_us / floor.p50_us;
  result.p99_ratio = result.get_server_info.p99_us / floor.p99_us;
  result.kv_get_p50_ratio = result.kv_get.p50_us / floor.p50_us;
  result.kv_get_p99_ratio = result.kv_get.p99_us / floor.p99_us;
  result.heartbeat_p50_ratio = result.heartbeat.p50_us / floor.p50_us;
  result.heartbeat_p99_ratio = result.heartbeat.p99_us / floor.p99_us;
  return result;
}

nlohmann::json ToJson(const PingBenchResult& result) {
  return {{"benchmark", "ping"},
          {"coordinator", result.coordinator},
          {"get_server_info", ToJson(result.get_server_info)},
          {"kv_get", ToJson(result.kv_get)},
          {"heartbeat", ToJson(result.heartbeat)},
          {"baseline_health_check", ToJson(result.health_check)},
          {"p50_ratio", result.p50_ratio},
          {"p99_ratio", result.p99_ratio},
          {"kv_get_p50_ratio", result.kv_get_p50_ratio},
          {"kv_get_p99_ratio", result.kv_get_p99_ratio},
          {"heartbeat_p50_ratio", result.heartbeat_p50_ratio},
          {"heartbeat_p99_ratio", result.heartbeat_p99_ratio}};
}

}  // namespace mesh::bench
