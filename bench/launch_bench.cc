#include "bench/launch_bench.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/rendezvous_bench.h"
#include "cli/admin_client.h"
#include "cli/cluster.h"
#include "common/check.h"
#include "common/errno_text.h"
#include "common/grpc_status.h"
#include "common/subprocess.h"
#include "mesh/v1/job.grpc.pb.h"

namespace mesh::bench {
namespace {

namespace fs = std::filesystem;

// How often the cluster's ready file is looked for while it starts.
constexpr absl::Duration kStartPoll = absl::Milliseconds(20);
// Bound on one SubmitJob / GetJob call.
constexpr absl::Duration kRpcTimeout = absl::Seconds(10);
// SIGTERM -> SIGKILL for the cluster's children and for torchrun.
constexpr absl::Duration kGrace = absl::Seconds(5);
// `python3 -c "import torch"` can take seconds on a cold cache.
constexpr absl::Duration kTorchProbeTimeout = absl::Seconds(60);

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// ---- Temp dir ---------------------------------------------------------------

// A fresh directory under $TMPDIR, removed on destruction unless Keep() was
// called (after a failure its logs are the evidence).
class TempDir {
 public:
  static absl::StatusOr<std::unique_ptr<TempDir>> Make() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/mesh-bench-launch-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create a temp dir ", pattern, ": ", ErrnoText(errno)));
    }
    return std::unique_ptr<TempDir>(new TempDir(pattern));
  }
  ~TempDir() {
    if (keep_) return;
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  void Keep() { keep_ = true; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  const std::string path_;
  bool keep_ = false;
};

// ---- The local cluster ------------------------------------------------------

// A coordinator and one agent, run by cli::RunClusterUp on a thread of their
// own: RunClusterUp blocks until its stop fd is readable, and the children's
// PR_SET_PDEATHSIG is tied to the thread that forked them, which therefore
// lives exactly as long as the cluster. Thread safety: one owner thread.
class LocalCluster {
 public:
  ~LocalCluster() { Stop(); }

  // Starts the cluster and waits until its agent is READY (RunClusterUp
  // writes the ready file then). Possible errors: UNAVAILABLE with the tail
  // of its diagnostics when it does not come up within `timeout`.
  absl::Status Start(cli::ClusterConfig config, absl::Duration timeout) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe2: " + ErrnoText(errno));
    stop_read_ = fds[0];
    stop_write_ = fds[1];
    ready_file_ = config.ready_file;
    thread_ = std::thread([this, config = std::move(config)] {
      exit_code_ = cli::RunClusterUp(config, stop_read_, out_, err_);
      done_.store(true);
    });
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      std::ifstream in(ready_file_);
      std::string line;
      if (in && std::getline(in, line) && !line.empty()) {
        address_ = std::string(absl::StripAsciiWhitespace(line));
        return absl::OkStatus();
      }
      if (done_.load()) {
        Stop();
        return absl::UnavailableError(
            absl::StrCat("the local cluster did not come up (exit code ", exit_code_,
                         "): ", absl::StripTrailingAsciiWhitespace(err_.str())));
      }
      if (absl::Now() >= deadline) {
        Stop();
        return absl::UnavailableError(absl::StrCat("the local cluster was not ready within ",
                                                   absl::FormatDuration(timeout), ": ",
                                                   absl::StripTrailingAsciiWhitespace(err_.str())));
      }
      absl::SleepFor(kStartPoll);
    }
  }

  // Stops and reaps every child (RunClusterUp's own SIGTERM/grace/SIGKILL);
  // idempotent. Returns what RunClusterUp wrote to its error stream.
  std::string Stop() {
    if (thread_.joinable()) {
      const char byte = 1;
      [[maybe_unused]] ssize_t n = write(stop_write_, &byte, 1);
      thread_.join();
    }
    for (int* fd : {&stop_read_, &stop_write_}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
    return err_.str();
  }

  // "127.0.0.1:PORT" once started.
  const std::string& address() const { return address_; }
  // True when the cluster stopped by itself (a child died).
  bool died() const { return done_.load(); }

 private:
  std::thread thread_;
  int stop_read_ = -1;
  int stop_write_ = -1;
  std::string ready_file_;
  std::string address_;
  std::atomic<bool> done_{false};
  int exit_code_ = 0;       // Written by the thread, read after join.
  std::ostringstream out_;  // Likewise.
  std::ostringstream err_;
};

// ---- Child processes (torchrun and its probe) -------------------------------

// A process in its own process group (so that a timeout can kill torchrun's
// workers with it), with stdout and stderr to `log_path` ("" = /dev/null),
// dying with this thread (SIGTERM). Thread safety: one owner.
class Spawned {
 public:
  ~Spawned() { Kill(); }

