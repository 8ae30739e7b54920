// Over 800 lines on purpose: one Run* function per meshctl job command
// (submit, list, show/describe, logs, cancel, wait, nodes), which share the
// flag and output helpers at the top. Each command's flags are declared in
// job_commands.h.

#include "cli/job_commands.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "cli/coordinator_errors.h"
#include "cli/job_client.h"
#include "cli/job_json.h"
#include "cli/job_spec_file.h"
#include "cli/meshctl.h"
#include "common/duration_format.h"

namespace mesh::cli {

using mesh::v1::Job;
using mesh::v1::JobSpec;
using mesh::v1::JobState;
using mesh::v1::LogChunk;

struct JobCommands::Options {
  CLI::App* submit = nullptr;
  CLI::App* list = nullptr;
  CLI::App* status = nullptr;
  CLI::App* describe = nullptr;
  CLI::App* logs = nullptr;
  CLI::App* cancel = nullptr;
  CLI::App* wait = nullptr;
  CLI::App* nodes = nullptr;

  // submit
  std::string file;
  std::string name;
  std::vector<std::string> labels;
  std::vector<std::string> env;
  std::string workdir;
  std::string node_count;
  int nproc_per_node = 0;
  int gpus_per_proc = 0;
  std::string mesh_shape;
  std::string dim_names;
  int max_restarts = 0;
  std::string deadline;
  std::string hang_timeout;
  std::string memory_per_proc;
  int64_t max_pids = 0;
  std::string on_hang;
  std::string grow;
  std::string restart_policy;
  std::string in_place_dim;
  std::string idempotency_key;
  bool no_wait = false;
  bool parsable = false;
  bool no_logs = false;
  std::vector<std::string> command;
  CLI::Option* name_opt = nullptr;
  CLI::Option* workdir_opt = nullptr;
  CLI::Option* nodes_opt = nullptr;
  CLI::Option* nproc_opt = nullptr;
  CLI::Option* gpus_opt = nullptr;
  CLI::Option* shape_opt = nullptr;
  CLI::Option* dims_opt = nullptr;
  CLI::Option* restarts_opt = nullptr;
  CLI::Option* deadline_opt = nullptr;
  CLI::Option* hang_timeout_opt = nullptr;
  CLI::Option* memory_opt = nullptr;
  CLI::Option* pids_opt = nullptr;
  CLI::Option* on_hang_opt = nullptr;
  CLI::Option* grow_opt = nullptr;
  CLI::Option* restart_policy_opt = nullptr;
  CLI::Option* in_place_dim_opt = nullptr;
  CLI::Option* key_opt = nullptr;

  // list
  std::vector<std::string> states;
  std::vector<std::string> label_filters;
  int limit = 0;
  bool all_pages = false;
  std::string page_token;

  // status, describe, logs, cancel, wait
  std::string job_id;

  // logs
  bool follow = false;
  std::vector<int> ranks;
  int tail = 0;
  int64_t generation = -1;
  bool no_prefix = false;

  // cancel
  std::string reason;

