// The operator's worker environment file (mesh-agent --worker-env-file):
// variables every worker on the node gets, such as NCCL_SOCKET_IFNAME,
// NCCL_IB_HCA, proxies, module paths or LD_LIBRARY_PATH for the node's CUDA
// installation.
//
//   # comment lines and blank lines are ignored
//   NCCL_SOCKET_IFNAME=eth0
//   LD_LIBRARY_PATH=/usr/local/cuda/lib64
//   HTTPS_PROXY=http://proxy:3128
//
// Contract:
//   - Lines are separated by '\n'; a trailing '\r' (CRLF files) is dropped.
//   - A line that is empty or all blanks, or whose first non-blank character
//     is '#', is ignored. A '#' after a value is part of the value.
//   - Every other line is NAME=VALUE, split at the first '='. Blanks before
//     NAME are ignored; NAME is [A-Za-z_][A-Za-z0-9_]* (so "NAME = v" and
//     "export NAME=v" are errors, not silently different names).
//   - VALUE is taken literally, to the end of the line: no quotes are
//     removed ("a b" keeps its quotes), no $VARIABLES or ~ are expanded, no
//     backslash escapes are read, and blanks around it are kept. It may be
//     empty and may contain '='.
//   - The operator is trusted, so names a job may not set by default
//     (LD_LIBRARY_PATH, LD_PRELOAD: common/worker_env_policy.h) are allowed
//     here. Names the agent sets for each rank (MESH_*, RANK,
//     CUDA_VISIBLE_DEVICES, ...) are errors, as is a name given twice.
//   - Order is kept. In a worker's environment these variables override the
//     agent's inherited base and are overridden by the job spec's env
//     (agent/worker_env.h).
//
// Errors: INVALID_ARGUMENT "FILE:LINE: problem" for the first bad line
// (1-based); reading: NOT_FOUND, PERMISSION_DENIED, or FAILED_PRECONDITION
// (not a regular file, over 1 MiB, another errno), each naming the file.
// Thread safety: pure functions (ReadWorkerEnvFile reads the file).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mesh::agent {

using EnvEntries = std::vector<std::pair<std::string, std::string>>;

// Parses the file's text; `source` names it in errors.
absl::StatusOr<EnvEntries> ParseWorkerEnvFile(absl::string_view text, absl::string_view source);

// Reads and parses `path`.
absl::StatusOr<EnvEntries> ReadWorkerEnvFile(const std::string& path);

}  // namespace mesh::agent
