#include "bench/metrics_bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/rendezvous_bench.h"
#include "common/grpc_status.h"
#include "common/metrics_prometheus.h"
#include "coordinator/coordinator_server.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::bench {

namespace {

// One HTTP/1.0 GET of /metrics on 127.0.0.1:port; returns the body.
absl::StatusOr<std::string> Scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  // Bounded: a stuck exposer fails the bench instead of hanging it.
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return absl::UnavailableError(absl::StrCat("connect to 127.0.0.1:", port, " failed"));
  }
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return absl::InternalError("sending the scrape request failed");
  }
  std::string response;
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) break;
    if (n < 0) return absl::InternalError("reading the scrape failed or timed out (10 s)");
    response.append(buf, static_cast<size_t>(n));
  }
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") || response.find(" 200 ") > 12 ||
      body == std::string::npos) {
    return absl::InternalError(absl::StrCat(
        "bad scrape response: ", response.substr(0, std::min<size_t>(80, response.size()))));
  }
  return response.substr(body + 4);
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return context;
}

// One job's worth of coordinator history: CreateJob, Join, KvSet, KvGet,
// Barrier, Leave for a one-rank job.
absl::Status RunOneJob(v1::AdminService::Stub& admin, v1::WorkerService::Stub& worker, int i) {
  v1::CreateJobRequest create;
  create.set_world_size(1);
  v1::CreateJobResponse created;
  grpc::Status s = admin.CreateJob(Context().get(), create, &created);
  v1::RankContext rank;
  rank.set_job_id(created.job_id());
  rank.set_generation(created.generation());
  rank.set_rank(0);
  rank.set_incarnation(static_cast<uint64_t>(i) + 1);
  if (s.ok()) {
    v1::JoinRequest join;
    *join.mutable_context() = rank;
    join.set_host("bench-metrics");
    v1::JoinResponse joined;
    s = worker.Join(Context().get(), join, &joined);
  }
  if (s.ok()) {
    v1::KvSetRequest set;
    *set.mutable_context() = rank;
    set.set_key("bench/key");
    set.set_value(std::string(128, 'm'));
    v1::KvSetResponse reply;
    s = worker.KvSet(Context().get(), set, &reply);
  }
  if (s.ok()) {
    v1::KvGetRequest get;
    *get.mutable_context() = rank;
    get.set_key("bench/key");
    v1::KvGetResponse reply;
    s = worker.KvGet(Context().get(), get, &reply);
  }
  if (s.ok()) {
    v1::BarrierRequest barrier;
    *barrier.mutable_context() = rank;
    barrier.set_name("bench");
    v1::BarrierResponse reply;
    s = worker.Barrier(Context().get(), barrier, &reply);
  }
  if (s.ok()) {
    v1::LeaveRequest leave;
    *leave.mutable_context() = rank;
    v1::LeaveResponse reply;
    s = worker.Leave(Context().get(), leave, &reply);
  }
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("history job ", i, " (", created.job_id(),
                                            "): ", FromGrpcStatus(s).ToString()));
  }
  return absl::OkStatus();
}

double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// ns per call of `fn`, median of 5 batches of `count / 5` calls.
template <typename Fn>
double NsPerCall(int64_t count, Fn&& fn) {
  const int64_t batch = std::max<int64_t>(1, count / 5);
  std::vector<double> per;
  for (int b = 0; b < 5; ++b) {
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < batch; ++i) fn();
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    per.push_back(took.count() / static_cast<double>(batch));
  }
  return MedianOf(std::move(per));
}

}  // namespace