  // Possible errors: those of Subprocess::Spawn.
  absl::Status Start(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                     const std::string& log_path) {
    MESH_CHECK(!argv.empty(), "empty argv");
    SpawnOptions options;
    options.argv = argv;
    options.env = env;
    options.stdin_to = Redirect::Null();
    options.stdout_to = log_path.empty() ? Redirect::Null() : Redirect::File(log_path);
    options.stderr_to = Redirect::Stdout();
    options.group = SpawnOptions::Group::kNewGroup;
    options.death_signal = SIGTERM;
    absl::StatusOr<Subprocess> process = Subprocess::Spawn(options);
    if (!process.ok()) return process.status();
    process_.emplace(*std::move(process));
    return absl::OkStatus();
  }

  // Waits until the process exits or `deadline`; how it ended, when it did.
  std::optional<ExitStatus> Wait(absl::Time deadline) {
    if (!process_.has_value()) return std::nullopt;
    absl::StatusOr<ExitStatus> exit = process_->Wait(deadline - absl::Now());
    if (!exit.ok()) return std::nullopt;
    // Workers that outlived their launcher would be a leak.
    process_->SignalGroup(SIGKILL).IgnoreError();
    process_.reset();
    return *exit;
  }

  // SIGTERM to the whole group, SIGKILL after the grace; reaps. Idempotent.
  void Kill() {
    if (!process_.has_value()) return;
    process_->Terminate(kGrace).IgnoreError();
    process_->SignalGroup(SIGKILL).IgnoreError();  // Any worker left in the group.
    process_.reset();
  }

 private:
  std::optional<Subprocess> process_;
};

// This process's environment with `overrides` ("NAME=value") replacing
// variables of the same name: getenv finds the first of two entries.
std::vector<std::string> CurrentEnvironment(const std::vector<std::string>& overrides) {
  auto name_of = [](absl::string_view entry) { return entry.substr(0, entry.find('=')); };
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const bool overridden = std::any_of(overrides.begin(), overrides.end(),
                                        [&](const auto& o) { return name_of(o) == name_of(*e); });
    if (!overridden) env.emplace_back(*e);
  }
  env.insert(env.end(), overrides.begin(), overrides.end());
  return env;
}

std::string LastLines(const std::string& path, int lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  const size_t first = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  return absl::StrJoin(all.begin() + first, all.end(), "\n");
}

// ---- Worker time files --------------------------------------------------------

struct RankTimes {
  int64_t main_ns = 0;
  int64_t joined_ns = 0;
};

// Reads dir/rank-0 .. rank-(n-1). Possible errors: INTERNAL naming the
// ranks with no file or a malformed one.
absl::StatusOr<std::vector<RankTimes>> ReadRankTimes(const std::string& dir, int n) {
  std::vector<RankTimes> times(n);
  std::vector<std::string> bad;
  for (int r = 0; r < n; ++r) {
    std::ifstream in(absl::StrCat(dir, "/rank-", r));
    std::string line;
    std::vector<std::string> parts;
    if (in && std::getline(in, line)) parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &times[r].main_ns) ||
        !absl::SimpleAtoi(parts[1], &times[r].joined_ns) || times[r].joined_ns < times[r].main_ns) {
      bad.push_back(absl::StrCat(r));
    }
  }
  if (!bad.empty()) {
    return absl::InternalError(absl::StrCat(bad.size(), "/", n,
                                            " ranks wrote no valid time file in ", dir,
                                            "; ranks: ", absl::StrJoin(bad, ", ")));
  }
  return times;
}

