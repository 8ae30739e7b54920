#include "coordinator/rank_placement.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mesh::coordinator {
namespace {

int NodesMax(const JobRequest& job) { return job.nodes_max == 0 ? job.nodes_min : job.nodes_max; }

// Whether the groups along `dim` of a row-major layout of `shape` each lie
// on one node when node k holds ranks [k * nproc, (k + 1) * nproc). Ranks
// are contiguous per node, so a group is on one node exactly when its first
// and last member are.
bool DimIsNodeLocal(const std::vector<int64_t>& shape, int dim, int64_t nproc) {
  int64_t stride = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d) stride *= shape[d];
  int64_t world = 1;
  for (int64_t size : shape) world *= size;
  const int64_t span = (shape[dim] - 1) * stride;
  const int64_t block = stride * shape[dim];
  for (int64_t outer = 0; outer < world; outer += block) {
    for (int64_t first = outer; first < outer + stride; ++first) {
      if (first / nproc != (first + span) / nproc) return false;
    }
  }
  return true;
}

}  // namespace

const char* NodeStateName(NodeState state) {
  switch (state) {
    case NodeState::kReady:
      return "READY";
    case NodeState::kLost:
      return "LOST";
    case NodeState::kDraining:
      return "DRAINING";
  }
  return "UNKNOWN";
}