  // wait
  std::string wait_timeout = "0";
};

namespace {

// How long one WaitJob call asks the server to hold: short enough that a
// silently dead connection is noticed, long enough to be cheap.
constexpr absl::Duration kWaitSlice = absl::Seconds(30);

int ReportError(const JobCommandContext& context, const absl::Status& status, std::ostream& err) {
  err << DescribeCoordinatorError(context.coordinator, status) << "\n";
  return ExitCodeFor(status);
}

int UsageError(absl::string_view command, absl::string_view message, std::ostream& err) {
  err << "meshctl " << command << ": " << message << "\n";
  return kExitUsage;
}

int ExitCodeForResult(JobState state) {
  switch (state) {
    case mesh::v1::JOB_STATE_SUCCEEDED:
      return kExitOk;
    case mesh::v1::JOB_STATE_CANCELLED:
      return kExitJobCancelled;
    default:
      return kExitFailed;
  }
}

std::string OrDash(const std::string& text) { return text.empty() ? "-" : text; }

// Argv for people: arguments with spaces or quotes are single-quoted.
std::string ShowArgv(const google::protobuf::RepeatedPtrField<std::string>& argv) {
  std::vector<std::string> shown;
  for (const std::string& arg : argv) {
    if (!arg.empty() && arg.find_first_of(" \t\n'\"\\$`") == std::string::npos) {
      shown.push_back(arg);
    } else {
      std::string quoted = "'";
      for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
      shown.push_back(quoted + "'");
    }
  }
  return absl::StrJoin(shown, " ");
}

template <typename Map>
std::string ShowMap(const Map& map) {
  std::map<std::string, std::string> sorted(map.begin(), map.end());
  return OrDash(absl::StrJoin(sorted, ", ", absl::PairFormatter("=")));
}

std::string ShowTime(int64_t unix_ms, absl::Time now) {
  if (unix_ms == 0) return "-";
  return absl::StrCat(TimeToJson(unix_ms).get<std::string>(), " (", Age(unix_ms, now), " ago)");
}

// Node names for a table cell: at most three, then a count.
std::string ShowNodes(const google::protobuf::RepeatedPtrField<std::string>& nodes) {
  if (nodes.empty()) return "-";
  std::vector<std::string> shown(nodes.begin(), nodes.begin() + std::min(nodes.size(), 3));
  std::string cell = absl::StrJoin(shown, ",");
  if (nodes.size() > 3) absl::StrAppend(&cell, ",+", nodes.size() - 3);
  return cell;
}

std::string ShowState(const Job& job) {
  std::string state = JobStateName(job.state());
  if (!job.pending_reason().empty()) absl::StrAppend(&state, " (", job.pending_reason(), ")");
  return state;
}

// The failure a job records, labelled by what it did to the job: the root
// cause of a FAILED job, else the failure an earlier generation restarted
// after (a RUNNING job with a "node lost" cause is one that recovered).
std::vector<std::string> RootCauseRow(const Job& job) {
  const std::string line = RootCauseLine(job.root_cause());
  if (job.state() == mesh::v1::JOB_STATE_FAILED) return {"Root cause:", line};
  if (job.root_cause().generation() < job.generation()) {
    return {"Last failure:",
            absl::StrCat(line, " (restarted as generation ", job.generation(), ")")};
  }
  return {"Last failure:", line};
}

// status: the short view.
std::vector<std::vector<std::string>> SummaryRows(const Job& job, absl::Time now) {
  std::vector<std::vector<std::string>> rows = {
      {"ID:", job.id()},
      {"Name:", OrDash(job.spec().name())},
      {"Owner:", OrDash(job.owner())},
      {"State:", ShowState(job)},
      {"Generation:", absl::StrCat(job.generation(), " (restarts ", job.restarts(), "/",
                                   job.spec().max_restarts(), ")")},
  };
  if (job.nodes_size() > 0) {
    rows.push_back({"Nodes:", absl::StrCat(absl::StrJoin(job.nodes(), ", "), " (world size ",
                                           job.nodes_size() * job.spec().nproc_per_node(), ")")});
  } else {
    rows.push_back({"Nodes:", "- (not placed)"});
  }
  rows.push_back({"Created:", ShowTime(job.create_time_unix_ms(), now)});
  rows.push_back({"Updated:", ShowTime(job.update_time_unix_ms(), now)});
  if (job.has_root_cause()) rows.push_back(RootCauseRow(job));
  return rows;
}

// "group", or "in_place (dim dp)".
std::string RestartPolicyLine(const JobSpec& spec) {
  const std::string policy = RestartPolicyText(spec.restart_policy());
  if (spec.restart_policy() != mesh::v1::RESTART_POLICY_IN_PLACE || spec.in_place_dim().empty()) {
    return policy;
  }
  return absl::StrCat(policy, " (dim ", spec.in_place_dim(), ")");
}

void RenderJobTable(const Job& job, bool detail, std::ostream& out) {
  const absl::Time now = absl::Now();
  std::vector<std::vector<std::string>> rows = SummaryRows(job, now);
  if (detail) {
    const JobSpec& spec = job.spec();
    // Beside the restarts it governs.
    auto generation = std::find_if(rows.begin(), rows.end(),
                                   [](const auto& row) { return row.front() == "Generation:"; });
    if (generation != rows.end()) ++generation;
    rows.insert(generation, std::vector<std::string>{"Restart policy:", RestartPolicyLine(spec)});
    const int32_t max = spec.nodes().max() == 0 ? spec.nodes().min() : spec.nodes().max();
    const std::string requested =
        spec.nodes().min() == max ? absl::StrCat(max) : absl::StrCat(spec.nodes().min(), ":", max);
    std::vector<std::string> shape;
    for (int64_t size : spec.mesh_shape()) shape.push_back(absl::StrCat(size));
    rows.push_back({"Command:", ShowArgv(spec.command())});
    rows.push_back({"Working dir:", OrDash(spec.working_dir())});
    rows.push_back({"Env:", ShowMap(spec.env())});
    rows.push_back({"Labels:", ShowMap(spec.labels())});
    rows.push_back(
        {"Nodes wanted:", spec.nodes().min() == max
                              ? requested
                              : absl::StrCat(requested, " (grow: ", GrowText(spec), ")")});
    rows.push_back({"Procs/node:", absl::StrCat(spec.nproc_per_node())});
    rows.push_back({"GPUs/proc:", absl::StrCat(spec.gpus_per_proc())});
    rows.push_back({"Mesh:", absl::StrCat("[", absl::StrJoin(shape, ", "), "] (",
                                          absl::StrJoin(spec.mesh_dim_names(), ", "), ")")});
    rows.push_back({"Deadline:", spec.deadline_seconds() == 0
                                     ? std::string("none")
                                     : absl::StrCat(spec.deadline_seconds(), "s")});
    rows.push_back({"Hang timeout:", absl::StrCat(HangTimeoutSeconds(spec), "s (on hang: ",
                                                  HangPolicyName(spec.on_hang()), ")")});
    if (spec.memory_per_proc_bytes() > 0 || spec.max_pids() > 0) {
      rows.push_back({"Limits:", absl::StrCat("memory per proc ",
                                              spec.memory_per_proc_bytes() > 0
                                                  ? FormatByteSize(spec.memory_per_proc_bytes())
                                                  : std::string("none"),
                                              ", max pids ",
                                              spec.max_pids() > 0 ? absl::StrCat(spec.max_pids())
                                                                  : std::string("none"))});
    }
    rows.push_back({"Idempotency key:", OrDash(spec.idempotency_key())});
  }
  RenderRows(rows, out);
  if (detail) {
    out << "Events:\n";
    std::vector<std::vector<std::string>> events = {{"  TIME", "FROM", "TO", "GEN", "REASON"}};
    for (const auto& event : job.events()) {
      events.push_back(
          {absl::StrCat("  ", TimeToJson(event.time_unix_ms()).is_null()
                                  ? std::string("-")
                                  : TimeToJson(event.time_unix_ms()).get<std::string>()),
           JobStateName(event.from()), JobStateName(event.to()), absl::StrCat(event.generation()),
           OrDash(event.reason())});
    }
    if (job.events().empty()) events.push_back({"  (none)"});
    RenderRows(events, out);
    if (job.resizes_size() > 0) {
      out << "Resizes:\n";
      std::vector<std::vector<std::string>> resizes = {{"  TIME", "GEN", "NODES", "REASON"}};
      for (const auto& resize : job.resizes()) {
        const nlohmann::json time = TimeToJson(resize.time_unix_ms());
        resizes.push_back(
            {absl::StrCat("  ", time.is_null() ? std::string("-") : time.get<std::string>()),
             absl::StrCat(resize.generation()),
             absl::StrCat(resize.from_nodes(), " -> ", resize.to_nodes()),
             OrDash(resize.reason())});
      }
      RenderRows(resizes, out);
    }
    if (job.membership_size() > 0) {
      out << "Membership:\n";
      std::vector<std::vector<std::string>> changes = {
          {"  TIME", "EPOCH", "RANK", "CHANGE", "DETAIL"}};
      for (const auto& change : job.membership()) {
        const nlohmann::json time = TimeToJson(change.time_unix_ms());
        // A lost rank says why; a returned one, which process it is now.
        const std::string cell = change.kind() == mesh::v1::MembershipChange::KIND_RETURNED
                                     ? absl::StrCat("incarnation ", change.incarnation())
                                     : OrDash(change.reason());
        changes.push_back(
            {absl::StrCat("  ", time.is_null() ? std::string("-") : time.get<std::string>()),
             absl::StrCat(change.epoch()), absl::StrCat(change.rank()),
             MembershipKindName(change.kind()), cell});
      }
      RenderRows(changes, out);
    }
  }
}

void RenderJob(const Job& job, bool detail, OutputFormat format, std::ostream& out) {
  if (format == OutputFormat::kTable) {
    RenderJobTable(job, detail, out);
  } else {
    Render(JobToJson(job, detail), format, out);
  }
}

// Prints log chunks as lines with a rank prefix. Lines never span chunks on
// the wire, but the last line of a rank may lack its '\n', so each (rank,
// stream) keeps its partial line until more data or its eof. Re-requesting
// a generation after a dropped stream replays from the start (GetLogsRequest
// has no start offset), so bytes below what was already printed are skipped
// by offset.
class LogPrinter {
 public:
  LogPrinter(std::ostream& out, std::ostream& err, bool prefix)
      : out_(out), err_(err), prefix_(prefix) {}

