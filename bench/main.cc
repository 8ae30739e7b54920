// mesh-bench: Mesh's benchmark driver. Each subcommand prints a table of
// Mesh's figure, the baseline's figure and their ratio; --json writes the
// same as JSON. --smoke shrinks every size so tests can keep the harness from
// rotting without timing anything.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "bench/nccl_overhead_bench.h"
#include "bench/ping_bench.h"

namespace {

int Finish(const nlohmann::json& json, const std::string& json_path) {
  if (!json_path.empty()) {
    std::ofstream file(json_path);
    file << json.dump(2) << "\n";
    if (!file) {
      std::fprintf(stderr, "mesh-bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mesh-bench: Mesh performance harness", "mesh-bench"};
  app.require_subcommand(1);
  bool smoke = false;
  std::string json_path;
  app.add_flag("--smoke", smoke, "Tiny sizes: checks the harness, measures nothing");
  app.add_option("--json", json_path, "Also write results as JSON to this file");

  mesh::bench::PingBenchOptions ping;
  CLI::App* ping_cmd = app.add_subcommand(
      "ping", "Coordinator unary-call latency vs gRPC's health Check (the floor)");
  ping_cmd->add_option("--coordinator", ping.coordinator,
                       "host:port to measure; default: an in-process coordinator");
  ping_cmd->add_option("-n,--iterations", ping.iterations, "Measured calls per method")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  ping_cmd->add_option("-w,--warmup", ping.warmup, "Warm-up calls per method")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();

  // ---- nccl-overhead (branch nccl) ----
  mesh::bench::NcclOverheadOptions nccl;
  CLI::App* nccl_cmd = app.add_subcommand(
      "nccl-overhead", "libmesh all_reduce per-call overhead vs raw ncclAllReduce (GPU)");
  nccl_cmd->add_option("--elements", nccl.elements, "float32 element counts, one row each")
      ->capture_default_str();
  nccl_cmd->add_option("-n,--iterations", nccl.iterations, "Measured calls per size and side")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  nccl_cmd->add_option("-w,--warmup", nccl.warmup, "Warm-up calls per size and side")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  nccl_cmd->add_option("--block", nccl.block, "Calls per pipelined block")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  nccl_cmd->add_option("--device", nccl.device, "CUDA device ordinal")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();

  CLI11_PARSE(app, argc, argv);

  if (nccl_cmd->parsed()) {
    if (smoke) {
      nccl.elements = {1, 1024};
      nccl.iterations = 20;
      nccl.warmup = 2;
      nccl.block = 5;
    }
    auto result = mesh::bench::RunNcclOverheadBench(nccl);
    if (!result.ok()) {
      std::fprintf(stderr, "mesh-bench nccl-overhead: %s\n", result.status().ToString().c_str());
      return 1;
    }
    if (result->skipped) {
      std::printf("skipped: %s\n", result->skip_reason.c_str());
      return Finish(mesh::bench::ToJson(*result), json_path);
    }
    std::printf(
        "# mesh-bench nccl-overhead: all_reduce (sum, float32), world size 1, cuda:%d (%s), NCCL "
        "%d; p50 per call\n",
        nccl.device, result->device_name.c_str(), result->nccl_version);
    std::printf("| %10s | %14s | %14s | %7s | %14s | %14s | %7s |\n", "bytes", "raw pipe (us)",
                "mesh pipe (us)", "ratio", "raw sync (us)", "mesh sync (us)", "ratio");
    std::printf("|%s|%s|%s|%s|%s|%s|%s|\n", std::string(12, '-').c_str(),
                std::string(16, '-').c_str(), std::string(16, '-').c_str(),
                std::string(9, '-').c_str(), std::string(16, '-').c_str(),
                std::string(16, '-').c_str(), std::string(9, '-').c_str());
    for (const auto& row : result->rows) {
      std::printf("| %10lld | %14.2f | %14.2f | %7.2f | %14.2f | %14.2f | %7.2f |\n",
                  static_cast<long long>(row.bytes), row.raw_pipelined.p50_us,
                  row.mesh_pipelined.p50_us, row.pipelined_ratio, row.raw_sync.p50_us,
                  row.mesh_sync.p50_us, row.sync_ratio);
    }
    return Finish(mesh::bench::ToJson(*result), json_path);
  }

  if (ping_cmd->parsed()) {
    if (smoke) {
      ping.iterations = 20;
      ping.warmup = 2;
      ping.block = 5;
    }
    auto result = mesh::bench::RunPingBench(ping);
    if (!result.ok()) {
      std::fprintf(stderr, "mesh-bench ping: %s\n", result.status().ToString().c_str());
      return 1;
    }
    std::printf("# mesh-bench ping: %d calls per method against %s\n",
                result->get_server_info.count, result->coordinator.c_str());
    std::printf("| %-28s | %10s | %10s |\n", "call", "p50 (us)", "p99 (us)");
    std::printf("|%s|%s|%s|\n", std::string(30, '-').c_str(), std::string(12, '-').c_str(),
                std::string(12, '-').c_str());
    std::printf("| %-28s | %10.1f | %10.1f |\n", "AdminService.GetServerInfo",
                result->get_server_info.p50_us, result->get_server_info.p99_us);
    std::printf("| %-28s | %10.1f | %10.1f |\n", "baseline: grpc.health Check",
                result->health_check.p50_us, result->health_check.p99_us);
    std::printf("| %-28s | %10.2f | %10.2f |\n", "ratio (Mesh / baseline)", result->p50_ratio,
                result->p99_ratio);
    return Finish(mesh::bench::ToJson(*result), json_path);
  }
  return 2;
}
