#include "sharding/plan_steps.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "mesh/float16.h"
#include "mesh/process_group.h"
#include "sharding/exchange.h"
#include "sharding/status_macros.h"
#include "sharding/strided_copy.h"
#include "sharding/tensor_views.h"

namespace mesh::sharding {

namespace {

// ---- Layouts. --------------------------------------------------------------

// The layouts of every member of the calling rank's group along `mesh_dim`
// (index = coordinate along that dim).
absl::StatusOr<std::vector<LocalLayout>> PeerLayouts(const DeviceMesh& mesh,
                                                     absl::Span<const int64_t> shape,
                                                     absl::Span<const Placement> placements,
                                                     int mesh_dim) {
  std::vector<int64_t> coordinate = mesh.GetCoordinate();
  std::vector<LocalLayout> layouts;
  for (int64_t j = 0; j < mesh.Size(mesh_dim); ++j) {
    coordinate[mesh_dim] = j;
    DT_ASSIGN_OR_RETURN(LocalLayout layout,
                        ComputeLocalLayout(shape, mesh.shape(), placements, coordinate));
    layouts.push_back(std::move(layout));
  }
  return layouts;
}

// ---- Local reduction (uneven reduce_scatter on CPU). -----------------------

template <typename T, typename Acc>
void ReducePieces(void* out_raw, const void* in_raw, int64_t n, int64_t k, ReduceOp op) {
  auto* out = static_cast<T*>(out_raw);
  const auto* in = static_cast<const T*>(in_raw);
  for (int64_t e = 0; e < n; ++e) {
    Acc acc = static_cast<Acc>(in[e]);
    for (int64_t j = 1; j < k; ++j) {
      const Acc v = static_cast<Acc>(in[j * n + e]);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg:
          acc = static_cast<Acc>(acc + v);
          break;
        case ReduceOp::kProd:
          acc = static_cast<Acc>(acc * v);
          break;
        case ReduceOp::kMin:
          acc = std::min(acc, v);
          break;
        case ReduceOp::kMax:
          acc = std::max(acc, v);
          break;
      }
    }
    if (op == ReduceOp::kAvg) acc = static_cast<Acc>(acc / static_cast<Acc>(k));
    out[e] = static_cast<T>(acc);
  }
}

// out[e] = op over j of in[j * n + e]; in holds k pieces of n elements (CPU).
absl::Status ReduceLocal(const Tensor& out, const Tensor& in, int64_t k, ReduceOp op) {
  const int64_t n = out.numel();
  switch (out.dtype()) {
    case DType::kFloat32:
      ReducePieces<float, float>(out.data(), in.data(), n, k, op);
      break;
    case DType::kFloat64:
      ReducePieces<double, double>(out.data(), in.data(), n, k, op);
      break;
    case DType::kFloat16:
      ReducePieces<Float16, float>(out.data(), in.data(), n, k, op);
      break;
    case DType::kBFloat16:
      ReducePieces<BFloat16, float>(out.data(), in.data(), n, k, op);
      break;
    case DType::kInt8:
      ReducePieces<int8_t, int8_t>(out.data(), in.data(), n, k, op);
      break;
    case DType::kUInt8:
    case DType::kBool:  // Only min/max reach here (CheckDTypeForPlacements).
      ReducePieces<uint8_t, uint8_t>(out.data(), in.data(), n, k, op);
      break;
    case DType::kInt32:
      ReducePieces<int32_t, int32_t>(out.data(), in.data(), n, k, op);
      break;
    case DType::kInt64:
      ReducePieces<int64_t, int64_t>(out.data(), in.data(), n, k, op);
      break;
  }
  return absl::OkStatus();
}

// ---- One plan step. --------------------------------------------------------

// Shard(d) -> Replicate: every peer's block, exact sizes (AllGather when all
// equal, else AllToAll with the own block repeated to every peer).
absl::StatusOr<Tensor> RunAllGather(const StepContext& c, const Tensor& local,
                                    ProcessGroup& group) {
  const int i = c.step.mesh_dim;
  const int d = c.step.from.dim();
  const bool cuda = local.device().is_cuda();
  DT_ASSIGN_OR_RETURN(std::vector<LocalLayout> peers,
                      PeerLayouts(c.mesh, c.shape, c.step.before, i));
  DT_ASSIGN_OR_RETURN(LocalLayout after, ComputeLocalLayout(c.shape, c.mesh.shape(), c.step.after,
                                                            c.mesh.GetCoordinate()));
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(local.dtype(), after.shape, local.device()));
  const int64_t k = static_cast<int64_t>(peers.size());
  std::vector<int64_t> counts;
  bool even = true;
  int64_t total = 0;
  for (const LocalLayout& p : peers) {
    counts.push_back(Product(p.shape));
    total += counts.back();
    even = even && counts.back() == counts.front();
  }
  if (total == 0) return out;
  // Blocks concatenated in peer order are the output itself when nothing
  // precedes dim d.
  const bool direct = OuterSize(after.shape, d) == 1;
  if ((!direct || !even) && CpuOverTcp(group, cuda)) {
    // Each peer's block straight into (or unpacked into) its place, the own
    // block copied there directly: no gather buffer, no repeated input.
    const int me = group.rank();
    auto place = [&](int64_t j) {
      const LocalLayout& p = peers[static_cast<size_t>(j)];
      return NarrowTo(out, d, p, after);
    };
    PointToPoint p2p(group, c.timeout);
    for (int64_t step = 1; step < k; ++step) {
      const int64_t from = (me - step + k) % k;
      if (counts[static_cast<size_t>(from)] == 0) continue;
      DT_ASSIGN_OR_RETURN(Tensor dst, place(from));
      DT_RETURN_IF_ERROR(p2p.Recv(dst, static_cast<int>(from)));
    }
    if (local.numel() > 0) {
      for (int64_t step = 1; step < k; ++step) {
        DT_RETURN_IF_ERROR(p2p.Send(local, static_cast<int>((me + step) % k)));
      }
      DT_ASSIGN_OR_RETURN(Tensor own, place(me));
      DT_RETURN_IF_ERROR(CopyStrided(own, local));
    }
    DT_RETURN_IF_ERROR(p2p.Wait());
    return out;
  }
  Tensor recv = out;
  if (!direct) {
    DT_ASSIGN_OR_RETURN(recv, Tensor::Empty(local.dtype(), {total}, local.device()));
  }
  Tensor recv_flat = SubBuffer(recv, 0, {total});
  Tensor send_flat = SubBuffer(local, 0, {local.numel()});
  if (even) {
    DT_RETURN_IF_ERROR(Finish(group.AllGather(send_flat, recv_flat), group, c.timeout, cuda));
  } else {
    const int64_t own = local.numel();
    DT_ASSIGN_OR_RETURN(Tensor repeated, Tensor::Empty(local.dtype(), {own * k}, local.device()));
    for (int64_t j = 0; j < k; ++j) {
      DT_RETURN_IF_ERROR(CopyStrided(SubBuffer(repeated, j * own, {own}), send_flat));
    }
    DT_RETURN_IF_ERROR(
        Finish(group.AllToAll(repeated, recv_flat,
                              std::vector<int64_t>(static_cast<size_t>(k), own), counts),
               group, c.timeout, cuda));
  }
  if (!direct) {
    int64_t offset = 0;
    for (int64_t j = 0; j < k; ++j) {
      const LocalLayout& p = peers[static_cast<size_t>(j)];
      DT_ASSIGN_OR_RETURN(Tensor dst, NarrowTo(out, d, p, after));
      DT_RETURN_IF_ERROR(CopyStrided(dst, SubBuffer(recv, offset, p.shape)));
      offset += counts[static_cast<size_t>(j)];
    }
  }
  return out;
}