absl::Time FromNs(int64_t ns) { return absl::FromUnixNanos(ns); }

// ---- The Mesh half ------------------------------------------------------------

class MeshHalf {
 public:
  MeshHalf(const LaunchBenchOptions& options, std::string worker_bin, std::string dir)
      : options_(options), worker_bin_(std::move(worker_bin)), dir_(std::move(dir)) {}

  absl::Status Start(const std::string& coordinator_bin, const std::string& agent_bin) {
    cli::ClusterConfig config;
    config.coordinator_bin = coordinator_bin;
    config.agent_bin = agent_bin;
    config.agents = 1;
    config.slots = options_.nproc;
    config.agent_gpus = {"none"};
    config.job_user = cli::CurrentUserName();
    config.port = 0;
    config.state_dir = dir_ + "/cluster";
    config.ready_file = dir_ + "/cluster.ready";
    config.grace = kGrace;
    config.ready_timeout = options_.start_timeout;
    config.port_timeout = options_.start_timeout;
    config.poll_interval = absl::Milliseconds(20);
    std::error_code ec;
    fs::create_directories(config.state_dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", config.state_dir));
    if (absl::Status s = cluster_.Start(config, options_.start_timeout + absl::Seconds(5));
        !s.ok()) {
      return s;
    }
    stub_ = mesh::v1::JobService::NewStub(cli::MakeChannel(cluster_.address()));
    return absl::OkStatus();
  }

  const std::string& address() const { return cluster_.address(); }

  // One job from submission to SUCCEEDED.
  absl::StatusOr<MeshLaunchRound> Round(int index) {
    const std::string out_dir = absl::StrCat(dir_, "/mesh-", index);
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir));

    mesh::v1::SubmitJobRequest request;
    mesh::v1::JobSpec& spec = *request.mutable_spec();
    spec.set_name(absl::StrCat("launch-bench-", index));
    spec.add_command(worker_bin_);
    (*spec.mutable_env())["LAUNCH_BENCH_OUT"] = out_dir;
    spec.mutable_nodes()->set_min(1);
    spec.set_nproc_per_node(options_.nproc);
    spec.set_max_restarts(0);
    spec.set_deadline_seconds(
        std::max<int64_t>(1, absl::ToInt64Seconds(options_.round_timeout) + 1));

