#include "agent/job_paths.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mesh::agent {

bool IsSafeJobId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id == "." || id == "..") return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

std::string GenerationDir(const std::string& work_dir, const std::string& job_id,
                          int64_t generation) {
  return absl::StrCat(work_dir, "/jobs/", job_id, "/gen-", generation);
}

std::string RankLogPath(const std::string& work_dir, const std::string& job_id, int64_t generation,
                        int rank) {
  return absl::StrCat(GenerationDir(work_dir, job_id, generation), "/rank-", rank, ".log");
}

}  // namespace mesh::agent
