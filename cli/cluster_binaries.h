// Where `meshctl cluster up` finds mesh-coordinator and mesh-agent: next to
// meshctl, in the CMake build tree, then on PATH, unless a flag names the
// binary. Pure apart from SelfExeDir, with an injectable "is executable"
// test, so that tests need no real files.
#pragma once

#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace mesh::cli {

inline constexpr const char* kCoordinatorBinary = "mesh-coordinator";
inline constexpr const char* kAgentBinary = "mesh-agent";

// Where to look for `name` (e.g. "mesh-agent"), in order:
//   1. `self_dir/name`: installed side by side with meshctl;
//   2. `self_dir/../component_dir/name`: the CMake build tree, where meshctl
//      is build/cli/meshctl and the others build/coordinator/mesh-coordinator
//      and build/agent/mesh-agent;
//   3. each directory of `path_env` (empty entries are skipped).
// `self_dir` empty (unknown) skips 1 and 2.
std::vector<std::string> BinaryCandidates(const std::string& name, const std::string& component_dir,
                                          const std::string& self_dir, const std::string& path_env);

// `flag_value` when non-empty (it must then be executable: no fallback, so a
// typo is not silently replaced by another binary), else the first
// executable candidate.
// Possible errors: NOT_FOUND naming the flag value, or every place looked
// in and the flag that overrides them (`flag_name`).
absl::StatusOr<std::string> FindBinary(const std::string& name, const std::string& flag_value,
                                       const std::string& flag_name,
                                       const std::vector<std::string>& candidates,
                                       absl::FunctionRef<bool(const std::string&)> is_executable);

// Directory of the running executable (/proc/self/exe); empty if unknown.
std::string SelfExeDir();

}  // namespace mesh::cli
