// Which environment variables a job may set for its workers.
//
// One rule for both ends: the coordinator applies it when it validates a job
// spec, and the agent applies it again when it builds a worker's
// environment, so a spec the coordinator accepts is never refused at launch.
//
// Thread safety: pure functions.
#pragma once

#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mesh {

// Why `name` may not be set by a job ("" when it may):
//   - a malformed name: empty, or containing '=' or NUL;
//   - denied: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, BASH_ENV, ENV, which
//     make the worker run code its argv does not name, unless the operator
//     lists it in `allowed` (--allow-job-env of the coordinator, which
//     validates specs, and of the agent, which checks them again);
//   - reserved: a name the agent sets for every rank (IsAgentSetEnvName),
//     whatever `allowed` says.
std::string WorkerEnvNameProblem(absl::string_view name, const std::set<std::string>& allowed = {});

// True for the denied names above (the only ones an operator may allow).
bool IsDeniedEnvName(absl::string_view name);

// Checks an operator's --allow-job-env list (mesh-coordinator, mesh-agent):
// only denied names may be listed. A malformed name (empty, or with '=',
// NUL, space or tab) or a reserved one, which can never be allowed, is an
// error, and so is any other name, which needs no allowing (most likely a
// typo). Possible errors: INVALID_ARGUMENT "--allow-job-env: \"NAME\" ..."
// naming the first such entry in byte order and why.
absl::Status CheckAllowedJobEnv(const std::set<std::string>& allowed);

// True for the names the agent sets for every rank: MESH_*, the torchrun
// contract (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR,
// MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
// TORCHELASTIC_RUN_ID) and CUDA_VISIBLE_DEVICES (a GPU job's GPUs; empty for
// a CPU job, so it cannot touch GPUs given to other jobs).
bool IsAgentSetEnvName(absl::string_view name);

}  // namespace mesh
