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
// Each other line is NAME=VALUE, taken literally: no quotes are removed, no
// variables are expanded, no escapes are read, and leading or trailing
// spaces of the value are kept (trailing '\r' of a CRLF file is dropped).
// The operator is trusted, so names a job may not set (LD_LIBRARY_PATH) are
// allowed here; names the agent sets for each rank (MESH_*, RANK,
// CUDA_VISIBLE_DEVICES, ...) are not, nor is a name given twice.
//
// Errors: INVALID_ARGUMENT naming the file, the line number and the problem;
// the errno of an unreadable file (NOT_FOUND, PERMISSION_DENIED, ...).
// Thread safety: pure functions.
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