// Partial(op) -> Replicate: the group's out-of-place AllReduce, which reads
// the (immutable) input where it is and writes the result, so no copy of
// the input is made first: NCCL reduces from one buffer into the other, and
// Gloo over TCP runs a fused ring reduce-scatter + all-gather
// (backends/gloo/gloo_ring.h). NCCL needs contiguous tensors, so a strided
// CUDA input is copied and reduced in place.
absl::StatusOr<Tensor> RunAllReduce(const StepContext& c, const Tensor& local,
                                    ProcessGroup& group) {
  const bool cuda = local.device().is_cuda();
  if (cuda && !local.is_contiguous()) {
    DT_ASSIGN_OR_RETURN(Tensor out, CopyOf(local));
    if (out.numel() == 0) return out;
    DT_RETURN_IF_ERROR(Finish(group.AllReduce(out, c.step.from.op()), group, c.timeout, cuda));
    return out;
  }
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(local.dtype(), local.shape(), local.device()));
  if (out.numel() == 0) return out;
  DT_RETURN_IF_ERROR(Finish(group.AllReduce(local, out, c.step.from.op()), group, c.timeout, cuda));
  return out;
}

// Partial(op) -> Shard(d): the local (full along d) value cut into the k
// chunks in peer order, then reduced so that each peer keeps its own chunk.
absl::StatusOr<Tensor> RunReduceScatter(const StepContext& c, const Tensor& local,
                                        ProcessGroup& group) {
  const int i = c.step.mesh_dim;
  const int d = c.step.to.dim();
  const ReduceOp op = c.step.from.op();
  const bool cuda = local.device().is_cuda();
  DT_ASSIGN_OR_RETURN(std::vector<LocalLayout> peers,
                      PeerLayouts(c.mesh, c.shape, c.step.after, i));
  DT_ASSIGN_OR_RETURN(LocalLayout before, ComputeLocalLayout(c.shape, c.mesh.shape(), c.step.before,
                                                             c.mesh.GetCoordinate()));
  const int64_t k = static_cast<int64_t>(peers.size());
  const int me = group.rank();
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(local.dtype(), peers[me].shape, local.device()));
  std::vector<int64_t> counts;
  bool even = true;
  for (const LocalLayout& p : peers) {
    counts.push_back(Product(p.shape));
    even = even && counts.back() == counts.front();
  }
  if (local.numel() == 0) return out;
  // Pieces of the pack may be padded to a common size (CUDA, uneven).
  const bool pad = cuda && !even;
  int64_t padded_rows = 0;
  for (const LocalLayout& p : peers) padded_rows = std::max(padded_rows, p.shape[d]);
  DimVector padded_shape = peers[me].shape;
  padded_shape[d] = padded_rows;
  const int64_t padded_count = Product(padded_shape);
  // The pack: piece j at offset j * padded_count (pad) or after pieces < j.
  Tensor send = local;
  const bool in_order = OuterSize(local.shape(), d) == 1 && !pad;
  if (!in_order) {
    const int64_t total = pad ? padded_count * k : local.numel();
    DT_ASSIGN_OR_RETURN(send, pad ? Tensor::Zeros(local.dtype(), {total}, local.device())
                                  : Tensor::Empty(local.dtype(), {total}, local.device()));
    int64_t offset = 0;
    for (int64_t j = 0; j < k; ++j) {
      const LocalLayout& p = peers[static_cast<size_t>(j)];
      DT_ASSIGN_OR_RETURN(Tensor piece, NarrowTo(local, d, p, before));
      DT_RETURN_IF_ERROR(CopyStrided(SubBuffer(send, offset, p.shape), piece));
      offset += pad ? padded_count : counts[static_cast<size_t>(j)];
    }
  }
  const int64_t send_count = pad ? padded_count * k : local.numel();
  Tensor send_flat = SubBuffer(send, 0, {send_count});
  if (even) {
    DT_RETURN_IF_ERROR(Finish(group.ReduceScatter(send_flat, SubBuffer(out, 0, {out.numel()}), op),
                              group, c.timeout, cuda));
  } else if (pad) {
    DT_ASSIGN_OR_RETURN(Tensor recv, Tensor::Empty(local.dtype(), {padded_count}, local.device()));
    DT_RETURN_IF_ERROR(Finish(group.ReduceScatter(send_flat, recv, op), group, c.timeout, cuda));
    DT_RETURN_IF_ERROR(CopyStrided(out, SubBuffer(recv, 0, peers[me].shape)));
  } else {
    const int64_t own = out.numel();
    DT_ASSIGN_OR_RETURN(Tensor recv, Tensor::Empty(local.dtype(), {own * k}, local.device()));
    DT_RETURN_IF_ERROR(Finish(
        group.AllToAll(send_flat, recv, counts, std::vector<int64_t>(static_cast<size_t>(k), own)),
        group, c.timeout, cuda));
    DT_RETURN_IF_ERROR(ReduceLocal(out, recv, k, op));
  }
  return out;
}

