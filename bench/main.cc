// mesh-bench: Mesh's benchmark driver. Each subcommand prints a table of
// Mesh's figure, the baseline's figure and their ratio; --json writes the
// same as JSON. --smoke shrinks every size so tests can keep the harness from
// rotting without timing anything; `mesh-bench --smoke` alone runs every
// suite that way. scripts/bench.sh (`make bench`) runs the suites against
// their peers (bench/peers/) and bench/report.py merges one table. This
// file is the CLI (flags, running a suite, its JSON); the tables it prints
// are in tables.cc.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/synchronization/mutex.h"
#include "bench/collectives_bench.h"
#include "bench/dtensor_pack_bench.h"
#include "bench/launch_bench.h"
#include "bench/metrics_bench.h"
#include "bench/nccl_overhead_bench.h"
#include "bench/ping_bench.h"
#include "bench/progress_bench.h"
#include "bench/redistribute_bench.h"
#include "bench/rendezvous_bench.h"
#include "bench/store_bench.h"
#include "bench/tables.h"
#include "bench/waiters_bench.h"
#include "common/logging.h"
#include "common/subprocess.h"

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

// `mesh-bench --smoke` with no subcommand: every suite at smoke sizes, each
// in a child process of this binary (the suites start servers and workers
// of their own), with JSON into `json_dir` when given. Returns the number of
// suites that failed, as the exit status.
int RunAllSmoke(const std::string& json_dir) {
  const std::vector<std::vector<std::string>> suites = {
      {"ping"},         {"rendezvous"},
      {"waiters"},      {"collectives", "-c"},
      {"redistribute"}, {"launch", "--no-torchrun"},
      {"metrics"},      {"progress"},
      {"store"},        {"nccl-overhead"},
      {"dtensor-pack"}};
  int failed = 0;
  for (const auto& suite : suites) {
    std::vector<std::string> args = {"/proc/self/exe", suite[0], "--smoke"};
    args.insert(args.end(), suite.begin() + 1, suite.end());
    if (!json_dir.empty()) {
      args.push_back("--json");
      args.push_back(json_dir + "/" + suite[0] + ".json");
    }
    std::printf("## mesh-bench %s --smoke\n", suite[0].c_str());
    std::fflush(stdout);
    mesh::SpawnOptions spawn;
    spawn.argv = std::move(args);
    absl::StatusOr<mesh::Subprocess> process = mesh::Subprocess::Spawn(spawn);
    absl::StatusOr<mesh::ExitStatus> exit = process.ok() ? process->Wait() : process.status();
    if (!exit.ok() || !exit->success()) {
      std::fprintf(stderr, "mesh-bench --smoke: suite %s failed (%s)\n", suite[0].c_str(),
                   exit.ok() ? exit->ToString().c_str() : exit.status().ToString().c_str());
      ++failed;
    }
  }
  std::printf("# mesh-bench --smoke: %zu suites, %d failed\n", suites.size(), failed);
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mesh-bench: Mesh performance harness", "mesh-bench"};
  // None only with --smoke (every suite at smoke sizes); checked below.
  app.require_subcommand(0, 1);
  // --smoke and --json may also follow the subcommand; subcommands inherit
  // this when they are added, so it comes first.
  app.fallthrough();
  bool smoke = false;
  std::string json_path;
  app.add_flag("--smoke", smoke,
               "Tiny sizes: checks the harness, measures nothing; alone (no suite named): runs "
               "every suite");
  app.add_option("--json", json_path, "Also write results as JSON to this file");
  std::string json_dir;
  app.add_option("--json-dir", json_dir,
                 "With --smoke and no subcommand: write each suite's JSON into this folder");
  bool deadlock_detection = false;
  app.add_flag("--absl-deadlock-detection", deadlock_detection,
               "Keep Abseil's debug mutex deadlock detection on (see docs/performance.md)");

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

  // ---- nccl-overhead ----
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
  std::string nccl_stream = "group";
  nccl_cmd
      ->add_option("--stream", nccl_stream,
                   "Where libmesh runs its ops: group (its own stream, ordered by events) or "
                   "current (the caller's stream)")
      ->check(CLI::IsMember({"group", "current"}))
      ->capture_default_str();
  nccl_cmd->add_option("--block", nccl.block, "Calls per pipelined block")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  nccl_cmd->add_option("--device", nccl.device, "CUDA device ordinal")
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
  coll_cmd->add_flag("!--no-batch-device-thread", coll.batch_device_thread,
                     "Leave gloo's device thread under SCHED_OTHER "
                     "(GlooOptions::batch_device_thread off), to compare");
  coll_cmd->add_option("--hostname", coll.hostname, "Address the Gloo sockets bind to")
      ->capture_default_str();
  coll_cmd->add_option("--timeout", coll_timeout_s, "Gloo op and rendezvous timeout, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  // Worker mode: the parent re-executes this binary with these.
  coll_cmd->add_option("--worker-rank", worker_rank)->group("");
  coll_cmd->add_option("--coordinator", worker_coordinator)->group("");
  coll_cmd->add_option("--job", worker_job)->group("");

  // ---- redistribute: mesh::Redistribute vs the raw collectives ----
  mesh::bench::RedistributeBenchOptions redist;
  int redist_timeout_s = 120;
  int redist_worker_rank = -1;
  std::string redist_coordinator, redist_job;
  CLI::App* redist_cmd = app.add_subcommand(
      "redistribute",
      "DTensor Redistribute vs the raw Gloo collectives of its plan (S(0)->R, P->R, P->S(0), "
      "S(0)->S(1), [S(0),S(1)]->[R,R]) over local processes");
  redist_cmd->fallthrough();  // --json and --smoke may follow the subcommand.
  redist_cmd->add_option("--sizes", redist.sizes, "Global tensor sizes, e.g. 16M,64M")
      ->delimiter(',')
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  redist_cmd->add_option("--nproc", redist.nprocs, "World sizes, one job each, e.g. 2,4")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  redist_cmd
      ->add_option("--cases", redist.cases,
                   "Comma-separated: s0_r, p_r, p_s0, s0_s1, s0s1_rr (2-D, even worlds >= 4)")
      ->delimiter(',')
      ->capture_default_str();
  redist_cmd->add_option("-n,--iters", redist.iterations, "Measured rounds per row")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  redist_cmd->add_option("-w,--warmup_iters", redist.warmup, "Untimed rounds per row")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  redist_cmd->add_flag("--shm", redist.shared_memory,
                       "Run through the shared-memory path (GlooOptions::shared_memory)");
  redist_cmd->add_option("--hostname", redist.hostname, "Address the Gloo sockets bind to")
      ->capture_default_str();
  redist_cmd->add_option("--timeout", redist_timeout_s, "Gloo op and rendezvous timeout, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  // Worker mode: the parent re-executes this binary with these.
  redist_cmd->add_option("--worker-rank", redist_worker_rank)->group("");
  redist_cmd->add_option("--coordinator", redist_coordinator)->group("");
  redist_cmd->add_option("--job", redist_job)->group("");

  mesh::bench::RendezvousBenchOptions rendezvous;
  double round_timeout_s = absl::ToDoubleSeconds(rendezvous.round_timeout);
  CLI::App* rendezvous_cmd = app.add_subcommand(
      "rendezvous",
      "N async ranks: Join + Barrier + unique-ID wait vs 3 x grpc.health Check per rank");
  rendezvous_cmd->add_option("-n,--ranks", rendezvous.ranks, "Simulated ranks (world size)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  rendezvous_cmd->add_option("-c,--channels", rendezvous.channels, "TCP connections to share")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  rendezvous_cmd->add_option("--coordinator", rendezvous.coordinator,
                             "host:port to measure; default: an in-process coordinator");
  rendezvous_cmd->add_option("-r,--repeat", rendezvous.repeat, "Measured rounds of each")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  rendezvous_cmd->add_option("-w,--warmup", rendezvous.warmup, "Unmeasured rounds first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  rendezvous_cmd->add_option("--timeout", round_timeout_s, "Timeout of a round, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  rendezvous_cmd->add_flag("--grpc-deadlines", rendezvous.grpc_deadlines,
                           "Also give every call a gRPC deadline (a timer per call)");
  rendezvous_cmd->add_flag("--connection-per-rank", rendezvous.connection_per_rank,
                           "Each rank its own connection, as in a real job (overrides "
                           "--channels)");
  rendezvous_cmd->add_flag("--via-agent", rendezvous.via_agent,
                           "Through agents' rank relays: simulated agents of --ranks-per-node "
                           "ranks, one connection each, making the relay's node calls");
  rendezvous_cmd
      ->add_option("--ranks-per-node", rendezvous.ranks_per_node,
                   "Ranks per simulated agent, with --via-agent")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  rendezvous_cmd->add_option("--tls-ca", rendezvous.tls.ca_file,
                             "TLS on every connection: the PEM CA that verifies the coordinator");
  rendezvous_cmd->add_option("--tls-cert", rendezvous.tls.cert_file,
                             "The in-process coordinator's PEM certificate chain, with --tls-ca");
  rendezvous_cmd->add_option("--tls-key", rendezvous.tls.key_file,
                             "The in-process coordinator's PEM private key, with --tls-ca");
  rendezvous_cmd->add_option("--tls-server-name", rendezvous.tls.server_name,
                             "Name to check against the coordinator's certificate (default: "
                             "the target's host)");

  mesh::bench::WaitersBenchOptions waiters;
  std::string kind = "all";
  double waiters_timeout_s = absl::ToDoubleSeconds(waiters.timeout);
  CLI::App* waiters_cmd = app.add_subcommand(
      "waiters", "N ranks blocked at once in Join / Barrier / KvGet: threads, RSS, release time");
  waiters_cmd->add_option("-n,--ranks", waiters.ranks, "Ranks held waiting at once")
      ->check(CLI::Range(1, (1 << 20) - 1))
      ->capture_default_str();
  waiters_cmd->add_option("-k,--kind", kind, "join, barrier, get or all")
      ->check(CLI::IsMember({"join", "barrier", "get", "all"}))
      ->capture_default_str();
  waiters_cmd->add_option("-c,--channels", waiters.channels, "TCP connections to share")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  waiters_cmd
      ->add_option("--timeout", waiters_timeout_s,
                   "Bound on holding and on releasing, seconds each")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  mesh::bench::LaunchBenchOptions launch;
  double launch_timeout_s = absl::ToDoubleSeconds(launch.round_timeout);
  CLI::App* launch_cmd = app.add_subcommand(
      "launch",
      "SubmitJob reply -> all N ranks joined, with a real coordinator and agent, vs torchrun "
      "starting N Python workers that join a gloo group");
  launch_cmd->add_option("--nproc", launch.nproc, "Ranks per job, all on the one local agent")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  launch_cmd->add_option("-r,--rounds", launch.rounds, "Measured rounds per side")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  launch_cmd->add_option("-w,--warmup", launch.warmup, "Unmeasured rounds per side first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  launch_cmd->add_option("--coordinator-bin", launch.coordinator_bin,
                         "mesh-coordinator; default: next to mesh-bench, the build tree, PATH");
  launch_cmd->add_option("--agent-bin", launch.agent_bin,
                         "mesh-agent; default: next to mesh-bench, the build tree, PATH");
  launch_cmd->add_option("--worker-bin", launch.worker_bin,
                         "The Mesh worker; default: mesh-bench-launch-worker next to mesh-bench");
  launch_cmd->add_option("--torch-worker", launch.torch_worker,
                         "The torchrun worker script; default: launch_worker.py next to "
                         "mesh-bench");
  launch_cmd->add_flag("--no-torchrun", launch.no_torchrun, "Skip the torchrun half");
  launch_cmd->add_option("--timeout", launch_timeout_s, "Bound on one round, seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  mesh::bench::MetricsBenchOptions metrics;
  CLI::App* metrics_cmd = app.add_subcommand(
      "metrics",
      "GET /metrics after N jobs of history vs an exposer with one gauge; Counter::Increment "
      "vs a raw atomic add");
  metrics_cmd->add_option("--jobs", metrics.jobs, "Jobs of history before scraping")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  metrics_cmd->add_option("-n,--scrapes", metrics.scrapes, "Measured scrapes of each server")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  metrics_cmd->add_option("-w,--warmup", metrics.warmup, "Unmeasured scrapes of each first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  metrics_cmd->add_option("--increments", metrics.increments, "Measured increments of each kind")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  mesh::bench::StoreBenchOptions store;
  CLI::App* store_cmd = app.add_subcommand(
      "store",
      "The job store on SQLite and on a 3-member etcd (started here): submit acknowledgement "
      "latency, throughput, and leader takeover after a replica goes silent");
  store_cmd->add_option("--creates", store.creates, "Sequential CreateJobs per backend")
      ->check(CLI::PositiveNumber);
  store_cmd->add_option("--threads", store.threads, "Threads of the concurrent run")
      ->check(CLI::PositiveNumber);
  store_cmd
      ->add_option("--concurrent-creates", store.concurrent_creates,
                   "CreateJobs of the concurrent run, per backend")
      ->check(CLI::PositiveNumber);
  store_cmd->add_option("--takeovers", store.takeovers, "Leader takeovers measured")
      ->check(CLI::PositiveNumber);
  store_cmd->add_option("--lease", store.lease_s, "Leader lease, seconds")
      ->check(CLI::Range(1.0, 60.0));
  store_cmd->add_option("--etcd", store.etcd_endpoints,
                        "An etcd cluster to use (host:port,...); default: start 3 members");
  store_cmd->add_option("--etcd-binary", store.etcd_binary, "etcd to start");

  mesh::bench::ProgressBenchOptions progress;
  CLI::App* progress_cmd = app.add_subcommand(
      "progress",
      "Collective progress tracking (hang diagnosis): a null all_reduce through the Runtime's "
      "ProgressProcessGroup vs the bare group, ns per call");
  progress_cmd->add_option("--calls", progress.calls, "Measured calls of each path")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  progress_cmd->add_option("--batches", progress.batches, "Alternating batches")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  mesh::bench::DTensorPackOptions pack;
  CLI::App* pack_cmd = app.add_subcommand(
      "dtensor-pack",
      "DTensor local pack/unpack of a Shard(1) block on a CUDA device vs the device's copy "
      "bandwidth (GPU)");
  pack_cmd->add_option("--sizes", pack.sizes, "Block sizes, e.g. 1M,16M,64M")
      ->delimiter(',')
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  pack_cmd->add_option("--width", pack.width, "float32 elements per row of the block")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  pack_cmd->add_option("-n,--iterations", pack.iterations, "Measured calls per size and kind")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  pack_cmd->add_option("-w,--warmup", pack.warmup, "Warm-up calls per size and kind")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  pack_cmd->add_option("--device", pack.device, "CUDA device ordinal")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();

  mesh::bench::BenchTls serve_tls;
  CLI::App* serve_cmd = app.add_subcommand(
      "serve",
      "Serve a coordinator set up like rendezvous's in-process one (default timeouts) for "
      "--coordinator runs from another process; prints its address, stops on SIGINT/SIGTERM");
  serve_cmd->add_option("--tls-cert", serve_tls.cert_file, "Serve TLS: PEM certificate chain");
  serve_cmd->add_option("--tls-key", serve_tls.key_file, "Serve TLS: PEM private key");

  CLI11_PARSE(app, argc, argv);
  // Logs (an in-process coordinator's included) go to stderr: stdout is the
  // report, and `serve`'s first line is its address.
  mesh::LogOptions log_options;
  log_options.component = "mesh-bench";
  mesh::InitLogging(log_options);

  if (app.get_subcommands().empty()) {
    if (!smoke) {
      std::fprintf(stderr,
                   "mesh-bench: name a suite (see --help), or --smoke alone to run every suite "
                   "at smoke sizes\n");
      return 2;
    }
    return RunAllSmoke(json_dir) == 0 ? 0 : 1;
  }

  if (pack_cmd->parsed()) {
    if (smoke) {
      pack.sizes = {64 * 1024};
      pack.width = 256;
      pack.iterations = 3;
      pack.warmup = 1;
    }
    auto result = mesh::bench::RunDTensorPackBench(pack);
    if (!result.ok()) {
      std::fprintf(stderr, "mesh-bench dtensor-pack: %s\n", result.status().ToString().c_str());
      return 1;
    }
    if (result->skipped) {
      std::printf("skipped: %s\n", result->skip_reason.c_str());
      return Finish(mesh::bench::ToJson(*result), json_path);
    }
    mesh::bench::PrintDTensorPack(*result, pack);
    return Finish(mesh::bench::ToJson(*result), json_path);
  }

  if (store_cmd->parsed()) {
    if (smoke) {
      store.creates = 20;
      store.concurrent_creates = 40;
      store.takeovers = 1;
    }
    auto result = mesh::bench::RunStoreBench(store);
    if (!result.ok()) {
      if (absl::IsFailedPrecondition(result.status())) {
        const std::string why(result.status().message());
        std::printf("# mesh-bench store: skipped: %s\n", why.c_str());
        return Finish({{"suite", "store"}, {"skipped", why}}, json_path);
      }
      std::fprintf(stderr, "mesh-bench store: %s\n", result.status().ToString().c_str());
      return 1;
    }
    const auto& r = *result;
    mesh::bench::PrintStore(r, store);
    return Finish(mesh::bench::ToJson(r), json_path);
  }

  if (progress_cmd->parsed()) {
    if (smoke) {
      progress.calls = 20000;
      progress.batches = 4;
    }
    auto result = mesh::bench::RunProgressBench(progress);
    if (!result.ok()) {
      std::fprintf(stderr, "mesh-bench progress: %s\n", result.status().ToString().c_str());
      return 1;
    }
    const auto& r = *result;
    mesh::bench::PrintProgress(r, progress);
    return Finish(mesh::bench::ToJson(r), json_path);
  }

  if (metrics_cmd->parsed()) {
    if (smoke) {
      metrics.jobs = 5;
      metrics.scrapes = 3;
      metrics.warmup = 1;
      metrics.increments = 10000;
    }
    auto result = mesh::bench::RunMetricsBench(metrics);
    if (!result.ok()) {
      std::fprintf(stderr, "mesh-bench metrics: %s\n", result.status().ToString().c_str());
      return 1;
    }
    const auto& r = *result;
    mesh::bench::PrintMetrics(r);
    return Finish(mesh::bench::ToJson(r), json_path);
  }

  if (nccl_cmd->parsed()) {
    if (smoke) {
      nccl.elements = {1, 1024};
      nccl.iterations = 20;
      nccl.warmup = 2;
      nccl.block = 5;
    }
    nccl.stream_mode = nccl_stream == "current" ? mesh::NcclStreamMode::kCurrentStream
                                                : mesh::NcclStreamMode::kGroupStream;
    auto result = mesh::bench::RunNcclOverheadBench(nccl);
    if (!result.ok()) {
      std::fprintf(stderr, "mesh-bench nccl-overhead: %s\n", result.status().ToString().c_str());
      return 1;
    }
    if (result->skipped) {
      std::printf("skipped: %s\n", result->skip_reason.c_str());
      return Finish(mesh::bench::ToJson(*result), json_path);
    }
    mesh::bench::PrintNcclOverhead(*result, nccl, nccl_stream);
    return Finish(mesh::bench::ToJson(*result), json_path);
  }

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

  if (redist_cmd->parsed()) {
    redist.timeout = absl::Seconds(redist_timeout_s);
    if (redist_worker_rank >= 0) {
      // A worker runs one world size: the parent's --nproc N.
      const int nproc = redist.nprocs.empty() ? 0 : redist.nprocs.front();
      const absl::Status s = mesh::bench::RunRedistributeWorker(
          redist, nproc, redist_worker_rank, redist_coordinator, redist_job,
          [](const mesh::bench::RedistributeRow& row) {
            mesh::bench::EmitRow(mesh::bench::ToJson(row));
          });
      if (!s.ok()) {
        std::fprintf(stderr, "mesh-bench redistribute worker rank %d: %s\n", redist_worker_rank,
                     s.ToString().c_str());
        return 1;
      }
      return 0;
    }
    if (smoke) {
      redist.sizes = {4096, 16384};
      redist.iterations = 2;
      redist.warmup = 1;
    }
    std::printf("%s", mesh::bench::RedistributeHeader(redist).c_str());
    std::fflush(stdout);
    auto result =
        mesh::bench::RunRedistributeBench(redist, [](const mesh::bench::RedistributeRow& row) {
          std::printf("%s\n", mesh::bench::FormatRow(row).c_str());
          std::fflush(stdout);
        });
    if (!result.ok()) {
      std::fprintf(stderr, "mesh-bench redistribute: %s\n", result.status().ToString().c_str());
      return 1;
    }
    int64_t wrong = 0;
    int over = 0;
    for (const auto& row : result->rows) {
      wrong += row.wrong;
      if (row.ratio > 1.1) ++over;
    }
    std::printf("# goal: ratio <= 1.1; %d of %zu rows above it; wrong elements: %lld %s\n", over,
                result->rows.size(), static_cast<long long>(wrong), wrong == 0 ? "OK" : "FAILED");
    const int rc = Finish(mesh::bench::ToJson(redist, *result), json_path);
    return rc != 0 ? rc : (wrong == 0 ? 0 : 1);
  }

  if (launch_cmd->parsed()) {
    launch.round_timeout = absl::Seconds(launch_timeout_s);
    if (smoke) {
      launch.nproc = 2;
      launch.rounds = 1;
      launch.warmup = 0;
    }
    auto result = mesh::bench::RunLaunchBench(launch);
    if (!result.ok()) {
      std::fprintf(stderr, "mesh-bench launch: %s\n", result.status().ToString().c_str());
      return 1;
    }
    std::printf("%s", mesh::bench::FormatLaunchReport(*result, launch.warmup).c_str());
    return Finish(mesh::bench::ToJson(*result), json_path);
  }

  // Debian builds Abseil without NDEBUG, which turns on Mutex deadlock
  // detection: a process-wide lock-order graph updated on every Mutex
  // creation, lock and destruction, gRPC's included. It is a debugging aid
  // that costs ~10% of a rendezvous here; measure without it unless asked.
  if (!deadlock_detection) absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  if (serve_cmd->parsed()) {
    // Before any thread exists, so that gRPC's threads inherit the mask and
    // the signals reach only the sigwait below.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    if (serve_tls.cert_file.empty() != serve_tls.key_file.empty()) {
      std::fprintf(stderr, "mesh-bench serve: --tls-cert and --tls-key go together\n");
      return 2;
    }
    auto server = mesh::bench::StartBenchCoordinator(/*ranks_heartbeat=*/true, serve_tls);
    if (!server.ok()) {
      std::fprintf(stderr, "mesh-bench serve: %s\n", server.status().ToString().c_str());
      return 1;
    }
    std::printf("mesh-bench serve listening on %s\n", (*server)->address().c_str());
    std::fflush(stdout);
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    (*server)->Shutdown(absl::ZeroDuration());
    return 0;
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
    mesh::bench::PrintPing(*result);
    return Finish(mesh::bench::ToJson(*result), json_path);
  }

  if (rendezvous_cmd->parsed()) {
    rendezvous.round_timeout = absl::Seconds(round_timeout_s);
    if (smoke) {
      rendezvous.ranks = std::min(rendezvous.ranks, 64);
      rendezvous.repeat = 1;
      rendezvous.warmup = 0;
    }
    auto result = mesh::bench::RunRendezvousBench(rendezvous);
    if (!result.ok()) {
      std::fprintf(stderr, "mesh-bench rendezvous: %s\n", result.status().ToString().c_str());
      return 1;
    }
    mesh::bench::PrintRendezvous(*result, rendezvous.warmup);
    return Finish(mesh::bench::ToJson(*result), json_path);
  }

  if (waiters_cmd->parsed()) {
    waiters.timeout = absl::Seconds(waiters_timeout_s);
    if (kind != "all") waiters.kinds = {*mesh::bench::ParseWaitKind(kind)};
    if (smoke) waiters.ranks = std::min(waiters.ranks, 200);
    auto result = mesh::bench::RunWaitersBench(waiters);
    if (!result.ok()) {
      std::fprintf(stderr, "mesh-bench waiters: %s\n", result.status().ToString().c_str());
      return 1;
    }
    mesh::bench::PrintWaiters(*result);
    return Finish(mesh::bench::ToJson(*result), json_path);
  }
  return 2;
}