    MeshLaunchRound round;
    mesh::v1::SubmitJobResponse submitted;
    const absl::Time sent = absl::Now();
    {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(sent + kRpcTimeout));
      const grpc::Status s = stub_->SubmitJob(&context, request, &submitted);
      if (!s.ok()) return Annotate(FromGrpcStatus(s), "SubmitJob");
    }
    const absl::Time t0 = absl::Now();
    round.submit_rpc_s = Seconds(t0 - sent);
    round.job_id = submitted.job().id();
    const absl::Time deadline = t0 + options_.round_timeout;

    mesh::v1::WaitJobResponse waited;
    {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(deadline + absl::Seconds(2)));
      mesh::v1::WaitJobRequest wait;
      wait.set_job_id(round.job_id);
      wait.set_timeout_seconds(Seconds(deadline - absl::Now()));
      const grpc::Status s = stub_->WaitJob(&context, wait, &waited);
      if (!s.ok()) {
        return Annotate(FromGrpcStatus(s), absl::StrCat("WaitJob(", round.job_id, ")"));
      }
    }
    round.succeeded_s = Seconds(absl::Now() - t0);
    mesh::v1::GetJobResponse got;
    {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
      mesh::v1::GetJobRequest get;
      get.set_job_id(round.job_id);
      const grpc::Status s = stub_->GetJob(&context, get, &got);
      if (!s.ok()) return Annotate(FromGrpcStatus(s), absl::StrCat("GetJob(", round.job_id, ")"));
    }
    const mesh::v1::Job& job = got.job();
    if (job.state() != mesh::v1::JOB_STATE_SUCCEEDED) {
      return absl::InternalError(
          absl::StrCat("job ", round.job_id, " ended ", mesh::v1::JobState_Name(job.state()),
                       job.root_cause().message().empty() ? "" : ": " + job.root_cause().message(),
                       "; worker logs under ", dir_, "/cluster/agent-0"));
    }
    for (const mesh::v1::JobStateEvent& event : job.events()) {
      const double at = Seconds(absl::FromUnixMillis(event.time_unix_ms()) - t0);
      if (event.to() == mesh::v1::JOB_STATE_SCHEDULED && round.scheduled_s < 0) {
        round.scheduled_s = at;
      }
      if (event.to() == mesh::v1::JOB_STATE_RUNNING && round.running_s < 0) round.running_s = at;
    }
    auto times = ReadRankTimes(out_dir, options_.nproc);
    if (!times.ok()) {
      return Annotate(times.status(), absl::StrCat("job ", round.job_id, " SUCCEEDED but"));
    }
    int64_t first_main = times->front().main_ns, last_main = first_main, last_join = 0;
    for (const RankTimes& t : *times) {
      first_main = std::min(first_main, t.main_ns);
      last_main = std::max(last_main, t.main_ns);
      last_join = std::max(last_join, t.joined_ns);
    }
    round.launch_s = Seconds(FromNs(last_join) - t0);
    round.first_main_s = Seconds(FromNs(first_main) - t0);
    round.last_main_s = Seconds(FromNs(last_main) - t0);
    return round;
  }

  // Drops the client connection first: an open one makes the coordinator's
  // graceful shutdown wait out its whole grace.
  std::string Stop() {
    stub_.reset();
    return cluster_.Stop();
  }
  bool died() const { return cluster_.died(); }

 private:
  static absl::Status Annotate(const absl::Status& s, absl::string_view what) {
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }

  const LaunchBenchOptions& options_;
  const std::string worker_bin_;
  const std::string dir_;
  LocalCluster cluster_;
  std::unique_ptr<mesh::v1::JobService::Stub> stub_;
};

// ---- The torchrun half --------------------------------------------------------

absl::StatusOr<TorchLaunchRound> TorchRound(const LaunchBenchOptions& options,
                                            const std::string& script, const std::string& dir,
                                            int index) {
  const std::string out_dir = absl::StrCat(dir, "/torch-", index);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir));
  const std::string log = out_dir + ".log";
  // Output goes to files, as Mesh's agent does with its workers. Naming the
  // redirects also sidesteps a bug of Debian's torch 1.13 under Python 3.11:
  // the default "0" (no redirect) parses to None there (Std.NONE is not
  // iterable in 3.11's IntFlag) and torchrun crashes before starting workers.
  // --nproc_per_node: the spelling every torchrun version accepts.
  const std::vector<std::string> argv = {
      "torchrun",      "--standalone", absl::StrCat("--nproc_per_node=", options.nproc),
      "--redirects=1", "--tee=2",      absl::StrCat("--log_dir=", out_dir, "/torchrun"),
      script};
  // torchrun sets OMP_NUM_THREADS=1 itself for nproc > 1 (and prints a
  // warning saying so); setting it up front keeps nproc = 1 alike and the log
  // quiet.
  const std::vector<std::string> env =
      CurrentEnvironment({"LAUNCH_BENCH_OUT=" + out_dir, "OMP_NUM_THREADS=1"});

  Spawned torchrun;
  const absl::Time t0 = absl::Now();
  if (absl::Status s = torchrun.Start(argv, env, log); !s.ok()) return s;
  const std::optional<ExitStatus> exit = torchrun.Wait(t0 + options.round_timeout);
  if (!exit.has_value()) {
    torchrun.Kill();
    return absl::DeadlineExceededError(absl::StrCat(
        "torchrun round ", index, " did not finish within ",
        absl::FormatDuration(options.round_timeout), "; its log ", log, ":\n", LastLines(log, 15)));
  }
  TorchLaunchRound round;
  round.exited_s = Seconds(absl::Now() - t0);
  if (!exit->success()) {
    return absl::InternalError(absl::StrCat("torchrun round ", index, " ended with ",
                                            exit->ToString(), "; its log ", log, ":\n",
                                            LastLines(log, 15)));
  }
  auto times = ReadRankTimes(out_dir, options.nproc);
  if (!times.ok()) return times.status();
  int64_t first_main = times->front().main_ns, last_main = first_main, last_join = 0;
  for (const RankTimes& t : *times) {
    first_main = std::min(first_main, t.main_ns);
    last_main = std::max(last_main, t.main_ns);
    last_join = std::max(last_join, t.joined_ns);
  }
  round.launch_s = Seconds(FromNs(last_join) - t0);
  round.first_main_s = Seconds(FromNs(first_main) - t0);
  round.last_main_s = Seconds(FromNs(last_main) - t0);
  return round;
}