  // Call before each GetLogs stream: later chunks below what was printed are
  // repeats.
  void BeginStream() {
    for (auto& [key, state] : states_) state.floor = state.end;
  }

  void OnChunk(const LogChunk& chunk) {
    const Key key{chunk.generation(), chunk.rank(), chunk.stream()};
    State& state = states_[key];
    if (chunk.missing()) {
      err_ << "meshctl: no log for rank " << chunk.rank() << " of generation " << chunk.generation()
           << "\n";
      return;
    }
    if (chunk.truncated() && !state.warned_truncated) {
      state.warned_truncated = true;
      err_ << "meshctl: rank " << chunk.rank() << ": output before byte " << chunk.offset()
           << " was dropped by the agent's log size cap\n";
    }
    absl::string_view data = chunk.data();
    const int64_t offset = chunk.offset();
    if (offset < state.floor) {
      const int64_t skip = std::min<int64_t>(state.floor - offset, data.size());
      data.remove_prefix(skip);
    }
    state.end = std::max<int64_t>(state.end, offset + static_cast<int64_t>(chunk.data().size()));
    state.partial.append(data.data(), data.size());
    size_t start = 0;
    for (size_t newline; (newline = state.partial.find('\n', start)) != std::string::npos;
         start = newline + 1) {
      WriteLine(chunk.rank(), absl::string_view(state.partial).substr(start, newline - start));
    }
    state.partial.erase(0, start);
    if (chunk.eof()) Flush(chunk.rank(), state);
    out_.flush();
  }

  // Ends every partial line (the stream is over).
  void FlushAll() {
    for (auto& [key, state] : states_) Flush(std::get<1>(key), state);
    out_.flush();
  }

 private:
  using Key = std::tuple<int64_t, int32_t, int>;
  struct State {
    std::string partial;
    int64_t end = 0;    // End offset of the furthest data received.
    int64_t floor = 0;  // Data below this was printed by an earlier stream.
    bool warned_truncated = false;
  };

  void Flush(int32_t rank, State& state) {
    if (state.partial.empty()) return;
    WriteLine(rank, state.partial);
    state.partial.clear();
  }

  void WriteLine(int32_t rank, absl::string_view line) {
    if (prefix_) out_ << "[rank " << rank << "] ";
    out_ << line << "\n";
  }

