#include "common/worker_env_policy.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mesh {
namespace {

// Names the loader or a shell acts on before the program's own code runs:
// each makes the worker execute code that argv does not name. LD_PRELOAD and
// LD_AUDIT load arbitrary shared objects into every process (and every
// child), LD_LIBRARY_PATH substitutes the libraries argv[0] links (libc,
// libnccl), and BASH_ENV / ENV name a script that bash / sh run at start-up
// of any non-interactive shell a worker spawns. Mesh promises that a job
// runs its argv and nothing else; a user who needs a library path sets it in
// the image, the agent's environment, or a wrapper named in argv.
constexpr absl::string_view kDenied[] = {"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV",
                                         "ENV"};

// torchrun's worker contract (torch.distributed.elastic's local agent).
constexpr absl::string_view kTorchrun[] = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
};

}  // namespace

bool IsAgentSetEnvName(absl::string_view name) {
  if (absl::StartsWith(name, "MESH_") || name == "CUDA_VISIBLE_DEVICES") return true;
  for (absl::string_view reserved : kTorchrun) {
    if (name == reserved) return true;
  }
  return false;
}

bool IsDeniedEnvName(absl::string_view name) {
  for (absl::string_view denied : kDenied) {
    if (name == denied) return true;
  }
  return false;
}

absl::Status CheckAllowedJobEnv(const std::set<std::string>& allowed) {
  for (const std::string& name : allowed) {
    if (IsDeniedEnvName(name)) continue;
    std::string why;
    if (name.empty() || name.find_first_of(std::string("=\0 \t", 4)) != std::string::npos) {
      why = "is not a variable name";
    } else if (IsAgentSetEnvName(name)) {
      why = "is set by the agent for each rank and can never be allowed";
    } else {
      why = "is not refused by default, so there is nothing to allow";
    }
    return absl::InvalidArgumentError(
        absl::StrCat("--allow-job-env: \"", absl::CHexEscape(name), "\" ", why,
                     " (names refused by default: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, "
                     "BASH_ENV, ENV)"));
  }
  return absl::OkStatus();
}

std::string WorkerEnvNameProblem(absl::string_view name, const std::set<std::string>& allowed) {
  if (name.empty()) return "the name is empty";
  if (name.find('\0') != absl::string_view::npos) return "the name contains a NUL byte";
  if (name.find('=') != absl::string_view::npos) return "the name contains '='";
  if (IsDeniedEnvName(name) && allowed.count(std::string(name)) == 0) {
    return absl::StrCat(
        "denied: ", name,
        name == "BASH_ENV" || name == "ENV"
            ? " makes every shell the job starts run a script first"
            : " makes the dynamic loader run code that the job's command does not name",
        "; set it in the image or a wrapper program instead, or have the operator allow it "
        "(--allow-job-env of mesh-coordinator and mesh-agent)");
  }
  if (IsAgentSetEnvName(name))
    return absl::StrCat("reserved: the agent sets ", name, " for each rank");
  return "";
}

}  // namespace mesh