// Shard(d) -> Shard(e): one all_to_all; piece j of the local block along e
// goes to peer j, and the pieces received are laid side by side along d.
absl::StatusOr<Tensor> RunAllToAll(const StepContext& c, const Tensor& local, ProcessGroup& group) {
  const int i = c.step.mesh_dim;
  const int d = c.step.from.dim();
  const int e = c.step.to.dim();
  const bool cuda = local.device().is_cuda();
  DT_ASSIGN_OR_RETURN(std::vector<LocalLayout> before,
                      PeerLayouts(c.mesh, c.shape, c.step.before, i));
  DT_ASSIGN_OR_RETURN(std::vector<LocalLayout> after,
                      PeerLayouts(c.mesh, c.shape, c.step.after, i));
  const int64_t k = static_cast<int64_t>(before.size());
  const int me = group.rank();
  const LocalLayout& mine_before = before[me];
  const LocalLayout& mine_after = after[me];
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(local.dtype(), mine_after.shape, local.device()));
  // Piece (from j, to m): before[j]'s block cut along e to after[m]'s range.
  auto piece_shape = [&](int64_t from, int64_t to) {
    DimVector s = before[static_cast<size_t>(from)].shape;
    s[e] = after[static_cast<size_t>(to)].shape[e];
    return s;
  };
  std::vector<int64_t> send_counts;
  std::vector<int64_t> recv_counts;
  int64_t total = 0;
  for (int64_t j = 0; j < k; ++j) {
    send_counts.push_back(Product(piece_shape(me, j)));
    recv_counts.push_back(Product(piece_shape(j, me)));
    // Whether anything moves anywhere in the group: the same on every peer.
    for (int64_t m = 0; m < k; ++m) total += Product(piece_shape(j, m));
  }
  if (total == 0) return out;
  // Where piece (from j, to me) goes in the result, and what piece (from me,
  // to j) is in the input.
  auto place = [&](int64_t j) {
    const LocalLayout& p = before[static_cast<size_t>(j)];
    return NarrowTo(out, d, p, mine_after);
  };
  auto piece_of_local = [&](int64_t j) {
    const LocalLayout& p = after[static_cast<size_t>(j)];
    return NarrowTo(local, e, p, mine_before);
  };
  if (CpuOverTcp(group, cuda)) {
    // Pieces straight between input and result (see PointToPoint): only the
    // pieces for other ranks are packed, in segments overlapping the sends.
    PointToPoint p2p(group, c.timeout);
    for (int64_t step = 1; step < k; ++step) {
      const int64_t from = (me - step + k) % k;
      if (recv_counts[static_cast<size_t>(from)] == 0) continue;
      DT_ASSIGN_OR_RETURN(Tensor dst, place(from));
      DT_RETURN_IF_ERROR(p2p.Recv(dst, static_cast<int>(from)));
    }
    for (int64_t step = 1; step < k; ++step) {
      const int64_t to = (me + step) % k;
      if (send_counts[static_cast<size_t>(to)] == 0) continue;
      DT_ASSIGN_OR_RETURN(Tensor piece, piece_of_local(to));
      DT_RETURN_IF_ERROR(p2p.Send(piece, static_cast<int>(to)));
    }
    if (send_counts[static_cast<size_t>(me)] > 0) {
      DT_ASSIGN_OR_RETURN(Tensor dst, place(me));
      DT_ASSIGN_OR_RETURN(Tensor piece, piece_of_local(me));
      DT_RETURN_IF_ERROR(CopyStrided(dst, piece));
    }
    DT_RETURN_IF_ERROR(p2p.Wait());
    return out;
  }
  Tensor send = local;
  if (OuterSize(local.shape(), e) != 1) {
    DT_ASSIGN_OR_RETURN(send, Tensor::Empty(local.dtype(), {local.numel()}, local.device()));
    int64_t offset = 0;
    for (int64_t j = 0; j < k; ++j) {
      const LocalLayout& p = after[static_cast<size_t>(j)];
      DT_ASSIGN_OR_RETURN(Tensor piece, NarrowTo(local, e, p, mine_before));
      DT_RETURN_IF_ERROR(CopyStrided(SubBuffer(send, offset, piece.shape()), piece));
      offset += send_counts[static_cast<size_t>(j)];
    }
  }
  const bool direct = OuterSize(mine_after.shape, d) == 1;
  Tensor recv = out;
  if (!direct) {
    DT_ASSIGN_OR_RETURN(recv, Tensor::Empty(local.dtype(), {out.numel()}, local.device()));
  }
  DT_RETURN_IF_ERROR(
      Finish(group.AllToAll(SubBuffer(send, 0, {local.numel()}), SubBuffer(recv, 0, {out.numel()}),
                            send_counts, recv_counts),
             group, c.timeout, cuda));
  if (!direct) {
    int64_t offset = 0;
    for (int64_t j = 0; j < k; ++j) {
      const LocalLayout& p = before[static_cast<size_t>(j)];
      DT_ASSIGN_OR_RETURN(Tensor dst, NarrowTo(out, d, p, mine_after));
      DT_RETURN_IF_ERROR(CopyStrided(dst, SubBuffer(recv, offset, dst.shape())));
      offset += recv_counts[static_cast<size_t>(j)];
    }
  }
  return out;
}

