// ServiceDiscovery: the scrape targets of a Mesh cluster, kept in a
// Prometheus file_sd JSON file (docs/metrics.md, "Service discovery").
//
// Target groups, one per target:
//   {"targets": ["host:port"], "labels": {"mesh_component": "coordinator"}}
//   {"targets": [...], "labels": {"mesh_component": "agent", "node": N}}
//   {"targets": [...], "labels": {"mesh_component": "worker", "node": N,
//                                 "mesh_job": J}}
// The JobManager feeds it (agents as they register or are lost, workers as
// they start and end); the server sets the coordinator's own target.
//
// Writing: mutations only change memory and bump a version; Flush() writes
// the file when the version moved since the last write, atomically (a
// temporary file in the same directory, then rename), so Prometheus never
// reads half a file. Callers flush after releasing their own locks, so no
// file I/O happens under the JobManager's mutex.
//
// Errors: Flush returns INTERNAL naming the path and errno when the file
// cannot be written (the next Flush tries again). With an empty path
// nothing is written (ToJson still works).
//
// Thread safety: thread-safe. Concurrent Flushes are serialized; the file
// always ends at the newest state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace mesh::coordinator {

class ServiceDiscovery {
 public:
  explicit ServiceDiscovery(std::string path);

  const std::string& path() const { return path_; }

  // The coordinator's own /metrics, "host:port"; empty: none.
  void SetCoordinator(const std::string& target);
  // The agent of `node` at "host:port"; replaces an earlier one.
  void SetAgent(const std::string& node, const std::string& target);
  // Forgets the agent of `node` and every worker on it (the node is lost).
  void RemoveNode(const std::string& node);
  // Rank `rank` of `job` on `node` serves at "host:port".
  void SetWorker(const std::string& job, int rank, const std::string& node,
                 const std::string& target);
  void RemoveWorker(const std::string& job, int rank);
  // Forgets every worker of `job` (it ended or restarts).
  void RemoveJob(const std::string& job);

  // The file's content: a JSON array of target groups, coordinator first,
  // then agents by node, then workers by (job, rank).
  std::string ToJson() const;

  // Writes the file if anything changed since the last successful write.
  absl::Status Flush();

  // "host:port" with brackets around an IPv6 literal host.
  static std::string Target(const std::string& host, int port);

 private:
  struct Worker {
    std::string node;
    std::string target;
  };

  const std::string path_;
  mutable absl::Mutex mu_;
  std::string coordinator_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> agents_ ABSL_GUARDED_BY(mu_);              // node → target
  std::map<std::pair<std::string, int>, Worker> workers_ ABSL_GUARDED_BY(mu_);  // (job, rank)
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;

  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  uint64_t written_ ABSL_GUARDED_BY(write_mu_) = 0;
};

}  // namespace mesh::coordinator
