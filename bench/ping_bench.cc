#include "bench/ping_bench.h"

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cli/admin_client.h"
#include "coordinator/coordinator_server.h"

namespace mesh::bench {

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
    auto started = coordinator::CoordinatorServer::Start(config);
    if (!started.ok()) return started.status();
    server = *std::move(started);
    result.coordinator = server->address();
  }

  cli::AdminClient client(cli::MakeChannel(result.coordinator));
  const absl::Duration timeout = absl::Seconds(10);
  auto info_call = [&]() -> absl::Status { return client.GetServerInfo(timeout).status(); };
  auto health_call = [&]() -> absl::Status { return client.CheckHealth("", timeout).status(); };

  for (int i = 0; i < options.warmup; ++i) {
    if (absl::Status s = info_call(); !s.ok()) return s;
    if (absl::Status s = health_call(); !s.ok()) return s;
  }

  std::vector<absl::Duration> info_samples, health_samples;
  info_samples.reserve(options.iterations);
  health_samples.reserve(options.iterations);
  while (static_cast<int>(info_samples.size()) < options.iterations) {
    const int n =
        std::min(options.block, options.iterations - static_cast<int>(info_samples.size()));
    for (int i = 0; i < n; ++i) {
      const absl::Time start = absl::Now();
      if (absl::Status s = health_call(); !s.ok()) return s;
      health_samples.push_back(absl::Now() - start);
    }
    for (int i = 0; i < n; ++i) {
      const absl::Time start = absl::Now();
      if (absl::Status s = info_call(); !s.ok()) return s;
      info_samples.push_back(absl::Now() - start);
    }
  }
  result.get_server_info = Summarize(std::move(info_samples));
  result.health_check = Summarize(std::move(health_samples));
  result.p50_ratio = result.get_server_info.p50_us / result.health_check.p50_us;
  result.p99_ratio = result.get_server_info.p99_us / result.health_check.p99_us;
  return result;
}

nlohmann::json ToJson(const PingBenchResult& result) {
  return {{"benchmark", "ping"},
          {"coordinator", result.coordinator},
          {"get_server_info", ToJson(result.get_server_info)},
          {"baseline_health_check", ToJson(result.health_check)},
          {"p50_ratio", result.p50_ratio},
          {"p99_ratio", result.p99_ratio}};
}

}  // namespace mesh::bench
