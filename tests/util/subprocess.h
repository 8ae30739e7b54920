// Subprocess: start a real binary for an integration test, read its stdout
// line by line with a deadline, signal it, and reap it.
//
// The child is put in its own process group and gets PR_SET_PDEATHSIG
// (SIGKILL), so it dies with the test even when the test crashes; the
// destructor SIGKILLs the group and reaps it, so no process outlives a test.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mesh::testing {

// Thread safety: none; use from one thread.
class Subprocess {
 public:
  // Starts argv[0] (a path) with argv. `env` entries "K=V" are added to this
  // process's environment. stdout is captured; stderr is inherited so that
  // ctest --output-on-failure shows it.
  // Possible errors: INTERNAL when pipe/fork fails.
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv,
                                          const std::vector<std::string>& env = {});

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&&) = delete;
  Subprocess(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }

  // Next line of stdout without its newline.
  // Possible errors: DEADLINE_EXCEEDED; OUT_OF_RANGE at end of stream.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);

  // Sends `signal` to the child.
  void Signal(int signal);

  // Waits for exit and returns the raw wait status (use WIFEXITED etc.).
  // Possible errors: DEADLINE_EXCEEDED when it is still running.
  absl::StatusOr<int> Wait(absl::Duration timeout);

 private:
  Subprocess(pid_t pid, int stdout_fd) : pid_(pid), stdout_fd_(stdout_fd) {}

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  bool reaped_ = false;
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
