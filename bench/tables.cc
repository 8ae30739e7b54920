// mesh-bench's report tables (tables.h): the table each suite's run prints
// to stdout, from its result. printf only; the JSON is each suite's ToJson.

#include "bench/tables.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace mesh::bench {

std::string Rule(std::initializer_list<int> widths) {
  std::string line = "|";
  for (int w : widths) line += std::string(w + 2, '-') + "|";
  return line;
}

double Mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

void PrintRendezvous(const mesh::bench::RendezvousBenchResult& r, int warmup) {
  std::printf(
      "# mesh-bench rendezvous: %d ranks over %d %sconnections%s, median of %zu rounds "
      "(+%d warm-up) against %s%s; load average %.2f\n",
      r.ranks, r.channels, r.tls ? "TLS " : "",
      r.via_agent ? absl::StrCat(" through agents of ", r.ranks_per_node, " ranks").c_str() : "",
      r.mesh.size(), warmup, r.coordinator.c_str(), r.in_process ? " (in process)" : "",
      r.load_average);
  std::printf("# opening the %d connections%s took %.3f s, before the first round\n", r.channels,
              r.tls ? " (TLS handshakes included)" : "", r.connect_s);
  // "join 0.101-0.120, ...": when the first and the last rank finished each step.
  auto steps = [](const std::vector<double>& first, const std::vector<double>& last,
                  const std::vector<std::string>& names) {
    std::string text;
    for (size_t i = 0; i < last.size() && i < first.size() && i < names.size(); ++i) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s%s %.3f-%.3f", i == 0 ? "" : ", ", names[i].c_str(),
                    first[i], last[i]);
      text += buf;
    }
    return text;
  };
  std::printf("| %-32s | %9s | %9s | %9s | %9s | %-62s |\n", "run", "total (s)", "CPU (s)",
              "p50 (ms)", "p99 (ms)", "step done by first-last rank at (s)");
  std::printf("%s\n", Rule({32, 9, 9, 9, 9, 62}).c_str());
  std::printf("| %-32s | %9.3f | %9.3f | %9.1f | %9.1f | %-62s |\n",
              "Mesh: Join+Barrier+GetUniqueIds", r.mesh_total_s, r.mesh_cpu_s, r.mesh_p50_us / 1e3,
              r.mesh_p99_us / 1e3,
              steps(r.mesh_step_first_s, r.mesh_step_s, mesh::bench::MeshStepNames()).c_str());
  std::printf(
      "| %-32s | %9.3f | %9.3f | %9.1f | %9.1f | %-62s |\n", "baseline: 3 x grpc.health Check",
      r.baseline_total_s, r.baseline_cpu_s, r.baseline_p50_us / 1e3, r.baseline_p99_us / 1e3,
      steps(r.baseline_step_first_s, r.baseline_step_s, mesh::bench::BaselineStepNames()).c_str());
  std::printf("| %-32s | %9.2f | %9.2f | %9.2f | %9.2f | %-62s |\n", "ratio (Mesh / baseline)",
              r.ratio, r.cpu_ratio, r.p50_ratio, r.p99_ratio, "");
  std::printf(
      "# ratios are medians of each round's Mesh / baseline; rounds (Mesh s / baseline s):");
  for (size_t i = 0; i < r.mesh.size(); ++i) {
    std::printf(" %.3f/%.3f", r.mesh[i].total_s, r.baseline[i].total_s);
  }
  std::printf("\n# process: %d threads, %.0f MiB RSS (peak %.0f MiB), %d fds\n", r.process.threads,
              Mib(r.process.rss_bytes), Mib(r.process.peak_rss_bytes), r.process.open_fds);
}