absl::Status ValidateJobRequest(const JobRequest& job) {
  if (job.job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  const std::string where = absl::StrCat("job ", job.job_id, ": ");
  if (job.nodes_min < 1) {
    return absl::InvalidArgumentError(absl::StrCat(where, "nodes_min ", job.nodes_min, " < 1"));
  }
  const int nodes_max = NodesMax(job);
  if (nodes_max < job.nodes_min) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "nodes_max ", nodes_max, " < nodes_min ", job.nodes_min));
  }
  if (job.nproc_per_node < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "nproc_per_node ", job.nproc_per_node, " < 1"));
  }
  if (job.gpus_per_proc < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "gpus_per_proc ", job.gpus_per_proc, " < 0"));
  }
  if (static_cast<int64_t>(nodes_max) * job.nproc_per_node > kMaxPlacementWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat(where, "nodes_max ", nodes_max,
                                                   " x nproc_per_node ", job.nproc_per_node,
                                                   " is over ", kMaxPlacementWorldSize, " ranks"));
  }
  if (static_cast<int64_t>(job.nproc_per_node) * job.gpus_per_proc > kMaxPlacementWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "gpus_per_proc ", job.gpus_per_proc, " x nproc_per_node is too large"));
  }
  if (!job.mesh_shape.empty()) {
    int64_t product = 1;
    for (int64_t size : job.mesh_shape) {
      if (size < 1 || size > kMaxPlacementWorldSize) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "mesh_shape [", absl::StrJoin(job.mesh_shape, ", "),
                         "] has a dim outside 1..", kMaxPlacementWorldSize));
      }
      product *= size;
      if (product > kMaxPlacementWorldSize) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "mesh_shape [", absl::StrJoin(job.mesh_shape, ", "), "] has over ",
                         kMaxPlacementWorldSize, " ranks"));
      }
    }
    if (product % job.nproc_per_node != 0 || product / job.nproc_per_node < job.nodes_min ||
        product / job.nproc_per_node > nodes_max) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "mesh_shape [", absl::StrJoin(job.mesh_shape, ", "), "] has ",
                       product, " ranks, which is not nproc_per_node ", job.nproc_per_node,
                       " x N for N in ", job.nodes_min, "..", nodes_max));
    }
  }
  if (!job.mesh_dim_names.empty()) {
    const size_t ndim = job.mesh_shape.empty() ? 1 : job.mesh_shape.size();
    if (job.mesh_dim_names.size() != ndim) {
      return absl::InvalidArgumentError(absl::StrCat(where, "mesh_dim_names has ",
                                                     job.mesh_dim_names.size(), " names for a ",
                                                     ndim, "-d mesh"));
    }
    std::set<std::string> seen;
    for (const std::string& name : job.mesh_dim_names) {
      if (name.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(where, "mesh_dim_names has an empty name"));
      }
      if (!seen.insert(name).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "mesh_dim_names has '", name, "' twice"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<int> AcceptableNodeCounts(const JobRequest& job) {
  if (!ValidateJobRequest(job).ok()) return {};
  if (!job.mesh_shape.empty()) {
    int64_t product = 1;
    for (int64_t size : job.mesh_shape) product *= size;
    return {static_cast<int>(product / job.nproc_per_node)};
  }
  std::vector<int> counts;
  for (int n = job.nodes_min; n <= NodesMax(job); ++n) counts.push_back(n);
  return counts;
}

absl::StatusOr<Placement> PlaceJob(const JobRequest& job, absl::Span<const NodeView> nodes) {
  if (absl::Status status = ValidateJobRequest(job); !status.ok()) return status;
  const std::string where = absl::StrCat("job ", job.job_id, ": ");
  const std::vector<int> counts = AcceptableNodeCounts(job);
  const int num_nodes = static_cast<int>(nodes.size());
  if (!std::binary_search(counts.begin(), counts.end(), num_nodes)) {
    return absl::InvalidArgumentError(absl::StrCat(where, num_nodes, " nodes given; the job takes ",
                                                   counts.front(), "..", counts.back()));
  }

  std::vector<const NodeView*> order;
  for (const NodeView& node : nodes) order.push_back(&node);
  std::sort(order.begin(), order.end(),
            [](const NodeView* a, const NodeView* b) { return a->name < b->name; });
  const int gpus_per_node = job.nproc_per_node * job.gpus_per_proc;
  for (size_t i = 0; i < order.size(); ++i) {
    const NodeView& node = *order[i];
    if (i > 0 && order[i - 1]->name == node.name) {
      return absl::InvalidArgumentError(absl::StrCat(where, "node '", node.name, "' given twice"));
    }
    if (node.state != NodeState::kReady) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "node '", node.name, "' is ", NodeStateName(node.state)));
    }
    if (node.slots < job.nproc_per_node) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "node '", node.name, "' has ", node.slots, " slots, not ", job.nproc_per_node));
    }
    if (static_cast<int>(node.gpus.size()) < gpus_per_node) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "node '", node.name, "' has ", node.gpus.size(), " GPUs, not ", gpus_per_node));
    }
  }

  Placement placement;
  placement.job_id = job.job_id;
  placement.nproc_per_node = job.nproc_per_node;
  placement.world_size = num_nodes * job.nproc_per_node;
  placement.mesh_shape = job.mesh_shape;
  if (placement.mesh_shape.empty()) placement.mesh_shape = {placement.world_size};
  placement.mesh_dim_names = job.mesh_dim_names;
  if (placement.mesh_dim_names.empty()) {
    for (size_t d = 0; d < placement.mesh_shape.size(); ++d) {
      placement.mesh_dim_names.push_back(absl::StrCat("dim", d));
    }
  }
  placement.ranks.reserve(placement.world_size);
  for (int node_rank = 0; node_rank < num_nodes; ++node_rank) {
    const NodeView& node = *order[node_rank];
    placement.nodes.push_back(node.name);
    placement.node_addresses.push_back(node.address);
    std::vector<int> gpus = node.gpus;
    std::sort(gpus.begin(), gpus.end());
    if (std::adjacent_find(gpus.begin(), gpus.end()) != gpus.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "node '", node.name, "' lists a GPU index twice"));
    }
    for (int local = 0; local < job.nproc_per_node; ++local) {
      RankPlacement rank;
      rank.rank = node_rank * job.nproc_per_node + local;
      rank.node = node.name;
      rank.node_rank = node_rank;
      rank.local_rank = local;
      rank.local_world_size = job.nproc_per_node;
      rank.gpus.assign(gpus.begin() + local * job.gpus_per_proc,
                       gpus.begin() + (local + 1) * job.gpus_per_proc);
      placement.ranks.push_back(std::move(rank));
    }
  }

  const std::vector<int64_t>& shape = placement.mesh_shape;
  const int ndim = static_cast<int>(shape.size());
  while (placement.node_local_dims < ndim &&
         DimIsNodeLocal(shape, ndim - 1 - placement.node_local_dims, job.nproc_per_node)) {
    ++placement.node_local_dims;
  }
  // A multiple of nproc_per_node spans whole nodes, which is the best such a
  // dim can do, so only the uneven case warns.
  const int64_t inner = shape.back();
  if (placement.node_local_dims == 0 && inner % job.nproc_per_node != 0) {
    // Innermost groups are runs of `inner` consecutive ranks; find the first
    // run that crosses a node boundary.
    for (int64_t first = 0; first < placement.world_size; first += inner) {
      const int64_t last = first + inner - 1;
      const int first_node = static_cast<int>(first / job.nproc_per_node);
      const int last_node = static_cast<int>(last / job.nproc_per_node);
      if (first_node == last_node) continue;
      placement.topology_warning = absl::StrCat(
          "mesh dim '", placement.mesh_dim_names.back(), "' (size ", inner,
          ") neither divides nor is a multiple of nproc_per_node ", job.nproc_per_node,
          ", so its groups straddle nodes unevenly: ranks ", first, "..", last, " span nodes ",
          placement.nodes[first_node], "..", placement.nodes[last_node],
          "; make the innermost dim a divisor of nproc_per_node to keep its groups on one node");
      break;
    }
  }
  return placement;
}