  std::ostream& out_;
  std::ostream& err_;
  const bool prefix_;
  std::map<Key, State> states_;
};

// One GetLogs stream of `job_id`, every chunk through `printer`, partial
// lines flushed at the end.
absl::Status PrintLogs(JobClient& client, const std::string& job_id, const std::vector<int>& ranks,
                       int64_t generation, int tail, bool follow, LogPrinter& printer) {
  mesh::v1::GetLogsRequest request;
  request.set_job_id(job_id);
  for (int rank : ranks) request.add_ranks(rank);
  request.set_generation(generation);
  request.set_tail(tail);
  request.set_follow(follow);
  absl::Status status = client.GetLogs(
      request,
      [&](const LogChunk& chunk) {
        printer.OnChunk(chunk);
        return true;
      },
      nullptr);
  printer.FlushAll();
  return status;
}

struct FollowOptions {
  std::vector<int> ranks;
  int tail = 0;
  // >= 0: only this generation; -1: the current one, then each restart's.
  int64_t generation = -1;
};

// logs -f (and submit's default): follows the current generation's logs to
// their end, then the next generation's after each restart, until the job is
// terminal. Returns the job as last read.
absl::StatusOr<Job> FollowLogs(const JobCommandContext& context, JobClient& client,
                               const std::string& job_id, const FollowOptions& options,
                               LogPrinter& printer, std::ostream& err) {
  auto job = client.GetJob(job_id, context.timeout);
  if (!job.ok()) return job.status();
  int64_t generation = options.generation >= 0 ? options.generation : job->generation();
  int tail = options.tail;
  bool warned_unavailable = false;
  for (;;) {
    printer.BeginStream();
    absl::Status status =
        PrintLogs(client, job_id, options.ranks, generation, tail, /*follow=*/true, printer);
    if (absl::IsFailedPrecondition(status)) {
      // Not placed yet: wait for the scheduler, then ask again.
      absl::Status watched = client.WatchJobState(
          job_id, /*replay=*/true,
          [&](const mesh::v1::WatchJobStateResponse& response) {
            const auto& event = response.event();
            if (event.generation() > generation) return false;
            if (event.generation() < generation) return true;
            return event.to() == mesh::v1::JOB_STATE_PENDING ||
                   event.to() == mesh::v1::JOB_STATE_RESTARTING;
          },
          nullptr);
      if (!watched.ok() && !absl::IsCancelled(watched)) return watched;
    } else if (!status.ok() && !absl::IsUnavailable(status)) {
      return status;
    }
    job = client.GetJob(job_id, context.timeout);
    if (!job.ok()) return job.status();
    if (absl::IsUnavailable(status)) {
      // The coordinator answers but a node holding the logs is not
      // connected: the job will restart or fail; keep following.
      if (!warned_unavailable) {
        err << "meshctl: logs of job " << job_id << " generation " << generation
            << " unavailable: " << status.message() << "\n";
        warned_unavailable = true;
      }
      if (!IsTerminal(job->state()) && job->generation() == generation) {
        absl::SleepFor(absl::Seconds(1));
        continue;
      }
    }
    if (options.generation >= 0) {
      if (status.ok() || IsTerminal(job->state())) return job;
      absl::SleepFor(absl::Seconds(1));  // Unreachable logs: ask again, never spinning.
      continue;
    }
    if (job->generation() > generation) {
      generation = job->generation();
      tail = 0;
      warned_unavailable = false;
      err << "--- generation " << generation << " (restart " << job->restarts() << ") ---\n";
      continue;
    }
    if (IsTerminal(job->state())) return job;
    if (status.ok()) {
      // Every selected rank of this generation has ended, but the job has
      // not (other ranks run on). Wait for it to restart or end instead of
      // fetching the same logs again.
      absl::Status watched = client.WatchJobState(
          job_id, /*replay=*/true,
          [&](const mesh::v1::WatchJobStateResponse& response) {
            const auto& event = response.event();
            return event.generation() <= generation && !IsTerminal(event.to());
          },
          nullptr);
      if (watched.ok() || absl::IsCancelled(watched)) continue;
    }
    // The stream broke off, or the job is placed but its logs are not
    // reachable yet: ask again after a pause, so this never spins; the
    // printer skips what it already showed.
    absl::SleepFor(absl::Milliseconds(200));
  }
}

// Waits for a terminal state with WaitJob slices; `limit` 0 waits forever.
// DEADLINE_EXCEEDED when `limit` passed first.
absl::StatusOr<Job> WaitForJob(const JobCommandContext& context, JobClient& client,
                               const std::string& job_id, absl::Duration limit) {
  const absl::Time deadline =
      limit == absl::ZeroDuration() ? absl::InfiniteFuture() : absl::Now() + limit;
  for (;;) {
    const absl::Duration remaining = deadline - absl::Now();
    if (remaining <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("job ", job_id, " not finished after ", FormatDurationShort(limit)));
    }
    const absl::Duration slice = std::min(remaining, kWaitSlice);
    const absl::Time started = absl::Now();
    auto job = client.WaitJob(job_id, slice, context.timeout);
    if (job.ok() || !absl::IsDeadlineExceeded(job.status())) return job;
    // Not yet. A server that answers at once must not make this spin.
    const absl::Duration elapsed = absl::Now() - started;
    if (elapsed < absl::Milliseconds(100)) {
      absl::SleepFor(std::min(absl::Milliseconds(100) - elapsed, deadline - absl::Now()));
    }
  }
}

// The one-line result of a finished job, for stderr.
std::string ResultLine(const Job& job) {
  std::string line = absl::StrCat("meshctl: job ", job.id(), " ", JobStateName(job.state()));
  if (job.state() == mesh::v1::JOB_STATE_FAILED && job.has_root_cause()) {
    absl::StrAppend(&line, ": ", RootCauseLine(job.root_cause()));
  }
  if (job.state() == mesh::v1::JOB_STATE_CANCELLED && !job.events().empty() &&
      !job.events().rbegin()->reason().empty()) {
    absl::StrAppend(&line, ": ", job.events().rbegin()->reason());
  }
  return line;
}

}  // namespace

