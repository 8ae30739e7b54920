// DTensor's methods, MakeDTensor (the one way to build a DTensor) and
// Redistribute, which runs a cached plan's steps (plan_steps.h) in order.
// FromLocal checks the ranks' local shapes against each other with small
// metadata collectives (exchange.h).
#include "mesh/dtensor.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "metrics_hooks.h"
#include "sharding/dtensor_internal.h"
#include "sharding/exchange.h"
#include "sharding/plan_steps.h"
#include "sharding/status_macros.h"
#include "sharding/tensor_views.h"

namespace mesh {

namespace sharding {

absl::Status CheckDTypeForPlacements(absl::Span<const Placement> placements, DType dtype) {
  for (size_t i = 0; i < placements.size(); ++i) {
    const Placement& p = placements[i];
    if (!p.is_partial()) continue;
    if (p.op() == ReduceOp::kAvg && !IsFloatingPoint(dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("mesh dim ", i, ": Partial(avg) needs a ",
                                                     "floating dtype, not ", DTypeName(dtype)));
    }
    if (dtype == DType::kBool && p.op() != ReduceOp::kMin && p.op() != ReduceOp::kMax) {
      return absl::InvalidArgumentError(absl::StrCat("mesh dim ", i, ": ", p.ToString(),
                                                     " is not defined for bool (only min/max)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace sharding

namespace {

using sharding::AllGatherInts;
using sharding::CheckDTypeForPlacements;
using sharding::CopyOf;
using sharding::MeshMin;
using sharding::RunStep;
using sharding::ShapeStr;
using sharding::StepContext;

RedistributePlanCache& DefaultPlanCache() {
  static auto* cache = new RedistributePlanCache();
  return *cache;
}

// FNV-1a over the bytes: replicas must agree bit for bit.
int64_t HashBytes(const Tensor& contiguous_host) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(contiguous_host.data());
  for (size_t b = 0; b < contiguous_host.nbytes(); ++b) {
    h ^= p[b];
    h *= 1099511628211ull;
  }
  return static_cast<int64_t>(h);
}

// A mesh-wide error flag: (mesh dim, world rank) packed so that the minimum
// names the first mesh dim and its lowest rank. kNoError is the largest.
constexpr int64_t kNoError = std::numeric_limits<int64_t>::max();
int64_t ErrorCode(int mesh_dim, int world_rank) {
  return (static_cast<int64_t>(mesh_dim) << 32) | static_cast<int64_t>(world_rank);
}

// Infers the global shape from every rank's local shape: from the last mesh
// dim to the first, each Shard(d) dim's group gathers the extents the ranks
// hold so far; their sum is the extent one level up, and the sizes must be
// torch.chunk's of that sum. `error` gets the first problem this rank sees
// (communication goes on so that every rank makes the same calls).
absl::StatusOr<DimVector> InferGlobalShape(const Tensor& local, const DeviceMesh& mesh,
                                           absl::Span<const Placement> placements,
                                           std::string* error, int* error_dim) {
  DimVector extent(local.shape().begin(), local.shape().end());
  const int rank = local.dim();
  for (int i = mesh.ndim() - 1; i >= 0; --i) {
    if (!placements[i].is_shard()) continue;
    const int d = placements[i].dim();
    DT_ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> group, mesh.GetGroup(i));
    std::vector<int64_t> mine(extent.begin(), extent.end());
    DT_ASSIGN_OR_RETURN(std::vector<int64_t> all,
                        AllGatherInts(*group, mine, local.device(), absl::ZeroDuration()));
    const int64_t k = group->size();
    int64_t sum = 0;
    std::vector<int64_t> sizes;
    for (int64_t j = 0; j < k; ++j) {
      sizes.push_back(all[static_cast<size_t>(j * rank + d)]);
      sum += sizes.back();
    }
    if (error->empty()) {
      auto world = [&](int64_t j) { return group->global_ranks()[static_cast<size_t>(j)]; };
      for (int64_t j = 0; j < k && error->empty(); ++j) {
        for (int t = 0; t < rank; ++t) {
          if (t == d || all[static_cast<size_t>(j * rank + t)] == extent[t]) continue;
          *error = absl::StrCat("mesh dim ", i, " (", placements[i].ToString(), "): tensor dim ", t,
                                " has size ", extent[t], " on world rank ", world(group->rank()),
                                " but ", all[static_cast<size_t>(j * rank + t)], " on world rank ",
                                world(j));
          *error_dim = i;
          break;
        }
      }
      for (int64_t j = 0; j < k && error->empty(); ++j) {
        if (ChunkOf(sum, k, j).size != sizes[static_cast<size_t>(j)]) {
          *error = absl::StrCat("mesh dim ", i, " (", placements[i].ToString(), "): tensor dim ", d,
                                " sizes [", absl::StrJoin(sizes, ", "), "] along world ranks [",
                                absl::StrJoin(group->global_ranks(), ", "),
                                "] are not torch.chunk's split of ", sum, " in ", k);
          *error_dim = i;
        }
      }
    }
    extent[d] = sum;
  }
  return extent;
}

}  // namespace

// ---- DTensor. ----------------------------------------------------------------

DTensor::DTensor(DeviceMesh mesh, Placements placements, DimVector shape, LocalLayout layout,
                 Tensor local)
    : mesh_(std::move(mesh)),
      placements_(std::move(placements)),
      shape_(std::move(shape)),
      layout_(std::move(layout)),
      local_(std::move(local)) {}

absl::StatusOr<DTensor> MakeDTensor(DeviceMesh mesh, Placements placements, DimVector shape,
                                    Tensor local) {
  DT_RETURN_IF_ERROR(CheckDTypeForPlacements(placements, local.dtype()));
  DT_ASSIGN_OR_RETURN(LocalLayout layout,
                      ComputeLocalLayout(shape, mesh.shape(), placements, mesh.GetCoordinate()));
  if (layout.shape != DimVector(local.shape().begin(), local.shape().end())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local tensor ", local.ShapeString(), " on world rank ", mesh.rank(), " (coordinate ",
        ShapeStr(mesh.GetCoordinate()), ") does not match the layout ", ShapeStr(layout.shape),
        " of global shape ", ShapeStr(shape), " with placements ", PlacementsToString(placements),
        " on mesh ", ShapeStr(mesh.shape())));
  }
  if (!local.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the local tensor must be contiguous: ", local.DebugString()));
  }
  return DTensor(std::move(mesh), std::move(placements), std::move(shape), std::move(layout),
                 std::move(local));
}

absl::StatusOr<DTensor> DTensor::FromLocal(Tensor local, const DeviceMesh& mesh,
                                           Placements placements, FromLocalOptions options) {
  if (!local.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromLocal: the local tensor must be contiguous: ", local.DebugString()));
  }
  DT_RETURN_IF_ERROR(ValidatePlacements(placements, mesh.shape(), local.dim()));
  DT_RETURN_IF_ERROR(CheckDTypeForPlacements(placements, local.dtype()));
  const Device device = local.device();
  DimVector shape;
  // This rank's first problem; communication continues regardless so that
  // every rank makes the same collective calls, and then all agree.
  std::string error;
  int error_dim = 0;
  if (!options.global_shape.empty() || local.dim() == 0) {
    if (static_cast<int>(options.global_shape.size()) != local.dim()) {
      return absl::InvalidArgumentError(
          absl::StrCat("FromLocal: global shape ", ShapeStr(options.global_shape), " has ",
                       options.global_shape.size(), " dims but the local tensor ",
                       local.ShapeString(), " has ", local.dim()));
    }
    shape.assign(options.global_shape.begin(), options.global_shape.end());
  } else {
    DT_ASSIGN_OR_RETURN(shape, InferGlobalShape(local, mesh, placements, &error, &error_dim));
  }
  if (error.empty()) {
    absl::StatusOr<LocalLayout> layout =
        ComputeLocalLayout(shape, mesh.shape(), placements, mesh.GetCoordinate());
    if (!layout.ok()) {
      error = std::string(layout.status().message());
    } else if (layout->shape != DimVector(local.shape().begin(), local.shape().end())) {
      error =
          absl::StrCat("local tensor ", local.ShapeString(), " on world rank ", mesh.rank(),
                       " (coordinate ", ShapeStr(mesh.GetCoordinate()),
                       ") does not match the layout ", ShapeStr(layout->shape), " of global shape ",
                       ShapeStr(shape), " with placements ", PlacementsToString(placements));
    }
  }
  const bool collective = options.verify || options.global_shape.empty();
  if (collective) {
    // Agree on failure, so that no rank goes on to the verify collectives
    // (or returns success) while another has given up.
    const int64_t code = error.empty() ? kNoError : ErrorCode(error_dim, mesh.rank());
    DT_ASSIGN_OR_RETURN(int64_t first, MeshMin(mesh, code, device, absl::ZeroDuration()));
    if (first != kNoError && error.empty()) {
      error = absl::StrCat("world rank ", first & 0xffffffff,
                           " found local shapes that cannot form a global tensor (mesh dim ",
                           first >> 32, "; see its error)");
    }
  }
  if (!error.empty()) return absl::InvalidArgumentError(absl::StrCat("FromLocal: ", error));
  if (options.verify) {
    Tensor host = local;
    if (device.is_cuda()) {
      DT_ASSIGN_OR_RETURN(host, Tensor::Empty(local.dtype(), local.shape()));
      DT_RETURN_IF_ERROR(CopyTensor(host, local));
    }
    const int64_t hash = HashBytes(host);
    std::string mismatch;
    int64_t code = kNoError;
    for (int i = 0; i < mesh.ndim(); ++i) {
      if (!placements[i].is_replicate()) continue;
      DT_ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> group, mesh.GetGroup(i));
      DT_ASSIGN_OR_RETURN(std::vector<int64_t> hashes,
                          AllGatherInts(*group, {hash}, device, absl::ZeroDuration()));
      for (size_t j = 1; j < hashes.size() && mismatch.empty(); ++j) {
        if (hashes[j] == hashes[0]) continue;
        mismatch =
            absl::StrCat("mesh dim ", i, " (Replicate): world ranks ", group->global_ranks()[0],
                         " and ", group->global_ranks()[j], " hold different data");
        code = std::min(code, ErrorCode(i, group->global_ranks()[0]));
      }
    }
    DT_ASSIGN_OR_RETURN(int64_t first, MeshMin(mesh, code, device, absl::ZeroDuration()));
    if (first != kNoError) {
      if (mismatch.empty()) {
        mismatch =
            absl::StrCat("mesh dim ", first >> 32,
                         " (Replicate): replicas disagree (found in the group of world rank ",
                         first & 0xffffffff, ")");
      }
      return absl::FailedPreconditionError(absl::StrCat("FromLocal verify: ", mismatch));
    }
  }
  if (options.copy) {
    DT_ASSIGN_OR_RETURN(local, CopyOf(local));
  }
  return MakeDTensor(mesh, std::move(placements), std::move(shape), std::move(local));
}

absl::StatusOr<Tensor> DTensor::FullTensor(absl::Duration timeout) const {
  RedistributeOptions options;
  options.timeout = timeout;
  DT_ASSIGN_OR_RETURN(
      DTensor full,
      Redistribute(*this, Placements(static_cast<size_t>(mesh_.ndim()), Placement::Replicate()),
                   options));
  return full.local();
}

std::string DTensor::DebugString() const {
  return absl::StrCat("DTensor(shape=", ShapeStr(shape_),
                      ", placements=", PlacementsToString(placements_),
                      ", local=", local_.ShapeString(), ", ", DTypeName(local_.dtype()), ", ",
                      local_.device().ToString(), ")");
}

// ---- Redistribute. -----------------------------------------------------------

absl::StatusOr<DTensor> Redistribute(const DTensor& input, Placements placements,
                                     RedistributeOptions options) {
  RedistributePlanCache& cache = options.cache != nullptr ? *options.cache : DefaultPlanCache();
  DT_RETURN_IF_ERROR(CheckDTypeForPlacements(placements, input.dtype()));
  DT_ASSIGN_OR_RETURN(std::shared_ptr<const RedistributePlan> plan,
                      cache.Get(input.shape(), input.dtype(), input.mesh().shape(),
                                input.placements(), placements));
  Tensor local = input.local();
  if (plan->steps.empty()) {
    DT_ASSIGN_OR_RETURN(local, CopyOf(local));
  }
  for (const RedistributeStep& step : plan->steps) {
    StepContext context{input.mesh(), input.shape(), step, options.timeout};
    DT_ASSIGN_OR_RETURN(local, RunStep(context, local));
    internal::RecordRedistributeStep(step.op);
  }
  return MakeDTensor(input.mesh(), std::move(placements),
                     DimVector(input.shape().begin(), input.shape().end()), std::move(local));
}

}  // namespace mesh
