// ChildSupervisor: the processes of one `meshctl cluster up` (the
// coordinator and the agents). Starts each with its output in a log file,
// waits in one poll() for a stop request, a child's exit and (with
// --verbose) the children's output, and stops a group of children with
// SIGTERM, a grace period and SIGKILL.
//
// Lifecycle of one child:
//
//   Start ──▶ RUNNING ──exits (WaitUntil returns kExited)──▶ REAPED
//                │                                          ▲
//                └─ Stop: SIGTERM ──grace──▶ SIGKILL ───────┘
//
// Children stay in meshctl's process group, so a terminal's Ctrl-C reaches
// them too, and get PR_SET_PDEATHSIG(SIGTERM), so none outlives a killed
// meshctl. Destruction SIGKILLs and reaps any child still running (the
// backstop for a bug in a caller's stop path).
//
// Thread safety: none. One thread uses it, and it must be the thread that
// lives as long as the children (the death signal fires when the thread that
// started them exits).
#pragma once

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace mesh::cli {

// One supervised process: the coordinator or an agent.
struct SupervisedChild {
  SupervisedChild(std::string name, std::string log_path, Subprocess process)
      : name(std::move(name)), log_path(std::move(log_path)), process(std::move(process)) {}

  std::string name;  // "coordinator", "local-0", ...
  std::string log_path;
  Subprocess process;
  int pipe_fd = -1;  // --verbose: read end of its stdout+stderr; -1 otherwise.
  int log_fd = -1;   // --verbose: the log file meshctl copies the pipe into.
  std::string partial_line;

  pid_t pid() const { return process.pid(); }
  bool running() const { return process.running(); }
};

class ChildSupervisor {
 public:
  enum class EventKind { kTimeout, kStop, kExited };
  struct Event {
    EventKind kind = EventKind::kTimeout;
    SupervisedChild* child = nullptr;  // kExited
  };

  // `stop_fd` readable means "stop" (it is polled, never read); -1: none.
  // With `verbose`, children's output is also copied to `err`, line by line
  // with their name as a prefix. `err` must outlive this object.
  ChildSupervisor(int stop_fd, bool verbose, std::ostream& err);
  ~ChildSupervisor();

  ChildSupervisor(const ChildSupervisor&) = delete;
  ChildSupervisor& operator=(const ChildSupervisor&) = delete;

  // Starts `argv` (argv[0] a path) with stdin from /dev/null and stdout and
  // stderr going to `log_path` (created or truncated). The child is owned
  // here; the pointer stays valid for this object's lifetime.
  // Possible errors: those of Subprocess::Spawn (NOT_FOUND for a missing
  // binary, ...); FAILED_PRECONDITION when the log cannot be opened.
  absl::StatusOr<SupervisedChild*> Start(const std::string& name,
                                         const std::vector<std::string>& argv,
                                         const std::string& log_path);

  // Waits until `deadline` for the stop fd, a child's exit, or (with
  // `watch_stop` false) only for exits. Output pipes are copied meanwhile,
  // and an exited child's last output is copied before it is reported.
  Event WaitUntil(absl::Time deadline, bool watch_stop = true);

  // SIGTERM to each running child of `group`, SIGKILL to those still
  // running after `grace`; returns once all of them are reaped, or 10 s
  // after SIGKILL (a process stuck in the kernel; reported on `err`).
  void Stop(const std::vector<SupervisedChild*>& group, absl::Duration grace);

  const std::vector<std::unique_ptr<SupervisedChild>>& children() const { return children_; }

 private:
  // --verbose: copies what the child wrote to its log and to `err_`.
  void CopyOutput(SupervisedChild& child);

  const int stop_fd_;
  const bool verbose_;
  std::ostream& err_;
  std::vector<std::unique_ptr<SupervisedChild>> children_;
};

}  // namespace mesh::cli