namespace {

using Options = JobCommands::Options;

// The spec to submit: the file's fields, then each flag given (labels and
// env merge key by key), then argv after `--`.
// Errors: INVALID_ARGUMENT naming the flag, or the file and position.
absl::StatusOr<JobSpec> BuildSpec(const Options& o) {
  JobSpec spec;
  if (!o.file.empty()) {
    auto parsed = ReadJobSpecFile(o.file);
    if (!parsed.ok()) return absl::InvalidArgumentError(parsed.status().message());
    spec = *std::move(parsed);
  }
  auto flag_error = [](absl::string_view flag, const absl::Status& status) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", status.message()));
  };
  if (o.name_opt->count() > 0) spec.set_name(o.name);
  for (const std::string& label : o.labels) {
    auto kv = ParseKeyValue(label);
    if (!kv.ok()) return flag_error("--label", kv.status());
    (*spec.mutable_labels())[kv->first] = kv->second;
  }
  for (const std::string& var : o.env) {
    auto kv = ParseKeyValue(var);
    if (!kv.ok()) return flag_error("--env", kv.status());
    (*spec.mutable_env())[kv->first] = kv->second;
  }
  if (o.workdir_opt->count() > 0) spec.set_working_dir(o.workdir);
  if (o.nodes_opt->count() > 0) {
    auto count = ParseNodeCount(o.node_count);
    if (!count.ok()) return flag_error("--nodes", count.status());
    *spec.mutable_nodes() = *count;
  }
  if (o.nproc_opt->count() > 0) spec.set_nproc_per_node(o.nproc_per_node);
  if (o.gpus_opt->count() > 0) spec.set_gpus_per_proc(o.gpus_per_proc);
  if (o.shape_opt->count() > 0) {
    auto shape = ParseMeshShape(o.mesh_shape);
    if (!shape.ok()) return flag_error("--mesh-shape", shape.status());
    spec.clear_mesh_shape();
    for (int64_t size : *shape) spec.add_mesh_shape(size);
  }
  if (o.dims_opt->count() > 0) {
    spec.clear_mesh_dim_names();
    for (absl::string_view dim : absl::StrSplit(o.dim_names, ',')) {
      spec.add_mesh_dim_names(std::string(dim));
    }
  }
  if (o.restarts_opt->count() > 0) spec.set_max_restarts(o.max_restarts);
  if (o.deadline_opt->count() > 0) {
    auto seconds = ParseDurationSeconds(o.deadline);
    if (!seconds.ok()) return flag_error("--deadline", seconds.status());
    spec.set_deadline_seconds(*seconds);
  }
  if (o.hang_timeout_opt->count() > 0) {
    auto seconds = ParseDurationSeconds(o.hang_timeout);
    if (!seconds.ok()) return flag_error("--hang-timeout", seconds.status());
    if (*seconds == 0) {
      return flag_error("--hang-timeout",
                        absl::InvalidArgumentError("must be positive, e.g. 5m (the default)"));
    }
    spec.set_hang_timeout_seconds(*seconds);
  }
  if (o.memory_opt->count() > 0) {
    auto bytes = ParseByteSize(o.memory_per_proc);
    if (!bytes.ok()) return flag_error("--memory-per-proc", bytes.status());
    spec.set_memory_per_proc_bytes(*bytes);
  }
  if (o.pids_opt->count() > 0) spec.set_max_pids(o.max_pids);
  if (o.on_hang_opt->count() > 0) {
    auto policy = ParseHangPolicy(o.on_hang);
    if (!policy.ok()) return flag_error("--on-hang", policy.status());
    spec.set_on_hang(*policy);
  }
  if (o.grow_opt->count() > 0) {
    if (absl::Status grow = ParseGrow(o.grow, spec); !grow.ok()) return flag_error("--grow", grow);
  }
  if (o.restart_policy_opt->count() > 0) {
    auto policy = ParseRestartPolicy(o.restart_policy);
    if (!policy.ok()) return flag_error("--restart-policy", policy.status());
    spec.set_restart_policy(*policy);
  }
  if (o.in_place_dim_opt->count() > 0) {
    if (absl::Status dim = CheckInPlaceDim(o.in_place_dim); !dim.ok()) {
      return flag_error("--in-place-dim", dim);
    }
    spec.set_in_place_dim(o.in_place_dim);
  }
  if (o.key_opt->count() > 0) spec.set_idempotency_key(o.idempotency_key);
  if (!o.command.empty()) {
    spec.clear_command();
    for (const std::string& arg : o.command) spec.add_command(arg);
  }
  // Validation requires at least one node and one process per node; an
  // omitted count means one, as with torchrun.
  if (!spec.has_nodes()) {
    spec.mutable_nodes()->set_min(1);
    spec.mutable_nodes()->set_max(1);
  }
  if (spec.nproc_per_node() == 0 && o.nproc_opt->count() == 0) spec.set_nproc_per_node(1);
  if (absl::Status env = CheckEnvNames(spec); !env.ok()) return env;
  return spec;
}