absl::StatusOr<MetricsBenchResult> RunMetricsBench(const MetricsBenchOptions& options) {
  if (options.jobs < 0 || options.scrapes <= 0 || options.warmup < 0 || options.increments <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("jobs and warmup must be >= 0, scrapes and increments > 0; got ", options.jobs,
                     ", ", options.warmup, ", ", options.scrapes, ", ", options.increments));
  }
  MetricsBenchResult result;
  result.jobs = options.jobs;
  result.load_average = LoadAverage();

  // Declared before the servers that record into them (destroyed after).
  metrics::PrometheusRegistry registry;
  metrics::PrometheusRegistry baseline_registry;
  metrics::AddBuildInfo(registry, "coordinator");
  metrics::AddBuildInfo(baseline_registry, "coordinator");
  auto exposer = metrics::MetricsServer::Start("127.0.0.1", 0, registry);
  if (!exposer.ok()) return exposer.status();
  auto baseline_exposer = metrics::MetricsServer::Start("127.0.0.1", 0, baseline_registry);
  if (!baseline_exposer.ok()) return baseline_exposer.status();

  coordinator::CoordinatorConfig config;
  config.port = 0;
  config.metrics = &registry;
  config.coordination.heartbeat_timeout = absl::Hours(1);
  auto server = coordinator::CoordinatorServer::Start(config);
  if (!server.ok()) return server.status();

  auto empty = Scrape((*exposer)->port());
  if (!empty.ok()) return empty.status();
  result.empty_coordinator_bytes = static_cast<int64_t>(empty->size());

  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  auto admin = v1::AdminService::NewStub(channel);
  auto worker = v1::WorkerService::NewStub(channel);
  for (int i = 0; i < options.jobs; ++i) {
    if (absl::Status s = RunOneJob(*admin, *worker, i); !s.ok()) return s;
    if (i == 0) {
      auto one = Scrape((*exposer)->port());
      if (!one.ok()) return one.status();
      result.one_job_bytes = static_cast<int64_t>(one->size());
    }
  }

  std::vector<absl::Duration> mesh_samples, baseline_samples;
  for (int i = 0; i < options.warmup + options.scrapes; ++i) {
    const bool measured = i >= options.warmup;
    absl::Time start = absl::Now();
    auto base = Scrape((*baseline_exposer)->port());
    if (!base.ok()) return base.status();
    if (measured) baseline_samples.push_back(absl::Now() - start);
    result.baseline_bytes = static_cast<int64_t>(base->size());
    start = absl::Now();
    auto body = Scrape((*exposer)->port());
    if (!body.ok()) return body.status();
    if (measured) mesh_samples.push_back(absl::Now() - start);
    result.scrape_bytes = static_cast<int64_t>(body->size());
    if (i + 1 == options.warmup + options.scrapes) {
      for (size_t pos = body->find("# TYPE "); pos != std::string::npos;
           pos = body->find("# TYPE ", pos + 1)) {
        ++result.families;
      }
    }
  }
  result.scrape = Summarize(std::move(mesh_samples));
  result.baseline_scrape = Summarize(std::move(baseline_samples));
  result.scrape_p50_ratio = result.scrape.p50_us / result.baseline_scrape.p50_us;

  // The hot path: a child fetched once, as managers hold it.
  metrics::Counter* counter =
      registry.AddCounter("mesh_bench_increments_total", "mesh-bench metrics' own counter", {"op"})
          ->WithLabels({"bench"});
  std::atomic<uint64_t> raw{0};
  for (int i = 0; i < 100000; ++i) counter->Increment();  // Warm-up.
  result.baseline_increment_ns =
      NsPerCall(options.increments, [&] { raw.fetch_add(1, std::memory_order_relaxed); });
  result.increment_ns = NsPerCall(options.increments, [&] { counter->Increment(); });
  result.increment_ratio = result.increment_ns / result.baseline_increment_ns;
  (*server)->Shutdown(absl::ZeroDuration());
  return result;
}

nlohmann::json ToJson(const MetricsBenchResult& r) {
  return {{"benchmark", "metrics"},
          {"jobs", r.jobs},
          {"scrape", ToJson(r.scrape)},
          {"baseline_scrape", ToJson(r.baseline_scrape)},
          {"scrape_bytes", r.scrape_bytes},
          {"empty_coordinator_bytes", r.empty_coordinator_bytes},
          {"one_job_bytes", r.one_job_bytes},
          {"baseline_bytes", r.baseline_bytes},
          {"families", r.families},
          {"scrape_p50_ratio", r.scrape_p50_ratio},
          {"increment_ns", r.increment_ns},
          {"baseline_increment_ns", r.baseline_increment_ns},
          {"increment_ratio", r.increment_ratio},
          {"load_average", r.load_average}};
}

}  // namespace mesh::bench
