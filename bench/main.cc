// mesh-bench: Mesh's benchmark driver. Each subcommand prints a table of
// Mesh's figure, the baseline's figure and their ratio; --json writes the
// same as JSON. --smoke shrinks every size so tests can keep the harness from
// rotting without timing anything.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "bench/collectives_bench.h"
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

  mesh::bench::CollectivesBenchOptions coll;
  std::string coll_dtype = "float32";
  std::string coll_algorithm = "auto";
  int coll_timeout_s = 120;
  int worker_rank = -1;
  std::string worker_coordinator, worker_job;
  CLI::App* coll_cmd = app.add_subcommand(
      "collectives",
      "Gloo collectives' time, algbw and busbw per size, nccl-tests style, over --nproc local "
      "processes");
  coll_cmd->fallthrough();  // --json and --smoke may follow the subcommand.
  coll_cmd->add_option("-b,--minbytes", coll.min_bytes, "Smallest size, e.g. 64K")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  coll_cmd->add_option("-e,--maxbytes", coll.max_bytes, "Largest size, e.g. 64M")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  coll_cmd->add_option("-f,--stepfactor", coll.factor, "Size multiplier between rows")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  coll_cmd->add_option("-n,--iters", coll.iterations, "Timed iterations per size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  coll_cmd->add_option("-w,--warmup_iters", coll.warmup, "Untimed iterations per size")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  coll_cmd->add_flag("-c,--check", coll.check, "Verify every result against deterministic data");
  coll_cmd->add_option("--nproc", coll.nproc, "Local processes (ranks)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  coll_cmd->add_option("--ops", coll.ops, "Comma-separated collectives")
      ->delimiter(',')
      ->capture_default_str();
  coll_cmd->add_option("--dtype", coll_dtype, "Element type")->capture_default_str();
  coll_cmd->add_option("--algorithm", coll_algorithm, "all_reduce algorithm: auto, ring, bcube")
      ->check(CLI::IsMember({"auto", "ring", "bcube"}))
      ->capture_default_str();
  coll_cmd->add_flag("--shm", coll.shared_memory,
                     "Run through the shared-memory path (GlooOptions::shared_memory)");
  coll_cmd->add_option("--hostname", coll.hostname, "Address the Gloo sockets bind to")
      ->capture_default_str();
  coll_cmd->add_option("--timeout", coll_timeout_s, "Gloo op and rendezvous timeout, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  // Worker mode: the parent re-executes this binary with these.
  coll_cmd->add_option("--worker-rank", worker_rank)->group("");
  coll_cmd->add_option("--coordinator", worker_coordinator)->group("");
  coll_cmd->add_option("--job", worker_job)->group("");

  CLI11_PARSE(app, argc, argv);

  if (coll_cmd->parsed()) {
    auto dtype = mesh::ParseDType(coll_dtype);
    if (!dtype.ok()) {
      std::fprintf(stderr, "mesh-bench collectives: %s\n", dtype.status().ToString().c_str());
      return 2;
    }
    coll.dtype = *dtype;
    coll.allreduce_algorithm = coll_algorithm == "ring"    ? mesh::GlooAllreduceAlgorithm::kRing
                               : coll_algorithm == "bcube" ? mesh::GlooAllreduceAlgorithm::kBcube
                                                           : mesh::GlooAllreduceAlgorithm::kAuto;
    coll.timeout = absl::Seconds(coll_timeout_s);
    if (worker_rank >= 0) {
      const absl::Status s = mesh::bench::RunCollectivesWorker(
          coll, worker_rank, worker_coordinator, worker_job,
          [](const mesh::bench::CollectivesRow& row) {
            std::printf("%s%s\n", mesh::bench::kRowPrefix, mesh::bench::ToJson(row).dump().c_str());
            std::fflush(stdout);
          });
      if (!s.ok()) {
        std::fprintf(stderr, "mesh-bench collectives worker rank %d: %s\n", worker_rank,
                     s.ToString().c_str());
        return 1;
      }
      return 0;
    }
    if (smoke) {
      coll.min_bytes = 1024;
      coll.max_bytes = 4096;
      coll.iterations = 2;
      coll.warmup = 1;
    }
    std::printf("%s", mesh::bench::CollectivesHeader(coll).c_str());
    std::fflush(stdout);
    const std::string dtype_name(mesh::DTypeName(coll.dtype));
    auto result =
        mesh::bench::RunCollectivesBench(coll, [&](const mesh::bench::CollectivesRow& row) {
          std::printf("%s\n", mesh::bench::FormatRow(row, dtype_name).c_str());
          std::fflush(stdout);
        });
    if (!result.ok()) {
      std::fprintf(stderr, "mesh-bench collectives: %s\n", result.status().ToString().c_str());
      return 1;
    }
    int64_t wrong = 0;
    for (const auto& row : result->rows) wrong += row.wrong > 0 ? row.wrong : 0;
    if (coll.check)
      std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(wrong),
                  wrong == 0 ? "OK" : "FAILED");
    const int rc = Finish(mesh::bench::ToJson(coll, *result), json_path);
    return rc != 0 ? rc : (wrong == 0 ? 0 : 1);
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
