// Where a job's files live under the agent's work directory:
//
//   <work_dir>/jobs/<job>/gen-<g>/             a generation's directory (and
//                                              its workers' default cwd)
//   <work_dir>/jobs/<job>/gen-<g>/rank-<r>.log a rank's stdout and stderr
//
// Job ids come from the wire and become path components, so callers check
// them with IsSafeJobId first. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace mesh::agent {

// Whether `id` is safe as one path component: [A-Za-z0-9._-]{1,128}, and
// not "." or "..". The coordinator allows no other ids; the agent checks
// again rather than trust a path component from the wire.
bool IsSafeJobId(const std::string& id);

std::string GenerationDir(const std::string& work_dir, const std::string& job_id,
                          int64_t generation);
std::string RankLogPath(const std::string& work_dir, const std::string& job_id, int64_t generation,
                        int rank);

}  // namespace mesh::agent