absl::StatusOr<std::string> FindTorchWorker(const LaunchBenchOptions& options) {
  if (!options.torch_worker.empty()) {
    if (fs::is_regular_file(options.torch_worker)) return options.torch_worker;
    return absl::NotFoundError(
        absl::StrCat("--torch-worker ", options.torch_worker, ": no such file"));
  }
  std::vector<std::string> candidates;
  const std::string self_dir = cli::SelfExeDir();
  if (!self_dir.empty()) candidates.push_back(absl::StrCat(self_dir, "/", kLaunchWorkerScript));
#ifdef MESH_BENCH_SOURCE_DIR
  candidates.push_back(absl::StrCat(MESH_BENCH_SOURCE_DIR, "/", kLaunchWorkerScript));
#endif
  for (const std::string& c : candidates) {
    if (fs::is_regular_file(c)) return c;
  }
  return absl::NotFoundError(absl::StrCat("cannot find ", kLaunchWorkerScript, "; looked in ",
                                          absl::StrJoin(candidates, ", "),
                                          ". Pass --torch-worker PATH"));
}

absl::StatusOr<std::string> Absolute(absl::StatusOr<std::string> path) {
  if (!path.ok()) return path;
  return fs::absolute(*path).lexically_normal().string();
}

}  // namespace

std::string TorchrunUnavailableReason(const std::string& path_env) {
  bool found = false;
  for (absl::string_view dir : absl::StrSplit(path_env, ':', absl::SkipEmpty())) {
    if (IsExecutableFile(absl::StrCat(dir, "/torchrun"))) {
      found = true;
      break;
    }
  }
  if (!found) return "python3-torch not installed: torchrun is not on PATH";
  Spawned probe;
  if (!probe.Start({"python3", "-c", "import torch"}, CurrentEnvironment({}), "").ok()) {
    return "cannot run python3";
  }
  const std::optional<ExitStatus> exit = probe.Wait(absl::Now() + kTorchProbeTimeout);
  if (!exit.has_value()) {
    probe.Kill();
    return absl::StrCat("python3 -c 'import torch' did not finish within ",
                        absl::FormatDuration(kTorchProbeTimeout));
  }
  if (!exit->success()) {
    return "python3-torch not installed: python3 cannot import torch";
  }
  return "";
}

