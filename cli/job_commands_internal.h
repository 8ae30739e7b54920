// Private to meshctl's job commands (job_commands.h), which are split by
// command group: job_commands.cc (the flags and dispatch), and
// job_commands_submit.cc, job_commands_show.cc and job_commands_follow.cc.
// Holds the parsed flags of every command (JobCommands::Options), each
// command's entry point, and the helpers more than one group uses.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cli/job_client.h"
#include "cli/job_commands.h"
#include "cli/output.h"
#include "mesh/v1/job.pb.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace mesh::cli {

using mesh::v1::Job;
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

using Options = JobCommands::Options;

// ---- Shared helpers (job_commands.cc) ----

// Prints the coordinator's error for people; returns its exit code.
int ReportError(const JobCommandContext& context, const absl::Status& status, std::ostream& err);
// Prints "meshctl <command>: <message>"; returns kExitUsage.
int UsageError(absl::string_view command, absl::string_view message, std::ostream& err);
// A finished job's result as meshctl's exit code.
int ExitCodeForResult(JobState state);

// ---- Showing a job (job_commands_show.cc) ----

// The job as a table (`detail`: describe's, else status's) or as JSON/YAML.
void RenderJob(const Job& job, bool detail, OutputFormat format, std::ostream& out);

// ---- Following a job (job_commands_follow.cc) ----

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
                               LogPrinter& printer, std::ostream& err);
// Waits for a terminal state with WaitJob slices; `limit` 0 waits forever.
// DEADLINE_EXCEEDED when `limit` passed first.
absl::StatusOr<Job> WaitForJob(const JobCommandContext& context, JobClient& client,
                               const std::string& job_id, absl::Duration limit);
// The one-line result of a finished job, for stderr.
std::string ResultLine(const Job& job);

// ---- The commands; each returns meshctl's exit code ----

// job_commands_submit.cc
int RunSubmit(const JobCommandContext& context, const Options& o, std::ostream& out,
              std::ostream& err);
int RunCancel(const JobCommandContext& context, const Options& o, std::ostream& out,
              std::ostream& err);
// job_commands_show.cc
int RunList(const JobCommandContext& context, const Options& o, std::ostream& out,
            std::ostream& err);
int RunShow(const JobCommandContext& context, const Options& o, bool detail, std::ostream& out,
            std::ostream& err);
int RunNodes(const JobCommandContext& context, std::ostream& out, std::ostream& err);
// job_commands_follow.cc
int RunLogs(const JobCommandContext& context, const Options& o, std::ostream& out,
            std::ostream& err);
int RunWait(const JobCommandContext& context, const Options& o, std::ostream& out,
            std::ostream& err);

}  // namespace mesh::cli
