// The one line a job's root cause says about a failed rank, from the
// agent's ReportWorkerExit: how the rank ended, then what the agent knows
// beyond the status (ReportWorkerExitRequest.detail, oom_killed).
//
//   rank 2 (node n1) exited with code 3
//   rank 0 (node n1) exited with code 127: error while loading shared
//     libraries: libfoo.so.1: cannot open shared object file: No such file
//     or directory
//   rank 1 (node n1) was killed by signal 11 (SIGSEGV)
//   rank 3 (node n1) was killed by the kernel: out of memory (memory limit
//     8 GiB)                                   (oom_killed, SIGKILL)
//   rank 3 (node n1) exited with code 1: a process it started was killed by
//     the kernel: out of memory (memory limit 8 GiB)   (oom_killed, a child)
//   rank 4 (node n2) could not be started: <launch_error>
//
// Thread safety: pure functions.
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "mesh/v1/job.pb.h"

namespace mesh::coordinator {

// Longest detail kept in a root cause message, in bytes; a longer one is
// cut at a character boundary and ends "...".
inline constexpr size_t kMaxExitDetailBytes = 1024;

// "11 (SIGSEGV)" for the common signals, else the number alone.
std::string DescribeSignal(int signal);

// The root cause message for the failed rank `who` ("rank 3 (node n1)")
// that `request` reports (a non-zero exit code, a signal or a launch error;
// with none of them, "<who> ended"). The detail reads well with or without
// the agent's wording: an OOM kill is always said to be one (oom_killed),
// whether or not the detail says "out of memory", and a detail with
// newlines or control characters is made one line.
std::string WorkerExitMessage(absl::string_view who,
                              const mesh::v1::ReportWorkerExitRequest& request);

}  // namespace mesh::coordinator