absl::StatusOr<Tensor> RunLocalSlice(const StepContext& c, const Tensor& local) {
  const int d = c.step.to.dim();
  DT_ASSIGN_OR_RETURN(LocalLayout before, ComputeLocalLayout(c.shape, c.mesh.shape(), c.step.before,
                                                             c.mesh.GetCoordinate()));
  DT_ASSIGN_OR_RETURN(LocalLayout after, ComputeLocalLayout(c.shape, c.mesh.shape(), c.step.after,
                                                            c.mesh.GetCoordinate()));
  DT_ASSIGN_OR_RETURN(Tensor piece, NarrowTo(local, d, after, before));
  return CopyOf(piece);
}

// A tensor shaped like `like` filled with the identity of `op`'s reduction
// where one exists that is not the value itself: 0 for sum, 1 for prod.
absl::StatusOr<Tensor> IdentityLike(const Tensor& like, ReduceOp op) {
  if (op == ReduceOp::kSum) return Tensor::Zeros(like.dtype(), like.shape(), like.device());
  DT_ASSIGN_OR_RETURN(Tensor ones, Tensor::Empty(like.dtype(), like.shape(), Device::Cpu()));
  const int64_t n = ones.numel();
  auto fill = [&](auto one) {
    using T = decltype(one);
    T* data = ones.data_as<T>();
    for (int64_t e = 0; e < n; ++e) data[e] = one;
  };
  switch (like.dtype()) {
    case DType::kFloat32:
      fill(1.0f);
      break;
    case DType::kFloat64:
      fill(1.0);
      break;
    case DType::kFloat16:
      fill(uint16_t{0x3C00});
      break;  // IEEE half 1.0
    case DType::kBFloat16:
      fill(uint16_t{0x3F80});
      break;  // bfloat16 1.0
    case DType::kInt8:
      fill(int8_t{1});
      break;
    case DType::kUInt8:
      fill(uint8_t{1});
      break;
    case DType::kInt32:
      fill(int32_t{1});
      break;
    case DType::kInt64:
      fill(int64_t{1});
      break;
    case DType::kBool:
      fill(true);
      break;
  }
  if (like.device().is_cpu()) return ones;
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(like.dtype(), like.shape(), like.device()));
  if (absl::Status s = CopyTensor(out, ones); !s.ok()) return s;
  return out;
}