int RunSubmit(const JobCommandContext& context, const Options& o, std::ostream& out,
              std::ostream& err) {
  auto spec = BuildSpec(o);
  if (!spec.ok()) return UsageError("submit", spec.status().message(), err);
  if (spec->command().empty()) {
    return UsageError("submit",
                      "no command to run: give it after `--` (meshctl submit -- python train.py) "
                      "or as `command:` in the spec file",
                      err);
  }
  JobClient client(context.Channel());
  auto submitted = client.SubmitJob(*spec, context.timeout);
  if (!submitted.ok()) return ReportError(context, submitted.status(), err);
  const Job& job = submitted->job();
  if (o.parsable) {
    out << job.id() << "\n";
    return kExitOk;
  }
  if (submitted->deduplicated()) {
    err << "meshctl: idempotency key matched job " << job.id() << "; nothing new was submitted\n";
  }
  if (o.no_wait) {
    if (context.format == OutputFormat::kTable) {
      out << job.id() << "\n";
    } else {
      nlohmann::json json = JobToJson(job, false);
      json["deduplicated"] = submitted->deduplicated();
      Render(json, context.format, out);
    }
    return kExitOk;
  }
  err << "meshctl: submitted job " << job.id()
      << (o.no_logs ? "; waiting for it" : "; following its logs")
      << " (Ctrl-C stops meshctl, not the job)\n";
  absl::StatusOr<Job> final_job;
  if (o.no_logs) {
    final_job = WaitForJob(context, client, job.id(), absl::ZeroDuration());
  } else {
    LogPrinter printer(out, err, /*prefix=*/true);
    final_job = FollowLogs(context, client, job.id(), FollowOptions{}, printer, err);
  }
  if (!final_job.ok()) return ReportError(context, final_job.status(), err);
  if (!IsTerminal(final_job->state())) {
    // FollowLogs returns only terminal jobs; this guards a future change.
    final_job = WaitForJob(context, client, job.id(), absl::ZeroDuration());
    if (!final_job.ok()) return ReportError(context, final_job.status(), err);
  }
  err << ResultLine(*final_job) << "\n";
  if (context.format != OutputFormat::kTable)
    Render(JobToJson(*final_job, false), context.format, out);
  return ExitCodeForResult(final_job->state());
}

int RunList(const JobCommandContext& context, const Options& o, std::ostream& out,
            std::ostream& err) {
  mesh::v1::ListJobsRequest request;
  for (const std::string& text : o.states) {
    for (absl::string_view one : absl::StrSplit(text, ',')) {
      auto state = ParseJobState(one);
      if (!state) {
        return UsageError("list",
                          absl::StrCat("--state: unknown state \"", one,
                                       "\"; expected PENDING, SCHEDULED, RUNNING, RESTARTING, "
                                       "SUCCEEDED, FAILED or CANCELLED"),
                          err);
      }
      request.add_states(*state);
    }
  }
  for (const std::string& label : o.label_filters) {
    auto kv = ParseKeyValue(label);
    if (!kv.ok()) return UsageError("list", absl::StrCat("-l: ", kv.status().message()), err);
    (*request.mutable_labels())[kv->first] = kv->second;
  }
  request.set_page_size(o.limit);
  request.set_page_token(o.page_token);
  JobClient client(context.Channel());
  std::vector<Job> jobs;
  std::string next;
  for (;;) {
    auto page = client.ListJobs(request, context.timeout);
    if (!page.ok()) return ReportError(context, page.status(), err);
    for (auto& job : *page->mutable_jobs()) jobs.push_back(std::move(job));
    next = page->next_page_token();
    // A server that hands back the token it was given would loop forever.
    if (!o.all_pages || next.empty() || next == request.page_token()) break;
    request.set_page_token(next);
  }
  if (o.all_pages) next.clear();
  if (context.format != OutputFormat::kTable) {
    nlohmann::json array = nlohmann::json::array();
    for (const Job& job : jobs) array.push_back(JobToJson(job, false));
    Render({{"jobs", std::move(array)}, {"next_page_token", next}}, context.format, out);
    return kExitOk;
  }
  const absl::Time now = absl::Now();
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "STATE", "GEN", "RESTARTS", "NODES", "AGE"}};
  for (const Job& job : jobs) {
    rows.push_back({job.id(), OrDash(job.spec().name()), JobStateName(job.state()),
                    absl::StrCat(job.generation()),
                    absl::StrCat(job.restarts(), "/", job.spec().max_restarts()),
                    ShowNodes(job.nodes()), Age(job.create_time_unix_ms(), now)});
  }
  if (jobs.empty()) {
    err << "meshctl: no jobs\n";
  } else {
    RenderRows(rows, out);
  }
  if (!next.empty()) {
    err << "meshctl: more jobs: use --all, or --page-token " << next << "\n";
  }
  return kExitOk;
}

int RunShow(const JobCommandContext& context, const Options& o, bool detail, std::ostream& out,
            std::ostream& err) {
  JobClient client(context.Channel());
  auto job = client.GetJob(o.job_id, context.timeout);
  if (!job.ok()) return ReportError(context, job.status(), err);
  RenderJob(*job, detail, context.format, out);
  return kExitOk;
}

int RunLogs(const JobCommandContext& context, const Options& o, std::ostream& out,
            std::ostream& err) {
  if (o.generation < -1) return UsageError("logs", "--generation must be >= 0", err);
  JobClient client(context.Channel());
  LogPrinter printer(out, err, !o.no_prefix);
  if (o.follow) {
    FollowOptions follow{o.ranks, o.tail, o.generation};
    auto job = FollowLogs(context, client, o.job_id, follow, printer, err);
    if (!job.ok()) return ReportError(context, job.status(), err);
    return kExitOk;
  }
  absl::Status status =
      PrintLogs(client, o.job_id, o.ranks, o.generation, o.tail, /*follow=*/false, printer);
  if (!status.ok()) return ReportError(context, status, err);
  return kExitOk;
}

