#include "bench/store_bench.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/subprocess.h"
#include "coordinator/etcd_client.h"
#include "coordinator/etcd_job_store.h"
#include "coordinator/leader_election.h"
#include "coordinator/sqlite_job_store.h"

namespace mesh::bench {
namespace store_bench {

using coordinator::EtcdClient;
using coordinator::EtcdClientOptions;
using coordinator::JobStore;

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

// A 3-member etcd cluster on 127.0.0.1, in `dir`, for the bench's lifetime.
class EtcdMembers {
 public:
  static absl::StatusOr<std::unique_ptr<EtcdMembers>> Start(const std::string& binary,
                                                            const std::string& dir) {
    auto members = std::unique_ptr<EtcdMembers>(new EtcdMembers());
    std::vector<std::string> peers;
    std::vector<int> client_ports;
    for (int i = 0; i < 3; ++i) {
      client_ports.push_back(FreePort());
      const int peer = FreePort();
      members->peer_urls_.push_back(absl::StrCat("http://127.0.0.1:", peer));
      peers.push_back(absl::StrCat("m", i, "=", members->peer_urls_.back()));
    }
    for (int i = 0; i < 3; ++i) {
      const std::string client = absl::StrCat("http://127.0.0.1:", client_ports[i]);
      SpawnOptions spawn;
      spawn.argv = {binary,
                    "--name",
                    absl::StrCat("m", i),
                    "--data-dir",
                    absl::StrCat(dir, "/m", i),
                    "--listen-client-urls",
                    client,
                    "--advertise-client-urls",
                    client,
                    "--listen-peer-urls",
                    members->peer_urls_[i],
                    "--initial-advertise-peer-urls",
                    members->peer_urls_[i],
                    "--initial-cluster",
                    absl::StrJoin(peers, ","),
                    "--initial-cluster-state",
                    "new",
                    "--heartbeat-interval",
                    "50",
                    "--election-timeout",
                    "500"};
      spawn.stdout_to = Redirect::File(absl::StrCat(dir, "/m", i, ".log"));
      spawn.stderr_to = Redirect::Stdout();
      spawn.group = SpawnOptions::Group::kNewGroup;
      absl::StatusOr<Subprocess> process = Subprocess::Spawn(spawn);
      if (!process.ok()) return process.status();
      members->processes_.push_back(std::make_unique<Subprocess>(*std::move(process)));
      members->endpoints_.push_back(absl::StrCat("127.0.0.1:", client_ports[i]));
    }
    return members;
  }

  ~EtcdMembers() {
    for (auto& process : processes_) (void)process->Terminate(absl::ZeroDuration());
  }

  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  EtcdMembers() = default;
  std::vector<std::string> peer_urls_;
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<Subprocess>> processes_;
};

coordinator::NewJob Job(const std::string& key) {
  coordinator::NewJob job;
  job.idempotency_key = key;
  job.name = key;
  job.state = "PENDING";
  job.pending_reason = "waiting for nodes";
  job.spec = std::string(512, 's');  // About what a small spec serializes to.
  return job;
}

absl::StatusOr<StoreBackendResult> Measure(const std::string& name, JobStore& store,
                                           const StoreBenchOptions& options) {
  StoreBackendResult result;
  result.name = name;
  std::vector<absl::Duration> samples;
  samples.reserve(options.creates);
  const absl::Time start = absl::Now();
  for (int i = 0; i < options.creates; ++i) {
    const absl::Time t0 = absl::Now();
    absl::StatusOr<coordinator::CreateJobResult> created =
        store.CreateJob(Job(absl::StrCat("seq-", i)));
    if (!created.ok()) return created.status();
    samples.push_back(absl::Now() - t0);
  }
  result.creates_per_s = options.creates / absl::ToDoubleSeconds(absl::Now() - start);
  result.ack = Summarize(std::move(samples));

  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  absl::Status first_error;
  absl::Mutex error_mu;
  const absl::Time concurrent_start = absl::Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < options.threads; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < options.concurrent_creates && !failed; i = next++) {
        absl::StatusOr<coordinator::CreateJobResult> created =
            store.CreateJob(Job(absl::StrCat("par-", i)));
        if (!created.ok()) {
          absl::MutexLock lock(&error_mu);
          if (first_error.ok()) first_error = created.status();
          failed = true;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  if (!first_error.ok()) return first_error;
  result.concurrent_creates_per_s =
      options.concurrent_creates / absl::ToDoubleSeconds(absl::Now() - concurrent_start);
  return result;
}

// One takeover: replica A leads; A stops renewing (its process would be
// gone); how long until B leads.
absl::StatusOr<absl::Duration> Takeover(std::shared_ptr<EtcdClient> client, const std::string& key,
                                        absl::Duration lease) {
  coordinator::LeaderElection a(client, {key, "a:1", lease});
  absl::StatusOr<coordinator::LeaderTerm> led = a.Campaign(nullptr);
  if (!led.ok()) return led.status();
  a.KeepLeading(nullptr);
  coordinator::LeaderElection b(client, {key, "b:1", lease});
  std::optional<absl::Time> b_led;
  std::thread campaign([&] {
    if (b.Campaign(nullptr).ok()) b_led = absl::Now();
  });
  // B is waiting; A renews for a while, then goes silent (no renewal, no
  // resignation), somewhere between two renewals, as a killed process does.
  absl::SleepFor(absl::Milliseconds(300) + lease / 7);
  const absl::Time silent = absl::Now();
  a.Stop();
  campaign.join();
  (void)b.Resign();
  if (!b_led.has_value()) return absl::InternalError("the second replica did not take over");
  return *b_led - silent;
}

}  // namespace store_bench

absl::StatusOr<StoreBenchResult> RunStoreBench(const StoreBenchOptions& options) {
  using namespace store_bench;  // NOLINT: the file's own helpers
  StoreBenchResult result;
  result.lease_s = options.lease_s;
  char tmpl[] = "/tmp/mesh-store-bench.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return absl::InternalError("mkdtemp failed");
  const std::string dir = tmpl;
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } remove_dir{dir};

