#include "cli/cluster_binaries.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace mesh::cli {

std::vector<std::string> BinaryCandidates(const std::string& name, const std::string& component_dir,
                                          const std::string& self_dir,
                                          const std::string& path_env) {
  std::vector<std::string> candidates;
  if (!self_dir.empty()) {
    candidates.push_back(absl::StrCat(self_dir, "/", name));
    candidates.push_back(
        std::filesystem::path(absl::StrCat(self_dir, "/../", component_dir, "/", name))
            .lexically_normal()
            .string());
  }
  for (absl::string_view dir : absl::StrSplit(path_env, ':', absl::SkipEmpty())) {
    candidates.push_back(absl::StrCat(dir, "/", name));
  }
  return candidates;
}

absl::StatusOr<std::string> FindBinary(const std::string& name, const std::string& flag_value,
                                       const std::string& flag_name,
                                       const std::vector<std::string>& candidates,
                                       absl::FunctionRef<bool(const std::string&)> is_executable) {
  if (!flag_value.empty()) {
    if (is_executable(flag_value)) return flag_value;
    return absl::NotFoundError(
        absl::StrCat(flag_name, " ", flag_value, ": not an executable file"));
  }
  for (const std::string& candidate : candidates) {
    if (is_executable(candidate)) return candidate;
  }
  // The first few places are the informative ones (next to meshctl, the
  // build tree); the rest of a long PATH is summarized.
  constexpr size_t kShown = 4;
  std::string places =
      candidates.empty()
          ? std::string("nowhere (executable dir unknown, PATH empty)")
          : absl::StrJoin(candidates.begin(),
                          candidates.begin() + std::min(kShown, candidates.size()), ", ");
  if (candidates.size() > kShown) {
    absl::StrAppend(&places, " and ", candidates.size() - kShown, " more PATH entries");
  }
  return absl::NotFoundError(absl::StrCat("cannot find ", name, "; looked in ", places,
                                          ". Build it (cmake --build build --target ", name,
                                          ") or pass ", flag_name, " PATH"));
}

std::string SelfExeDir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return exe.parent_path().string();
}

}  // namespace mesh::cli