int RunCancel(const JobCommandContext& context, const Options& o, std::ostream& out,
              std::ostream& err) {
  JobClient client(context.Channel());
  auto job = client.CancelJob(o.job_id, o.reason, context.timeout);
  if (!job.ok()) return ReportError(context, job.status(), err);
  if (job->state() != mesh::v1::JOB_STATE_CANCELLED) {
    err << "meshctl: job " << job->id() << " is " << JobStateName(job->state())
        << (IsTerminal(job->state()) ? "; nothing to cancel" : "; cancellation requested") << "\n";
  }
  if (context.format == OutputFormat::kTable) {
    out << "job " << job->id() << " " << JobStateName(job->state()) << "\n";
  } else {
    Render(JobToJson(*job, false), context.format, out);
  }
  return kExitOk;
}

int RunWait(const JobCommandContext& context, const Options& o, std::ostream& out,
            std::ostream& err) {
  auto limit = ParseWaitDuration(o.wait_timeout);
  if (!limit.ok())
    return UsageError("wait", absl::StrCat("--timeout: ", limit.status().message()), err);
  JobClient client(context.Channel());
  auto job = WaitForJob(context, client, o.job_id, *limit);
  if (absl::IsDeadlineExceeded(job.status())) {
    // Say where the job is, if the coordinator still answers.
    auto now = client.GetJob(o.job_id, context.timeout);
    err << "meshctl: wait: " << job.status().message();
    if (now.ok()) err << "; it is " << JobStateName(now->state());
    err << "\n";
    return kExitWaitTimeout;
  }
  if (!job.ok()) return ReportError(context, job.status(), err);
  RenderJob(*job, false, context.format, out);
  if (job->state() != mesh::v1::JOB_STATE_SUCCEEDED) err << ResultLine(*job) << "\n";
  return ExitCodeForResult(job->state());
}

int RunNodes(const JobCommandContext& context, std::ostream& out, std::ostream& err) {
  JobClient client(context.Channel());
  auto nodes = client.ListNodes(context.timeout);
  if (!nodes.ok()) return ReportError(context, nodes.status(), err);
  if (context.format != OutputFormat::kTable) {
    nlohmann::json array = nlohmann::json::array();
    for (const auto& node : nodes->nodes()) array.push_back(NodeToJson(node));
    Render({{"nodes", std::move(array)}}, context.format, out);
    return kExitOk;
  }
  const absl::Time now = absl::Now();
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "STATE", "ADDRESS", "SLOTS", "FREE", "GPUS", "JOBS", "ISOLATION", "LAST-SEEN"}};
  // Nodes that run every job's workers as one account: said below the table.
  std::vector<std::string> unisolated;
  for (const auto& node : nodes->nodes()) {
    rows.push_back({node.name(), NodeStateName(node.state()), OrDash(node.address()),
                    absl::StrCat(node.slots()), absl::StrCat(node.free_slots()),
                    absl::StrCat(node.free_gpus(), "/", node.gpus_size()),
                    OrDash(absl::StrJoin(node.jobs(), ",")), IsolationCell(node.isolation()),
                    node.last_seen_unix_ms() == 0
                        ? std::string("-")
                        : absl::StrCat(Age(node.last_seen_unix_ms(), now), " ago")});
    if (node.has_isolation() && !node.isolation().run_as_owner()) {
      unisolated.push_back(absl::StrCat("meshctl: node ", node.name(), ": job isolation is ",
                                        node.isolation().users()));
    }
  }
  if (nodes->nodes().empty()) {
    err << "meshctl: no nodes registered\n";
  } else {
    RenderRows(rows, out);
    for (const std::string& line : unisolated) err << line << "\n";
  }
  return kExitOk;
}

}  // namespace

