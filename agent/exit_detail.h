// What a worker's exit means beyond its status, from the end of its log:
// for exit code 127 the dynamic loader's "error while loading shared
// libraries" message (a library missing on the node), or the last line the
// worker wrote (a shell's "command not found"). The agent sends it as
// ReportWorkerExitRequest.detail; the coordinator appends it to the root
// cause.
//
// Thread safety: pure functions (ReadLogTail reads a file).
#pragma once

#include <cstdint>
#include <string>

#include "agent/process_launcher.h"

namespace mesh::agent {

// The last `max_bytes` of the file at `path` ("" when it cannot be read).
std::string ReadLogTail(const std::string& path, int64_t max_bytes = 4096);

// The detail of `exit` given the end of its log; "" when there is none
// (every status but exit code 127, for now). At most 512 bytes.
std::string ExitDetail(const ExitInfo& exit, const std::string& log_tail);

}  // namespace mesh::agent