std::string EncodePlacement(const Placement& placement) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankPlacement& r : placement.ranks) {
    ranks.push_back({{"node_rank", r.node_rank}, {"local_rank", r.local_rank}, {"gpus", r.gpus}});
  }
  const nlohmann::json json = {
      {"version", 1},
      {"job_id", placement.job_id},
      {"nodes", placement.nodes},
      {"node_addresses", placement.node_addresses},
      {"nproc_per_node", placement.nproc_per_node},
      {"world_size", placement.world_size},
      {"mesh_shape", placement.mesh_shape},
      {"mesh_dim_names", placement.mesh_dim_names},
      {"node_local_dims", placement.node_local_dims},
      {"topology_warning", placement.topology_warning},
      {"ranks", ranks},
  };
  return json.dump();
}

absl::StatusOr<Placement> DecodePlacement(const std::string& bytes) {
  Placement p;
  try {
    const nlohmann::json json = nlohmann::json::parse(bytes);
    if (json.at("version").get<int>() != 1) {
      return absl::DataLossError(
          absl::StrCat("placement: unknown version ", json.at("version").dump()));
    }
    p.job_id = json.at("job_id").get<std::string>();
    p.nodes = json.at("nodes").get<std::vector<std::string>>();
    p.node_addresses = json.at("node_addresses").get<std::vector<std::string>>();
    p.nproc_per_node = json.at("nproc_per_node").get<int>();
    p.world_size = json.at("world_size").get<int>();
    p.mesh_shape = json.at("mesh_shape").get<std::vector<int64_t>>();
    p.mesh_dim_names = json.at("mesh_dim_names").get<std::vector<std::string>>();
    p.node_local_dims = json.at("node_local_dims").get<int>();
    p.topology_warning = json.at("topology_warning").get<std::string>();
    const nlohmann::json& ranks = json.at("ranks");
    for (size_t i = 0; i < ranks.size(); ++i) {
      RankPlacement r;
      r.rank = static_cast<int>(i);
      r.node_rank = ranks[i].at("node_rank").get<int>();
      r.local_rank = ranks[i].at("local_rank").get<int>();
      r.gpus = ranks[i].at("gpus").get<std::vector<int>>();
      if (r.node_rank < 0 || r.node_rank >= static_cast<int>(p.nodes.size())) {
        return absl::DataLossError(absl::StrCat("placement of ", p.job_id, ": rank ", i,
                                                " has node_rank ", r.node_rank, " of ",
                                                p.nodes.size(), " nodes"));
      }
      r.node = p.nodes[r.node_rank];
      r.local_world_size = p.nproc_per_node;
      p.ranks.push_back(std::move(r));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat("placement: malformed: ", e.what()));
  }
  if (p.node_addresses.size() != p.nodes.size() ||
      static_cast<int>(p.ranks.size()) != p.world_size) {
    return absl::DataLossError(absl::StrCat("placement of ", p.job_id, ": ", p.nodes.size(),
                                            " nodes, ", p.node_addresses.size(), " addresses, ",
                                            p.ranks.size(), " ranks for world ", p.world_size));
  }
  return p;
}

}  // namespace mesh::coordinator