JobCommands::JobCommands(CLI::App& app) : options_(std::make_unique<Options>()) {
  Options& o = *options_;

  o.submit = app.add_subcommand(
      "submit",
      "Submit a job, follow its logs and exit with its result (0 SUCCEEDED, 1 FAILED, "
      "5 CANCELLED)");
  CLI::App* s = o.submit;
  s->add_option("-f,--file", o.file, "Job spec file (YAML or JSON); flags override its fields");
  o.name_opt = s->add_option("--name", o.name, "Job name");
  s->add_option("--label", o.labels, "Label KEY=VALUE (repeatable)")->allow_extra_args(false);
  s->add_option("--env", o.env, "Worker environment variable KEY=VALUE (repeatable)")
      ->allow_extra_args(false);
  o.workdir_opt = s->add_option("--workdir", o.workdir, "Absolute working directory of workers");
  o.nodes_opt = s->add_option("--nodes", o.node_count, "Nodes: N or MIN:MAX (default 1)");
  o.nproc_opt =
      s->add_option("--nproc-per-node", o.nproc_per_node, "Worker processes per node (default 1)");
  o.gpus_opt = s->add_option("--gpus-per-proc", o.gpus_per_proc, "GPUs per process (0: CPU job)");
  o.shape_opt = s->add_option("--mesh-shape", o.mesh_shape,
                              "Device mesh shape, outermost first, e.g. 2,2 or 2,-1");
  o.dims_opt = s->add_option("--dim-names", o.dim_names, "Mesh dimension names, e.g. dp,tp");
  o.restarts_opt =
      s->add_option("--max-restarts", o.max_restarts, "Restarts after a failure before FAILED");
  o.deadline_opt =
      s->add_option("--deadline", o.deadline, "Fail the job after this long: 90s, 10m, 2h");
  o.hang_timeout_opt = s->add_option(
      "--hang-timeout", o.hang_timeout,
      "Diagnose a hang once a rank has waited this long in a collective that another rank never "
      "entered (default 5m; docs/hangs.md)");
  o.on_hang_opt = s->add_option("--on-hang", o.on_hang,
                                "What a diagnosed hang does: restart (default; counts against "
                                "--max-restarts) or fail");
  o.grow_opt = s->add_option("--grow", o.grow,
                             "When a job with --nodes MIN:MAX takes more nodes: never (default), "
                             "on_restart, or after:DURATION at its size (docs/elastic.md)");
  o.restart_policy_opt = s->add_option(
      "--restart-policy", o.restart_policy,
      "What a failed worker does to the others: group (default; the whole job restarts) or "
      "in_place (it is relaunched alone while the others run on; docs/elastic.md)");
  o.in_place_dim_opt = s->add_option(
      "--in-place-dim", o.in_place_dim,
      "With --restart-policy in_place: the mesh dimension the survivors shrink along while a "
      "rank is replaced (default dp)");
  o.memory_opt = s->add_option("--memory-per-proc", o.memory_per_proc,
                               "Memory limit of each worker with what it starts, e.g. 8GiB; over "
                               "it the kernel kills the worker (docs/jobs.md)");
  o.pids_opt = s->add_option("--max-pids", o.max_pids,
                             "Processes and threads each worker may have, itself included");
  o.key_opt = s->add_option("--idempotency-key", o.idempotency_key,
                            "Submitting the same key again returns the first job");
  s->add_flag("--no-wait", o.no_wait, "Print the job id once it is stored, and exit 0");
  s->add_flag("--parsable", o.parsable, "Print only the job id (implies --no-wait)");
  s->add_flag("--no-logs", o.no_logs, "Wait for the result without printing logs");
  s->add_option("command", o.command, "The program and its arguments, after --");

  o.list = app.add_subcommand("list", "List jobs, newest first");
  o.list->add_option("--state", o.states, "Only jobs in this state (repeatable or comma-separated)")
      ->allow_extra_args(false);
  o.list
      ->add_option("-l,--label", o.label_filters,
                   "Only jobs with this label KEY=VALUE (repeatable: all must match)")
      ->allow_extra_args(false);
  o.list->add_option("--limit", o.limit, "Jobs per page (default: the server's, 100)")
      ->check(CLI::Range(0, 1000));
  o.list->add_flag("--all", o.all_pages, "Fetch every page");
  o.list->add_option("--page-token", o.page_token, "Continue a listing from this token");

  o.status = app.add_subcommand("status", "A job's state, generation, nodes and root cause");
  o.status->add_option("job", o.job_id, "Job id")->required();
  o.describe = app.add_subcommand("describe", "Everything about a job: spec, placement, events");
  o.describe->add_option("job", o.job_id, "Job id")->required();

  o.logs = app.add_subcommand("logs", "Print a job's worker output, \"[rank R] \" per line");
  o.logs->add_option("job", o.job_id, "Job id")->required();
  o.logs->add_flag("-f,--follow", o.follow, "Keep printing until the job ends, across restarts");
  o.logs->add_option("--rank", o.ranks, "Only this rank (repeatable or comma-separated)")
      ->delimiter(',')
      ->allow_extra_args(false)
      ->check(CLI::NonNegativeNumber);
  o.logs->add_option("--tail", o.tail, "Start with the last N lines of each rank")
      ->check(CLI::NonNegativeNumber);
  o.logs->add_option("--generation", o.generation,
                     "Only this generation (default: the current one)");
  o.logs->add_flag("--no-prefix", o.no_prefix, "Print lines without the \"[rank R] \" prefix");

  o.cancel = app.add_subcommand("cancel", "Cancel a job and kill its workers");
  o.cancel->add_option("job", o.job_id, "Job id")->required();
  o.cancel->add_option("--reason", o.reason, "Recorded in the job's CANCELLED event");

  o.wait = app.add_subcommand(
      "wait", "Wait for a job to end; exit 0 SUCCEEDED, 1 FAILED, 5 CANCELLED, 6 timed out");
  o.wait->add_option("job", o.job_id, "Job id")->required();
  o.wait
      ->add_option("--timeout", o.wait_timeout,
                   "Give up after this long (90s, 10m, seconds; 0: never)")
      ->capture_default_str();

  o.nodes = app.add_subcommand("nodes", "List the nodes (agents) the coordinator knows");
}

JobCommands::~JobCommands() = default;

bool JobCommands::Parsed() const {
  const Options& o = *options_;
  for (const CLI::App* command :
       {o.submit, o.list, o.status, o.describe, o.logs, o.cancel, o.wait, o.nodes}) {
    if (command->parsed()) return true;
  }
  return false;
}

int JobCommands::Run(const JobCommandContext& context, std::ostream& out, std::ostream& err) {
  const Options& o = *options_;
  if (o.submit->parsed()) return RunSubmit(context, o, out, err);
  if (o.list->parsed()) return RunList(context, o, out, err);
  if (o.status->parsed()) return RunShow(context, o, /*detail=*/false, out, err);
  if (o.describe->parsed()) return RunShow(context, o, /*detail=*/true, out, err);
  if (o.logs->parsed()) return RunLogs(context, o, out, err);
  if (o.cancel->parsed()) return RunCancel(context, o, out, err);
  if (o.wait->parsed()) return RunWait(context, o, out, err);
  if (o.nodes->parsed()) return RunNodes(context, out, err);
  err << "meshctl: no job command given\n";
  return kExitUsage;
}

}  // namespace mesh::cli