// Replicate → Partial(op) along mesh dim i: the reduction over the dim must
// give back the value. min, max and avg of equal copies are the value, so
// every rank keeps it; sum and prod keep it on coordinate 0 and put the
// op's identity (0, 1) everywhere else.
bool KeepsValueOnEveryRank(ReduceOp op) { return op != ReduceOp::kSum && op != ReduceOp::kProd; }

absl::StatusOr<Tensor> RunLocalPartial(const StepContext& c, const Tensor& local) {
  const int i = c.step.mesh_dim;
  const ReduceOp op = c.step.to.op();
  if (!KeepsValueOnEveryRank(op) && c.mesh.GetCoordinate()[i] != 0) return IdentityLike(local, op);
  return CopyOf(local);
}

}  // namespace

absl::StatusOr<Tensor> RunStep(const StepContext& c, const Tensor& local) {
  DT_ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> group, c.mesh.GetGroup(c.step.mesh_dim));
  switch (c.step.op) {
    case RedistributeOp::kAllGather:
      return RunAllGather(c, local, *group);
    case RedistributeOp::kAllReduce:
      return RunAllReduce(c, local, *group);
    case RedistributeOp::kReduceScatter:
      return RunReduceScatter(c, local, *group);
    case RedistributeOp::kAllToAll:
      return RunAllToAll(c, local, *group);
    case RedistributeOp::kLocalSlice:
      return RunLocalSlice(c, local);
    case RedistributeOp::kLocalPartial:
      return RunLocalPartial(c, local);
  }
  return absl::InternalError("unknown redistribute op");
}

absl::StatusOr<Tensor> ApplyPartials(const DeviceMesh& mesh, absl::Span<const Placement> placements,
                                     Tensor local) {
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (placements[i].is_partial() && !KeepsValueOnEveryRank(placements[i].op()) &&
        mesh.GetCoordinate()[i] != 0) {
      return IdentityLike(local, placements[i].op());
    }
  }
  return local;
}

}  // namespace mesh::sharding