absl::StatusOr<LaunchBenchResult> RunLaunchBench(const LaunchBenchOptions& options) {
  if (options.nproc < 1) return absl::InvalidArgumentError("--nproc must be at least 1");
  if (options.rounds < 1) return absl::InvalidArgumentError("--rounds must be at least 1");
  if (options.warmup < 0) return absl::InvalidArgumentError("--warmup must be >= 0");
  if (options.round_timeout <= absl::ZeroDuration() ||
      options.start_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeouts must be positive");
  }

  const std::string self_dir = cli::SelfExeDir();
  const char* path_env = std::getenv("PATH");
  const std::string path = path_env != nullptr ? path_env : "";
  auto coordinator_bin = Absolute(
      cli::FindBinary(cli::kCoordinatorBinary, options.coordinator_bin, "--coordinator-bin",
                      cli::BinaryCandidates(cli::kCoordinatorBinary, "coordinator", self_dir, path),
                      IsExecutableFile));
  if (!coordinator_bin.ok()) return coordinator_bin.status();
  auto agent_bin = Absolute(cli::FindBinary(
      cli::kAgentBinary, options.agent_bin, "--agent-bin",
      cli::BinaryCandidates(cli::kAgentBinary, "agent", self_dir, path), IsExecutableFile));
  if (!agent_bin.ok()) return agent_bin.status();
  auto worker_bin = Absolute(cli::FindBinary(
      kLaunchWorkerBinary, options.worker_bin, "--worker-bin",
      cli::BinaryCandidates(kLaunchWorkerBinary, "bench", self_dir, path), IsExecutableFile));
  if (!worker_bin.ok()) return worker_bin.status();

  LaunchBenchResult result;
  result.nproc = options.nproc;
  result.load_average = LoadAverage();

  std::string torch_script;
  if (options.no_torchrun) {
    result.torchrun_skip_reason = "--no-torchrun";
  } else {
    result.torchrun_skip_reason = TorchrunUnavailableReason(path);
    if (result.torchrun_skip_reason.empty()) {
      auto script = Absolute(FindTorchWorker(options));
      if (!script.ok()) return script.status();
      torch_script = *script;
    }
  }
  result.torchrun_ran = result.torchrun_skip_reason.empty();

  auto made = TempDir::Make();
  if (!made.ok()) return made.status();
  std::unique_ptr<TempDir> dir = *std::move(made);
  MeshHalf mesh_half(options, *worker_bin, dir->path());
  // On any failure: stop the cluster, keep the temp dir (its logs are the
  // evidence) and say where it is.
  auto fail = [&](const absl::Status& s, bool cluster_log = true) {
    // A cluster that stopped by itself (a child died) explains the failure;
    // a failed Start has already said so.
    const bool died = cluster_log && mesh_half.died();
    const std::string cluster_err = mesh_half.Stop();
    dir->Keep();
    return absl::Status(s.code(), absl::StrCat(s.message(), died ? "\ncluster: " + cluster_err : "",
                                               "\n(logs kept in ", dir->path(), ")"));
  };
  if (absl::Status s = mesh_half.Start(*coordinator_bin, *agent_bin); !s.ok()) {
    return fail(s, /*cluster_log=*/false);
  }
  result.coordinator = mesh_half.address();

  // Warm-up: page cache, the coordinator's and agent's first-job paths,
  // torch's first import.
  for (int i = 0; i < options.warmup; ++i) {
    if (auto r = mesh_half.Round(-1 - i); !r.ok()) return fail(r.status());
    if (result.torchrun_ran) {
      if (auto r = TorchRound(options, torch_script, dir->path(), -1 - i); !r.ok()) {
        return fail(r.status());
      }
    }
  }
  for (int i = 0; i < options.rounds; ++i) {
    auto mesh_round = mesh_half.Round(i);
    if (!mesh_round.ok()) return fail(mesh_round.status());
    result.mesh.push_back(*mesh_round);
    if (result.torchrun_ran) {
      auto torch_round = TorchRound(options, torch_script, dir->path(), i);
      if (!torch_round.ok()) return fail(torch_round.status());
      result.torchrun.push_back(*torch_round);
    }
  }
  mesh_half.Stop();

  std::vector<double> mesh_s, torch_s;
  for (const auto& r : result.mesh) mesh_s.push_back(r.launch_s);
  for (const auto& r : result.torchrun) torch_s.push_back(r.launch_s);
  result.mesh_median_s = Median(mesh_s);
  result.torchrun_median_s = Median(torch_s);
  if (result.torchrun_ran && result.mesh_median_s > 0) {
    result.ratio = result.torchrun_median_s / result.mesh_median_s;
  }
  return result;
}

