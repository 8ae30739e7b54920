// Subprocess for integration tests: common/subprocess.h's Subprocess with
// its stdout captured and read line by line with a deadline, and a wait
// that returns the raw wait status (for WIFEXITED and friends).
//
// The child leads a process group of its own and gets PR_SET_PDEATHSIG
// (SIGKILL), so it dies with the test even when the test crashes; the
// destructor SIGKILLs the group and reaps it, so no process outlives a test.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace mesh::testing {

// Thread safety: none; use from one thread.
class Subprocess {
 public:
  // Starts argv[0] (a path) with argv. `env` entries "K=V" are added to this
  // process's environment. stdout is captured; stderr is inherited so that
  // ctest --output-on-failure shows it.
  // Possible errors: those of mesh::Subprocess::Spawn.
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv,
                                          const std::vector<std::string>& env = {});
  // Starts `options` as they are, except that stdout is captured and the
  // child leads a new process group unless it gets a session.
  static absl::StatusOr<Subprocess> Spawn(SpawnOptions options);

  pid_t pid() const { return process_.pid(); }
  // The process itself, for what this wrapper does not cover.
  ::mesh::Subprocess& process() { return process_; }

  // Next line of stdout without its newline.
  // Possible errors: DEADLINE_EXCEEDED; OUT_OF_RANGE at end of stream.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);

  // Sends `signal` to the child (not its group); a no-op once reaped.
  void Signal(int signal);

  // Waits for exit and returns the raw wait status (use WIFEXITED etc.).
  // Possible errors: DEADLINE_EXCEEDED when it is still running.
  absl::StatusOr<int> Wait(absl::Duration timeout);

 private:
  explicit Subprocess(::mesh::Subprocess process) : process_(std::move(process)) {}

  ::mesh::Subprocess process_;
  std::string buffer_;
};

// What RunMerged saw: the exit code (-1 when the command could not start or
// did not finish in time) and everything it wrote to stdout and stderr.
struct CommandOutput {
  int code = -1;
  std::string output;
};

// Runs `argv` (argv[0] a path) to its end with stderr merged into stdout,
// bounded by `timeout`; a command still running then is killed.
CommandOutput RunMerged(const std::vector<std::string>& argv, absl::Duration timeout);

}  // namespace mesh::testing
