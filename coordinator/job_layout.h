// JobLayout: the shape a job is created with — its world size and device
// mesh — and the rules that make one valid.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace mesh::coordinator {

// The largest world a job may have.
inline constexpr int kMaxWorldSize = 1 << 20;

// The layout a job is created with.
struct JobLayout {
  // Empty lets CreateJob pick "adhoc-<n>" (submitted jobs are "job-<n>",
  // named by the job store). [A-Za-z0-9._-]{1,128}.
  std::string job_id;
  int world_size = 0;
  // Outermost first; empty means {world_size}.
  std::vector<int64_t> mesh_shape;
  // One unique non-empty name per dim; empty means "dim0", "dim1", ...
  std::vector<std::string> mesh_dim_names;
  // How long a rank may wait in a collective that another member of its
  // group has not entered before the generation fails as hung
  // (hang_detector.h); > 0.
  absl::Duration hang_timeout = absl::Minutes(5);
  // In-place recovery (docs/elastic.md): once the world has formed, a rank
  // that dies does not fail the generation. It leaves the membership, which
  // moves to its next epoch, and the others carry on; a new process may
  // join as that rank again later. False: any death fails the generation.
  bool in_place = false;
  // With in_place: the mesh dimension whose replicas the survivors may
  // drop (JobSpec.in_place_dim), handed to every rank in its Join reply;
  // empty: not named.
  std::string in_place_dim;
};

// Whether `id` is 1..128 characters of [A-Za-z0-9._-].
bool IsValidJobId(const std::string& id);

// Checks `layout` and fills in its defaults: the shape {world_size} and the
// names "dim0", "dim1", ... The job id is not checked (an empty one is
// picked by the owner). Errors: INVALID_ARGUMENT naming the bad field; the
// layout may be partly filled in then.
absl::Status NormalizeJobLayout(JobLayout& layout);

}  // namespace mesh::coordinator