nlohmann::json ToJson(const LaunchBenchResult& result) {
  nlohmann::json mesh_rounds = nlohmann::json::array();
  for (const MeshLaunchRound& r : result.mesh) {
    mesh_rounds.push_back({{"job_id", r.job_id},
                           {"launch_s", r.launch_s},
                           {"submit_rpc_s", r.submit_rpc_s},
                           {"scheduled_s", r.scheduled_s},
                           {"running_s", r.running_s},
                           {"first_main_s", r.first_main_s},
                           {"last_main_s", r.last_main_s},
                           {"succeeded_s", r.succeeded_s}});
  }
  nlohmann::json json = {
      {"benchmark", "launch"},
      {"nproc", result.nproc},
      {"rounds", result.mesh.size()},
      {"load_average", result.load_average},
      {"coordinator", result.coordinator},
      {"mesh", {{"median_s", result.mesh_median_s}, {"rounds", mesh_rounds}}},
      {"goal_s", kLaunchGoalSeconds},
      {"goal_ratio", kLaunchGoalRatio},
      {"mesh_meets_goal", result.mesh_median_s < kLaunchGoalSeconds},
  };
  if (result.torchrun_ran) {
    nlohmann::json torch_rounds = nlohmann::json::array();
    for (const TorchLaunchRound& r : result.torchrun) {
      torch_rounds.push_back({{"launch_s", r.launch_s},
                              {"first_main_s", r.first_main_s},
                              {"last_main_s", r.last_main_s},
                              {"exited_s", r.exited_s}});
    }
    json["torchrun"] = {{"median_s", result.torchrun_median_s}, {"rounds", torch_rounds}};
    json["ratio"] = result.ratio;
    json["ratio_meets_goal"] = result.ratio >= kLaunchGoalRatio;
  } else {
    json["torchrun"] = {{"skipped", result.torchrun_skip_reason}};
  }
  return json;
}

std::string FormatLaunchReport(const LaunchBenchResult& result, int warmup) {
  std::string text;
  absl::StrAppend(&text, "# mesh-bench launch: ", result.nproc, " local CPU ranks, ",
                  result.mesh.size(), " rounds (+", warmup,
                  " warm-up) per side; coordinator + 1 agent as child processes at ",
                  result.coordinator, "; load average ");
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.2f\n", result.load_average);
  text += buf;
  std::snprintf(buf, sizeof buf, "| %-5s | %-10s | %13s | %11s | %11s | %11s | %12s | %12s |\n",
                "round", "side", "launch (ms)", "submit (ms)", "sched (ms)", "running (ms)",
                "1st main (ms)", "last main (ms)");
  text += buf;
  text +=
      "|-------|------------|---------------|-------------|-------------|--------------|"
      "---------------|----------------|\n";
  for (size_t i = 0; i < result.mesh.size(); ++i) {
    const MeshLaunchRound& m = result.mesh[i];
    std::snprintf(buf, sizeof buf,
                  "| %5zu | %-10s | %13.1f | %11.1f | %11.0f | %12.0f | %13.1f | %14.1f |\n", i,
                  "mesh", m.launch_s * 1e3, m.submit_rpc_s * 1e3, m.scheduled_s * 1e3,
                  m.running_s * 1e3, m.first_main_s * 1e3, m.last_main_s * 1e3);
    text += buf;
    if (i < result.torchrun.size()) {
      const TorchLaunchRound& t = result.torchrun[i];
      std::snprintf(
          buf, sizeof buf, "| %5zu | %-10s | %13.1f | %11s | %11s | %12s | %13.1f | %14.1f |\n", i,
          "torchrun", t.launch_s * 1e3, "-", "-", "-", t.first_main_s * 1e3, t.last_main_s * 1e3);
      text += buf;
    }
  }
  std::snprintf(buf, sizeof buf, "mesh: median %.3f s (goal < %.1f s: %s)\n", result.mesh_median_s,
                kLaunchGoalSeconds, result.mesh_median_s < kLaunchGoalSeconds ? "met" : "NOT met");
  text += buf;
  if (result.torchrun_ran) {
    std::snprintf(buf, sizeof buf,
                  "torchrun: median %.3f s\nratio (torchrun / mesh): %.1fx (goal >= %.0fx: %s)\n",
                  result.torchrun_median_s, result.ratio, kLaunchGoalRatio,
                  result.ratio >= kLaunchGoalRatio ? "met" : "NOT met");
    text += buf;
  } else {
    absl::StrAppend(&text, "torchrun: skipped (", result.torchrun_skip_reason, ")\n");
  }
  text +=
      "# mesh: times from the SubmitJob reply; sched/running: the job's events (ms, coordinator "
      "clock); main: when workers' main() began. torchrun: times from spawning torchrun.\n";
  return text;
}

}  // namespace mesh::bench