  {
    absl::StatusOr<std::unique_ptr<coordinator::SqliteJobStore>> sqlite =
        coordinator::SqliteJobStore::Open(dir + "/bench.db", Clock::Real());
    if (!sqlite.ok()) return sqlite.status();
    absl::StatusOr<StoreBackendResult> measured = Measure("sqlite", **sqlite, options);
    if (!measured.ok()) return measured.status();
    result.backends.push_back(*std::move(measured));
  }

  std::unique_ptr<EtcdMembers> members;
  std::vector<std::string> endpoints;
  if (options.etcd_endpoints.empty()) {
    if (::access(options.etcd_binary.c_str(), X_OK) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(options.etcd_binary,
                       " is not there: install etcd-server (scripts/install-deps.sh) or give "
                       "--etcd host:port,..."));
    }
    absl::StatusOr<std::unique_ptr<EtcdMembers>> started =
        EtcdMembers::Start(options.etcd_binary, dir);
    if (!started.ok()) return started.status();
    members = *std::move(started);
    endpoints = members->endpoints();
    result.etcd = "3 members on 127.0.0.1, started here";
  } else {
    endpoints = absl::StrSplit(options.etcd_endpoints, ',', absl::SkipEmpty());
    result.etcd = options.etcd_endpoints;
  }
  EtcdClientOptions client_options;
  client_options.endpoints = endpoints;
  client_options.connect_timeout = absl::Seconds(30);
  absl::StatusOr<std::shared_ptr<EtcdClient>> client = EtcdClient::Connect(client_options);
  if (!client.ok()) return client.status();
  const std::string prefix =
      absl::StrCat("/mesh-store-bench-", ::getpid(), "-", absl::ToUnixMicros(absl::Now()));
  absl::StatusOr<std::unique_ptr<coordinator::EtcdJobStore>> etcd =
      coordinator::EtcdJobStore::Open(*client, prefix, Clock::Real());
  if (!etcd.ok()) return etcd.status();
  absl::StatusOr<StoreBackendResult> measured = Measure("etcd", **etcd, options);
  if (!measured.ok()) return measured.status();
  result.backends.push_back(*std::move(measured));

  std::vector<absl::Duration> takeovers;
  for (int i = 0; i < options.takeovers; ++i) {
    absl::StatusOr<absl::Duration> took =
        Takeover(*client, absl::StrCat(prefix, "/leader-", i), absl::Seconds(options.lease_s));
    if (!took.ok()) return took.status();
    takeovers.push_back(*took);
  }
  result.takeover = Summarize(std::move(takeovers));
  double load[1] = {0};
  if (getloadavg(load, 1) == 1) result.load_average = load[0];
  return result;
}

nlohmann::json ToJson(const StoreBenchResult& result) {
  nlohmann::json backends = nlohmann::json::array();
  for (const StoreBackendResult& backend : result.backends) {
    backends.push_back({{"name", backend.name},
                        {"ack", ToJson(backend.ack)},
                        {"creates_per_s", backend.creates_per_s},
                        {"concurrent_creates_per_s", backend.concurrent_creates_per_s}});
  }
  return {
      {"suite", "store"},          {"backends", backends}, {"takeover", ToJson(result.takeover)},
      {"lease_s", result.lease_s}, {"etcd", result.etcd},  {"load_average", result.load_average}};
}

}  // namespace mesh::bench
