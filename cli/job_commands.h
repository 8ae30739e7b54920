// meshctl's job commands: submit, list, status, describe, logs, cancel,
// wait and nodes, over JobService (cli/job_client.h). docs/cli.md is the
// user's reference; this header is the contract with cli/meshctl.cc.
//
// Exit codes (cli/meshctl.h): a job's result maps to 0 SUCCEEDED, 1 FAILED,
// 5 CANCELLED and 6 for a wait that timed out; 2 usage (including a spec
// file or value the client can already see is malformed), 3 unreachable,
// 4 refused by the coordinator (e.g. INVALID_ARGUMENT naming the field).
//
// Waiting never hangs silently: every unary call has a deadline (the global
// --timeout); WaitJob is re-issued in bounded slices; log streams end when
// the coordinator ends them or the connection drops. Ctrl-C (SIGINT) keeps
// its default action: meshctl dies at once (the shell reports 130) and the
// job keeps running.
//
// Thread safety: one JobCommands per RunMeshctl call; not shared.
#pragma once

#include <memory>
#include <ostream>
#include <string>

#include "absl/time/time.h"
#include "cli/admin_client.h"
#include "cli/output.h"

namespace CLI {
class App;
}  // namespace CLI

namespace mesh::cli {

// What every job command needs from the global options.
struct JobCommandContext {
  std::string coordinator;
  // The channel to `coordinator`, with meshctl's TLS files and token; null:
  // a plaintext one (tests).
  std::shared_ptr<grpc::Channel> channel;
  std::shared_ptr<grpc::Channel> Channel() const {
    return channel != nullptr ? channel : MakeChannel(coordinator);
  }
  // Deadline of each unary call (global --timeout).
  absl::Duration timeout;
  OutputFormat format;
};

class JobCommands {
 public:
  // Adds the job subcommands to `app`, which must outlive this object.
  explicit JobCommands(CLI::App& app);
  ~JobCommands();

  // True when the parsed command line named one of the job commands.
  bool Parsed() const;

  // Runs the parsed job command; returns meshctl's exit code.
  int Run(const JobCommandContext& context, std::ostream& out, std::ostream& err);

  // The parsed flags of every job command (defined in job_commands_internal.h).
  struct Options;

 private:
  std::unique_ptr<Options> options_;
};

}  // namespace mesh::cli