void PrintWaiters(const mesh::bench::WaitersBenchResult& r) {
  std::printf(
      "# mesh-bench waiters: in-process coordinator %s, %d connections, load average %.2f; "
      "threads and RSS are the whole process (client + server)\n",
      r.coordinator.c_str(), r.channels, r.load_average);
  std::printf("| %-7s | %6s | %7s | %15s | %16s | %9s | %10s | %8s | %8s | %11s |\n", "kind",
              "ranks", "pending", "threads before", "threads holding", "RSS (MiB)", "+RSS (MiB)",
              "KiB/wait", "hold (s)", "release (s)");
  std::printf("%s\n", Rule({7, 6, 7, 15, 16, 9, 10, 8, 8, 11}).c_str());
  for (const auto& k : r.kinds) {
    std::printf("| %-7s | %6d | %7lld | %15d | %16d | %9.0f | %10.1f | %8.2f | %8.3f | %11.3f |\n",
                mesh::bench::WaitKindName(k.kind), k.ranks, static_cast<long long>(k.pending),
                k.before.threads, k.holding.threads, Mib(k.holding.rss_bytes),
                Mib(k.holding.rss_bytes - k.before.rss_bytes), k.rss_per_wait_bytes / 1024.0,
                k.hold_s, k.release_s);
  }
}

void PrintPing(const PingBenchResult& result) {
  std::printf("# mesh-bench ping: %d calls per method against %s\n", result.get_server_info.count,
              result.coordinator.c_str());
  std::printf("| %-28s | %10s | %10s | %10s | %10s |\n", "call", "p50 (us)", "p99 (us)",
              "p50 ratio", "p99 ratio");
  std::printf("%s\n", Rule({28, 10, 10, 10, 10}).c_str());
  const auto row = [](const char* name, const mesh::bench::LatencyStats& s,
                      const mesh::bench::LatencyStats& floor) {
    std::printf("| %-28s | %10.1f | %10.1f | %10.2f | %10.2f |\n", name, s.p50_us, s.p99_us,
                s.p50_us / floor.p50_us, s.p99_us / floor.p99_us);
  };
  row("baseline: grpc.health Check", result.health_check, result.health_check);
  row("AdminService.GetServerInfo", result.get_server_info, result.health_check);
  row("WorkerService.KvGet", result.kv_get, result.health_check);
  row("WorkerService.Heartbeat", result.heartbeat, result.health_check);
}

void PrintNcclOverhead(const NcclOverheadResult& result, const NcclOverheadOptions& nccl,
                       const std::string& nccl_stream) {
  std::printf(
      "# mesh-bench nccl-overhead: all_reduce (sum, float32), world size 1, cuda:%d (%s), NCCL "
      "%d, libmesh on the %s stream; p50 per call\n",
      nccl.device, result.device_name.c_str(), result.nccl_version, nccl_stream.c_str());
  std::printf("| %10s | %14s | %14s | %13s | %7s | %14s | %14s | %7s |\n", "bytes", "raw pipe (us)",
              "mesh pipe (us)", "overhead (us)", "ratio", "raw sync (us)", "mesh sync (us)",
              "ratio");
  std::printf("%s\n", Rule({10, 14, 14, 13, 7, 14, 14, 7}).c_str());
  for (const auto& row : result.rows) {
    std::printf("| %10lld | %14.2f | %14.2f | %13.2f | %7.2f | %14.2f | %14.2f | %7.2f |\n",
                static_cast<long long>(row.bytes), row.raw_pipelined.p50_us,
                row.mesh_pipelined.p50_us, row.pipelined_overhead_us, row.pipelined_ratio,
                row.raw_sync.p50_us, row.mesh_sync.p50_us, row.sync_ratio);
  }
}

void PrintDTensorPack(const DTensorPackResult& result, const DTensorPackOptions& pack) {
  std::printf(
      "# mesh-bench dtensor-pack: Shard(1) block of a 2-way split, float32, cuda:%d; p50 per "
      "call, GB/s = block bytes / time\n",
      pack.device);
  std::printf("| %10s | %10s | %10s | %12s | %10s | %12s |\n", "bytes", "copy GB/s", "pack GB/s",
              "pack / copy", "unpack GB/s", "unpack / copy");
  std::printf("%s\n", Rule({10, 10, 10, 12, 10, 12}).c_str());
  for (const auto& row : result.rows) {
    std::printf("| %10lld | %10.1f | %10.1f | %12.2f | %10.1f | %12.2f |\n",
                static_cast<long long>(row.bytes), row.copy_gbps, row.pack_gbps, row.pack_fraction,
                row.unpack_gbps, row.unpack_fraction);
  }
}

