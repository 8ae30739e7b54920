// Rank placement: which node runs which rank of a job, and which GPUs each rank
// gets. Pure functions over plain values; the scheduler (scheduler.h) picks
// the nodes, PlaceJob lays the ranks out on them.
//
// The rules (docs/scheduling.md draws them):
//
//  - Nodes are ordered by name (byte-wise). A node's name is its identity in
//    the coordinator's records, so the order is the same after a coordinator
//    restart or an agent reconnect, whatever order the agents register in.
//  - Ranks are contiguous per node: node_rank k holds ranks
//    [k * nproc_per_node, (k + 1) * nproc_per_node), local_rank = rank -
//    k * nproc_per_node.
//  - The mesh lays ranks out row-major, last dim innermost (as MeshLayout
//    does), so the innermost dim's groups are runs of consecutive ranks:
//      * its size divides nproc_per_node: every group lies on one node;
//      * it is a multiple of nproc_per_node: each group spans whole,
//        consecutive nodes, and no node holds parts of two groups;
//      * neither: ranks stay contiguous, some groups straddle a node
//        boundary, and Placement::topology_warning names the first one.
//    For mesh (2, 4) on 2 nodes x 4 procs, the tp groups {0..3} and {4..7}
//    lie on node 0 and node 1, and the dp groups {0,4} ... {3,7} span both.
//  - GPUs: local_rank l gets the node's free GPU indices, sorted ascending,
//    at positions [l * gpus_per_proc, (l + 1) * gpus_per_proc).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mesh::coordinator {

// Node lifecycle as the scheduler sees it: only READY nodes take new jobs.
//
//   READY ──missed heartbeats──▶ LOST ──re-registers──▶ READY
//     └────drain──▶ DRAINING ──undrain──▶ READY
enum class NodeState { kReady, kLost, kDraining };

const char* NodeStateName(NodeState state);  // "READY", "LOST", "DRAINING"

// A node as the scheduler sees it. `slots` and `gpus` are what the node
// offers to jobs other than the running allocations handed to the scheduler
// along with it: pass the registered capacity together with the running
// allocations, or the remaining capacity with none (both give the same
// result).
struct NodeView {
  std::string name;       // Unique; the sort key.
  std::string address;    // Host or IP the workers of rank 0 are reached at.
  int slots = 0;          // CPU slots; each process takes one.
  std::vector<int> gpus;  // GPU indices, any order, distinct.
  NodeState state = NodeState::kReady;
};

// A job as the scheduler sees it.
struct JobRequest {
  std::string job_id;
  // Submission order: smaller first; ties (which the coordinator should not
  // produce) are broken by job_id.
  int64_t sequence = 0;
  // Gang size: the job runs on N nodes, nodes_min <= N <= nodes_max, all at
  // once or not at all. nodes_max 0 means nodes_min.
  int nodes_min = 1;
  int nodes_max = 0;
  int nproc_per_node = 1;
  int gpus_per_proc = 0;  // 0: a CPU job.
  // Outermost first; empty means 1-D over the whole world. A non-empty shape
  // fixes the world size, so it admits only N = product / nproc_per_node.
  std::vector<int64_t> mesh_shape;
  // Empty means "dim0", "dim1", ...
  std::vector<std::string> mesh_dim_names;
};

// One rank of a placed job.
struct RankPlacement {
  int rank = 0;
  std::string node;   // Node name.
  int node_rank = 0;  // Index of `node` in Placement::nodes.
  int local_rank = 0;
  int local_world_size = 0;
  std::vector<int> gpus;  // Ascending; empty for a CPU job.

  friend bool operator==(const RankPlacement&, const RankPlacement&) = default;
};

struct Placement {
  std::string job_id;
  // Chosen nodes in rank order (node_rank 0 first), with their addresses.
  std::vector<std::string> nodes;
  std::vector<std::string> node_addresses;
  int nproc_per_node = 0;
  int world_size = 0;
  // Normalized: the 1-D default and "dimN" names filled in.
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_dim_names;
  // ranks[r].rank == r.
  std::vector<RankPlacement> ranks;
  // How many of the innermost mesh dims have every group on one node (0 when
  // not even the innermost does): 1 for (2, 4) on 2 x 4, 2 for (2, 2, 2).
  int node_local_dims = 0;
  // Empty, or why the innermost dim's groups straddle nodes unevenly.
  std::string topology_warning;

  friend bool operator==(const Placement&, const Placement&) = default;
};

// The largest world a job may have (as JobLayout's kMaxWorldSize).
inline constexpr int kMaxPlacementWorldSize = 1 << 20;

// Checks a request on its own, without looking at nodes.
// Possible errors (INVALID_ARGUMENT, naming the field): an empty job_id;
// nodes_min < 1; nodes_max below nodes_min; nproc_per_node < 1;
// gpus_per_proc < 0; a world over kMaxPlacementWorldSize; a mesh dim < 1;
// dim names that do not match the shape, are empty or repeat; a mesh shape
// whose product is no N * nproc_per_node with N in [nodes_min, nodes_max].
absl::Status ValidateJobRequest(const JobRequest& job);

// The node counts `job` accepts, ascending. Empty when the request is
// invalid.
std::vector<int> AcceptableNodeCounts(const JobRequest& job);

// Lays `job` out on `nodes` (any order; PlaceJob sorts them by name).
// Possible errors (INVALID_ARGUMENT): those of ValidateJobRequest; a node
// count `job` does not accept; two nodes with one name; a node that is not
// READY, has fewer than nproc_per_node slots, or fewer than
// nproc_per_node * gpus_per_proc GPUs.
absl::StatusOr<Placement> PlaceJob(const JobRequest& job, absl::Span<const NodeView> nodes);

// A placement as bytes for the job store (JSON), and back. DecodePlacement
// accepts exactly what EncodePlacement writes. Possible errors of Decode:
// DATA_LOSS naming what is malformed or inconsistent (ranks out of order, a
// node_rank outside `nodes`).
std::string EncodePlacement(const Placement& placement);
absl::StatusOr<Placement> DecodePlacement(const std::string& bytes);

}  // namespace mesh::coordinator
