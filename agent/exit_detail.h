// What a worker's exit means beyond its status, read from the end of its
// log. The agent sends it as ReportWorkerExitRequest.detail; the coordinator
// appends it to the job's root cause ("rank 0 (node n1) exited with code
// 127: error while loading shared libraries: libfoo.so.1: cannot open shared
// object file: No such file or directory").
//
// Exit code 127 is what a program gets when it could not be run at all:
// glibc's dynamic loader exits 127 when a library is missing, printing
//   <program>: error while loading shared libraries: <lib>: <reason>
// and a shell exits 127 for "command not found". Other statuses have no
// detail here (an OOM kill is known from the cgroup, not the log).
//
// Thread safety: ExitDetail is a pure function; ReadLogTail reads a file and
// may run on any thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "agent/process_launcher.h"

namespace mesh::agent {

// Bytes of a rank's log that ExitDetail needs: the loader's message is the
// last thing a program that failed to start writes.
inline constexpr int64_t kExitDetailLogBytes = 4096;
// Longest detail ExitDetail returns, in bytes.
inline constexpr size_t kMaxExitDetailBytes = 512;

// The last min(max_bytes, size) bytes of the regular file at `path`; ""
// when it cannot be opened or read, or when max_bytes <= 0. Reads at most
// `max_bytes`, however large the file.
std::string ReadLogTail(const std::string& path, int64_t max_bytes = kExitDetailLogBytes);

// One line explaining `exit`, given the end of its log ("" when there is
// nothing to say):
//   - exit code 127 and a loader line in the log: the loader's message from
//     "error while loading shared libraries: " on, e.g. "error while loading
//     shared libraries: libfoo.so.1: cannot open shared object file: No such
//     file or directory" (the last such line);
//   - exit code 127 otherwise: "last log line: " and the last non-blank
//     line, e.g. "last log line: sh: 1: trian.py: not found";
//   - every other status, or an empty log: "".
// The result is valid UTF-8 without control characters (terminal escape
// sequences are removed, other control bytes and invalid UTF-8 become '?';
// of a line rewritten with '\r', only what was written last counts) and at
// most kMaxExitDetailBytes long (cut at a character boundary, ending
// "..."), so it can go into a proto string field as it is.
std::string ExitDetail(const ExitInfo& exit, absl::string_view log_tail);

}  // namespace mesh::agent