void PrintStore(const StoreBenchResult& r, const StoreBenchOptions& store) {
  std::printf(
      "# mesh-bench store: CreateJob with an idempotency key, %d sequential and %d from %d "
      "threads per backend; etcd: %s; load average %.2f\n",
      store.creates, store.concurrent_creates, store.threads, r.etcd.c_str(), r.load_average);
  std::printf("| %-8s | %10s | %10s | %10s | %12s | %14s |\n", "backend", "ack p50 ms",
              "ack p99 ms", "ack max ms", "seq. per s", "concurrent/s");
  std::printf("%s\n", Rule({8, 10, 10, 10, 12, 14}).c_str());
  for (const auto& b : r.backends) {
    std::printf("| %-8s | %10.2f | %10.2f | %10.2f | %12.0f | %14.0f |\n", b.name.c_str(),
                b.ack.p50_us / 1000, b.ack.p99_us / 1000, b.ack.max_us / 1000, b.creates_per_s,
                b.concurrent_creates_per_s);
  }
  if (r.backends.size() == 2 && r.backends[0].ack.p50_us > 0) {
    std::printf("# etcd / sqlite: ack p50 %.2fx, p99 %.2fx, concurrent throughput %.2fx\n",
                r.backends[1].ack.p50_us / r.backends[0].ack.p50_us,
                r.backends[1].ack.p99_us / std::max(1.0, r.backends[0].ack.p99_us),
                r.backends[1].concurrent_creates_per_s /
                    std::max(1.0, r.backends[0].concurrent_creates_per_s));
  }
  std::printf(
      "# leader takeover after the leader goes silent (lease %.1f s), %d runs: p50 %.2f s, "
      "max %.2f s (target: < 3 s with a 2 s lease); etcd ack p99 target: < 20 ms\n",
      r.lease_s, r.takeover.count, r.takeover.p50_us / 1e6, r.takeover.max_us / 1e6);
}

void PrintProgress(const ProgressBenchResult& r, const ProgressBenchOptions& progress) {
  std::printf(
      "# mesh-bench progress: null all_reduce + Wait, one rank, %lld calls per path, load "
      "average %.2f\n",
      static_cast<long long>(progress.calls), r.load_average);
  std::printf("| %-40s | %12s | %12s | %8s |\n", "measure", "tracked", "bare group", "ratio");
  std::printf("%s\n", Rule({40, 12, 12, 8}).c_str());
  std::printf("| %-40s | %12.1f | %12.1f | %8.2f |\n", "ns per collective", r.tracked_ns,
              r.baseline_ns, r.ratio);
  std::printf("# added by progress tracking: %.1f ns per collective (target: <= 200)\n",
              r.added_ns);
}

void PrintMetrics(const MetricsBenchResult& r) {
  std::printf("# mesh-bench metrics: in-process coordinator after %d jobs, load average %.2f\n",
              r.jobs, r.load_average);
  std::printf("| %-40s | %12s | %12s | %8s |\n", "measure", "Mesh", "baseline", "ratio");
  std::printf("%s\n", Rule({40, 12, 12, 8}).c_str());
  std::printf("| %-40s | %12.1f | %12.1f | %8.2f |\n", "GET /metrics p50 (us)", r.scrape.p50_us,
              r.baseline_scrape.p50_us, r.scrape_p50_ratio);
  std::printf("| %-40s | %12.1f | %12.1f | %8.2f |\n", "GET /metrics p99 (us)", r.scrape.p99_us,
              r.baseline_scrape.p99_us, r.scrape.p99_us / r.baseline_scrape.p99_us);
  std::printf("| %-40s | %12lld | %12lld | %8.2f |\n", "body bytes (baseline: after 1 job)",
              static_cast<long long>(r.scrape_bytes), static_cast<long long>(r.one_job_bytes),
              static_cast<double>(r.scrape_bytes) /
                  static_cast<double>(std::max<int64_t>(1, r.one_job_bytes)));
  std::printf("| %-40s | %12.2f | %12.2f | %8.2f |\n", "Counter::Increment (ns; atomic add)",
              r.increment_ns, r.baseline_increment_ns, r.increment_ratio);
  std::printf(
      "# %d metric families; %lld bytes before any job; the baseline exposer's body is %lld "
      "bytes\n",
      r.families, static_cast<long long>(r.empty_coordinator_bytes),
      static_cast<long long>(r.baseline_bytes));
}

}  // namespace mesh::bench
