// DistributeTensor: a DTensor from a full tensor that every rank holds
// (src_rank -1: each rank cuts out its own block, no communication) or that
// one rank holds (a tree of broadcasts and one-sender all_to_alls over the
// mesh dims, described below). Partial dims are applied at the end
// (plan_steps.h, ApplyPartials).
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mesh/dtensor.h"
#include "sharding/dtensor_internal.h"
#include "sharding/exchange.h"
#include "sharding/plan_steps.h"
#include "sharding/status_macros.h"
#include "sharding/strided_copy.h"
#include "sharding/tensor_views.h"

namespace mesh {

namespace {

using sharding::ApplyPartials;
using sharding::Box;
using sharding::BroadcastInts;
using sharding::CheckDTypeForPlacements;
using sharding::CopyOf;
using sharding::Finish;
using sharding::GroupDevice;
using sharding::NarrowTo;
using sharding::Product;
using sharding::SubBuffer;

// The rank's index in the mesh in row-major coordinate order.
int64_t MeshRank(const DeviceMesh& mesh) {
  int64_t r = 0;
  for (int i = 0; i < mesh.ndim(); ++i) r = r * mesh.Size(i) + mesh.GetCoordinate()[i];
  return r;
}

}  // namespace

absl::StatusOr<DTensor> DistributeTensor(const Tensor& global, const DeviceMesh& mesh,
                                         Placements placements, DistributeOptions options) {
  const int src = options.src_rank;
  if (src < -1 || src >= mesh.size()) {
    return absl::InvalidArgumentError(absl::StrCat("DistributeTensor: src_rank ", src,
                                                   " is outside the mesh of ", mesh.size(),
                                                   " ranks (or -1)"));
  }
  if (static_cast<int>(placements.size()) != mesh.ndim()) {
    return absl::InvalidArgumentError(absl::StrCat("DistributeTensor: ", placements.size(),
                                                   " placements for a mesh of ", mesh.ndim(),
                                                   " dims"));
  }
  const std::vector<int64_t>& coordinate = mesh.GetCoordinate();
  if (src == -1) {
    DT_RETURN_IF_ERROR(ValidatePlacements(placements, mesh.shape(), global.dim()));
    if (!global.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DistributeTensor: the global tensor must be contiguous: ", global.DebugString()));
    }
    DT_RETURN_IF_ERROR(CheckDTypeForPlacements(placements, global.dtype()));
    DimVector shape(global.shape().begin(), global.shape().end());
    DT_ASSIGN_OR_RETURN(LocalLayout layout,
                        ComputeLocalLayout(shape, mesh.shape(), placements, coordinate));
    DT_ASSIGN_OR_RETURN(Tensor box, Box(global, layout.offset, layout.shape));
    DT_ASSIGN_OR_RETURN(Tensor local, CopyOf(box));
    DT_ASSIGN_OR_RETURN(local, ApplyPartials(mesh, placements, std::move(local)));
    return MakeDTensor(mesh, std::move(placements), std::move(shape), std::move(local));
  }

  // From one source: a tree over the mesh dims. Source coordinate s; before
  // step i, the ranks whose coordinates after i equal s's hold the block
  // that the placements of mesh dims < i give them. Step i passes it along
  // dim i: a Shard dim sends each peer only its chunk (an all_to_all in
  // which only the holder sends), a Replicate or Partial dim broadcasts it.
  // A rank thus receives just what it and the ranks below it in the tree
  // need, each byte once. Partial dims travel as Replicate and are applied
  // at the end (Partial(sum) zeroes the value off coordinate 0).
  std::vector<int64_t> src_coord(static_cast<size_t>(mesh.ndim()));
  {
    int64_t r = src;
    for (int i = mesh.ndim() - 1; i >= 0; --i) {
      src_coord[i] = r % mesh.Size(i);
      r /= mesh.Size(i);
    }
  }
  const bool is_src = MeshRank(mesh) == src;
  const Device device = is_src ? global.device() : GroupDevice(mesh);
  const bool cuda = device.is_cuda();
  // Metadata header from the source: [status, dtype, rank, sizes...].
  constexpr int64_t kMaxDims = 32;
  std::vector<int64_t> header(static_cast<size_t>(3 + kMaxDims), 0);
  std::string src_error;
  if (is_src) {
    if (global.dim() > kMaxDims) {
      src_error = absl::StrCat("more than ", kMaxDims, " dims");
    } else if (!global.is_contiguous()) {
      src_error = absl::StrCat("the global tensor must be contiguous: ", global.DebugString());
    } else if (absl::Status s = ValidatePlacements(placements, mesh.shape(), global.dim());
               !s.ok()) {
      src_error = std::string(s.message());
    } else if (absl::Status s2 = CheckDTypeForPlacements(placements, global.dtype()); !s2.ok()) {
      src_error = std::string(s2.message());
    }
    header[0] = src_error.empty() ? 0 : 1;
    header[1] = static_cast<int64_t>(global.dtype());
    header[2] = global.dim();
    for (int d = 0; d < global.dim() && d < kMaxDims; ++d) header[3 + d] = global.size(d);
  }
  // Which steps this rank takes part in: step i needs coordinate[j] ==
  // src_coord[j] for every j > i (the same for every member of the group).
  auto joins = [&](int i) {
    for (int j = i + 1; j < mesh.ndim(); ++j) {
      if (coordinate[j] != src_coord[j]) return false;
    }
    return true;
  };
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (!joins(i)) continue;
    DT_ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> group, mesh.GetGroup(i));
    DT_ASSIGN_OR_RETURN(header, BroadcastInts(*group, header, static_cast<int>(src_coord[i]),
                                              device, options.timeout));
  }
  if (header[0] != 0) {
    return absl::InvalidArgumentError(absl::StrCat("DistributeTensor: the source (mesh rank ", src,
                                                   ") rejected its global tensor",
                                                   src_error.empty() ? "" : ": ", src_error));
  }
  const DType dtype = static_cast<DType>(header[1]);
  DimVector shape(header.begin() + 3, header.begin() + 3 + header[2]);
  if (!is_src) {
    DT_RETURN_IF_ERROR(
        ValidatePlacements(placements, mesh.shape(), static_cast<int>(shape.size())));
  }
  // The block a rank holds after step i - 1 (placements of dims >= i as
  // Replicate).
  auto block_after = [&](int i, std::vector<int64_t> coord) -> absl::StatusOr<LocalLayout> {
    Placements partial(placements.begin(), placements.end());
    for (int j = i; j < mesh.ndim(); ++j) partial[j] = Placement::Replicate();
    for (int j = 0; j < i; ++j) {
      if (partial[j].is_partial()) partial[j] = Placement::Replicate();
    }
    for (int j = i; j < mesh.ndim(); ++j) coord[j] = 0;
    return ComputeLocalLayout(shape, mesh.shape(), partial, coord);
  };
  Tensor held;
  if (is_src) held = global;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (!joins(i)) continue;
    DT_ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> group, mesh.GetGroup(i));
    const int holder = static_cast<int>(src_coord[i]);
    const int me = group->rank();
    DT_ASSIGN_OR_RETURN(LocalLayout parent, block_after(i, coordinate));
    const int64_t k = group->size();
    if (placements[i].is_shard()) {
      const int d = placements[i].dim();
      std::vector<LocalLayout> peers;
      std::vector<int64_t> coord = coordinate;
      for (int64_t j = 0; j < k; ++j) {
        coord[i] = j;
        DT_ASSIGN_OR_RETURN(LocalLayout l, block_after(i + 1, coord));
        peers.push_back(std::move(l));
      }
      std::vector<int64_t> counts;
      int64_t total = 0;
      for (const LocalLayout& p : peers) {
        counts.push_back(Product(p.shape));
        total += counts.back();
      }
      DT_ASSIGN_OR_RETURN(Tensor mine, Tensor::Empty(dtype, peers[me].shape, device));
      if (total > 0) {
        std::vector<int64_t> in_splits(static_cast<size_t>(k), 0);
        std::vector<int64_t> out_splits(static_cast<size_t>(k), 0);
        out_splits[holder] = counts[me];
        Tensor send;
        if (me == holder) {
          in_splits = counts;
          DT_ASSIGN_OR_RETURN(send, Tensor::Empty(dtype, {total}, device));
          int64_t offset = 0;
          for (int64_t j = 0; j < k; ++j) {
            const LocalLayout& p = peers[static_cast<size_t>(j)];
            DT_ASSIGN_OR_RETURN(Tensor piece, NarrowTo(held, d, p, parent));
            DT_RETURN_IF_ERROR(sharding::CopyStrided(SubBuffer(send, offset, p.shape), piece));
            offset += counts[static_cast<size_t>(j)];
          }
        } else {
          DT_ASSIGN_OR_RETURN(send, Tensor::Empty(dtype, {0}, device));
        }
        DT_RETURN_IF_ERROR(
            Finish(group->AllToAll(SubBuffer(send, 0, {me == holder ? total : 0}),
                                   SubBuffer(mine, 0, {counts[me]}), in_splits, out_splits),
                   *group, options.timeout, cuda));
      }
      held = mine;
    } else {
      if (me != holder) {
        DT_ASSIGN_OR_RETURN(held, Tensor::Empty(dtype, parent.shape, device));
      } else if (held.data() == global.data()) {
        // Never write into the caller's tensor: broadcast from a copy.
        DT_ASSIGN_OR_RETURN(held, CopyOf(held));
      }
      if (held.numel() > 0) {
        DT_RETURN_IF_ERROR(Finish(group->Broadcast(SubBuffer(held, 0, {held.numel()}), holder),
                                  *group, options.timeout, cuda));
      }
    }
  }
  if (held.data() == global.data() && is_src) {
    DT_ASSIGN_OR_RETURN(held, CopyOf(held));
  }
  DT_ASSIGN_OR_RETURN(held, ApplyPartials(mesh, placements, std::move(held)));
  return MakeDTensor(mesh, std::move(placements), std::move(shape), std::move(held));
}

}  // namespace mesh
