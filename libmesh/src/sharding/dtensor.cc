// DTensor: construction (FromLocal, DistributeTensor) and execution of
// redistribute plans. The planning and the layout arithmetic are pure and
// live in placement.cc / redistribute_plan.cc; this file only moves bytes.
//
// Every step of a plan runs on the step's mesh dim group. Peers along that
// dim differ only in their coordinate there, so each rank can compute every
// peer's layout (ComputeLocalLayout with the coordinate changed) and needs
// no size exchange: splits and offsets come from the global shape alone.
// Decisions that skip communication (nothing to move) are taken from those
// shared numbers too, so every member of a group skips or joins together.
//
// CUDA: packing and unpacking use sharding::CopyStrided (a 2-D copy kernel); the
// one reduction done locally (an uneven reduce_scatter) would need a kernel,
// so on CUDA an uneven reduce_scatter pads every chunk to ceil(n / k) and
// uses the group's ReduceScatter: the padding crosses the wire, a little
// more than the plan's bytes_per_rank. Host-side waits use SynchronizeWork.
#include "mesh/dtensor.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "mesh/float16.h"
#include "mesh/process_group_gloo.h"
#include "mesh/process_group_nccl.h"
#include "metrics_hooks.h"
#include "sharding/strided_copy.h"

namespace mesh {

absl::StatusOr<DTensor> MakeDTensor(DeviceMesh mesh, Placements placements, DimVector shape,
                                    Tensor local);

namespace {

#define DT_RETURN_IF_ERROR(expr)              \
  do {                                        \
    if (absl::Status _s = (expr); !_s.ok()) { \
      return _s;                              \
    }                                         \
  } while (false)

#define DT_CONCAT_INNER(a, b) a##b
#define DT_CONCAT(a, b) DT_CONCAT_INNER(a, b)
#define DT_ASSIGN_OR_RETURN(lhs, expr) \
  DT_ASSIGN_OR_RETURN_IMPL(DT_CONCAT(_so_, __LINE__), lhs, expr)
#define DT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = *std::move(tmp)

using WorkPtr = ProcessGroup::WorkPtr;

std::string ShapeStr(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t Product(absl::Span<const int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims) p *= d;
  return p;
}

// Product of the dims before `d`: 1 means blocks along d are contiguous.
int64_t OuterSize(absl::Span<const int64_t> shape, int d) {
  return Product(shape.subspan(0, static_cast<size_t>(d)));
}

// Waits for `work` on the host: Work::Wait for CPU groups, SynchronizeWork
// for CUDA ones (whose Wait only orders streams).
absl::Status Finish(absl::StatusOr<WorkPtr> work, const ProcessGroup& group, absl::Duration timeout,
                    bool cuda) {
  if (!work.ok()) return work.status();
  if (timeout == absl::ZeroDuration()) timeout = group.options().timeout;
  if (cuda) return SynchronizeWork(**work, timeout);
  return (*work)->Wait(timeout);
}

// A contiguous view of `count` elements of `buffer` starting at element
// `offset`, shaped `shape`.
Tensor SubBuffer(const Tensor& buffer, int64_t offset, absl::Span<const int64_t> shape) {
  auto* base = static_cast<unsigned char*>(buffer.data()) +
               offset * static_cast<int64_t>(buffer.element_size());
  return Tensor::Contiguous(base, buffer.dtype(), shape, buffer.device(), buffer.keep_alive());
}

// `t`, which holds `whole`, narrowed on dim d to `piece` (two layouts of one
// tensor, `piece` inside `whole`). An empty piece is narrowed at 0: an empty
// shard's offset is the global extent (ComputeLocalLayout), which lies
// outside any parent chunk.
absl::StatusOr<Tensor> NarrowTo(const Tensor& t, int d, const LocalLayout& piece,
                                const LocalLayout& whole) {
  if (piece.shape[d] == 0) return t.Narrow(d, 0, 0);
  return t.Narrow(d, piece.offset[d] - whole.offset[d], piece.shape[d]);
}

// `t` narrowed to [offset, offset + shape) on every dim.
absl::StatusOr<Tensor> Box(const Tensor& t, absl::Span<const int64_t> offset,
                           absl::Span<const int64_t> shape) {
  Tensor view = t;
  for (int d = 0; d < t.dim(); ++d) {
    if (offset[d] == 0 && shape[d] == t.size(d)) continue;
    DT_ASSIGN_OR_RETURN(view, view.Narrow(d, offset[d], shape[d]));
  }
  return view;
}

absl::StatusOr<Tensor> CopyOf(const Tensor& t) {
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(t.dtype(), t.shape(), t.device()));
  DT_RETURN_IF_ERROR(sharding::CopyStrided(out, t));
  return out;
}

// ---- Point-to-point exchanges (CPU groups). ---------------------------------
//
// Gloo's collectives take contiguous buffers only, so a layout change whose
// pieces are strided (Shard(d) -> Shard(e) packs, an all_gather along a dim
// with something before it unpacks) would pack everything, run the
// collective, then unpack everything. On CPU groups the executor instead
// sends each piece to its peer with Send/Recv: pieces that are contiguous
// where they are (or where they go) move without a copy, the own piece is
// copied straight from the input into the result (the copy the collective
// would make anyway), and the pieces that must be packed or unpacked are cut
// into segments of about kSegmentBytes along their dim 0, so that packing
// segment s + 1 overlaps sending segment s, and unpacking segment s
// overlaps receiving s + 1. The bytes on the wire are the collective's.
// Both ends of a piece know its shape (from the global shape alone), so
// they cut it the same way, and messages between a pair match in issue
// order under one tag.
//
// Only over TCP: a Gloo group on shared memory (GlooOptions::shared_memory)
// runs its collectives through a shared segment, which beats point-to-point
// over TCP even with the pack and unpack (measured: docs/performance.md),
// so such groups keep the collective path, with pooled buffers.
bool CpuOverTcp(const ProcessGroup& group, bool cuda) {
  if (cuda) return false;
  const auto* gloo = dynamic_cast<const ProcessGroupGloo*>(&group);
  return gloo == nullptr || !gloo->uses_shared_memory();
}

constexpr int kRedistributeTag = 0x3D7E5D00;  // Any fixed tag; one unlikely in user code.
constexpr int64_t kSegmentBytes = int64_t{1} << 20;

// [start, length) ranges of dim 0 of `shape`, each about kSegmentBytes.
std::vector<std::pair<int64_t, int64_t>> Segments(absl::Span<const int64_t> shape,
                                                  size_t element_size) {
  std::vector<std::pair<int64_t, int64_t>> segments;
  if (shape.empty() || Product(shape) == 0) return segments;
  const int64_t row_bytes = Product(shape.subspan(1)) * static_cast<int64_t>(element_size);
  const int64_t rows = std::max<int64_t>(1, kSegmentBytes / std::max<int64_t>(row_bytes, 1));
  for (int64_t r = 0; r < shape[0]; r += rows) {
    segments.emplace_back(r, std::min(rows, shape[0] - r));
  }
  return segments;
}

class PointToPoint {
 public:
  PointToPoint(ProcessGroup& group, absl::Duration timeout)
      : group_(group),
        timeout_(timeout == absl::ZeroDuration() ? group.options().timeout : timeout) {}

  // Sends `piece` (any strides) to group rank `peer`, packing strided
  // segments into a pooled buffer just before each is posted.
  absl::Status Send(const Tensor& piece, int peer) {
    Tensor staging;
    if (!piece.is_contiguous()) {
      DT_ASSIGN_OR_RETURN(staging, Tensor::Empty(piece.dtype(), {piece.numel()}, piece.device()));
    }
    int64_t offset = 0;
    for (const auto& [start, length] : Segments(piece.shape(), piece.element_size())) {
      DT_ASSIGN_OR_RETURN(Tensor segment, piece.Narrow(0, start, length));
      Tensor flat;
      if (segment.is_contiguous()) {
        flat = SubBuffer(segment, 0, {segment.numel()});
      } else {
        flat = SubBuffer(staging, offset, {segment.numel()});
        DT_RETURN_IF_ERROR(
            sharding::CopyStrided(SubBuffer(staging, offset, segment.shape()), segment));
      }
      offset += segment.numel();
      DT_ASSIGN_OR_RETURN(WorkPtr work, group_.Send(flat, peer, kRedistributeTag));
      sends_.push_back(std::move(work));
    }
    return absl::OkStatus();
  }

  // Posts the receives of `dst` (any strides) from group rank `peer`;
  // strided segments land in a pooled buffer and are unpacked by Wait.
  absl::Status Recv(const Tensor& dst, int peer) {
    Tensor staging;
    if (!dst.is_contiguous()) {
      DT_ASSIGN_OR_RETURN(staging, Tensor::Empty(dst.dtype(), {dst.numel()}, dst.device()));
    }
    int64_t offset = 0;
    for (const auto& [start, length] : Segments(dst.shape(), dst.element_size())) {
      DT_ASSIGN_OR_RETURN(Tensor segment, dst.Narrow(0, start, length));
      PendingRecv pending;
      if (segment.is_contiguous()) {
        pending.flat = SubBuffer(segment, 0, {segment.numel()});
      } else {
        pending.flat = SubBuffer(staging, offset, {segment.numel()});
        pending.unpack_to = segment;
        pending.unpack = true;
      }
      offset += segment.numel();
      DT_ASSIGN_OR_RETURN(pending.work, group_.Recv(pending.flat, peer, kRedistributeTag));
      recvs_.push_back(std::move(pending));
    }
    return absl::OkStatus();
  }

  // Waits for every receive in posting order, unpacking each as it lands,
  // then for every send. Returns the first error (after posting nothing
  // more; buffers stay alive through the posted work's own references).
  absl::Status Wait() {
    for (PendingRecv& r : recvs_) {
      DT_RETURN_IF_ERROR(r.work->Wait(timeout_));
      if (r.unpack) {
        DT_RETURN_IF_ERROR(sharding::CopyStrided(
            r.unpack_to, Tensor::Contiguous(r.flat.data(), r.flat.dtype(), r.unpack_to.shape(),
                                            r.flat.device())));
      }
    }
    for (WorkPtr& w : sends_) DT_RETURN_IF_ERROR(w->Wait(timeout_));
    return absl::OkStatus();
  }

 private:
  struct PendingRecv {
    WorkPtr work;
    Tensor flat;
    Tensor unpack_to;
    bool unpack = false;
  };
  ProcessGroup& group_;
  absl::Duration timeout_;
  std::vector<WorkPtr> sends_;
  std::vector<PendingRecv> recvs_;
};

// The device the mesh's groups move tensors on: an NCCL group's device, else
// the CPU.
Device GroupDevice(const DeviceMesh& mesh) {
  for (const auto& group : mesh.GetAllGroups()) {
    if (auto* nccl = dynamic_cast<const ProcessGroupNccl*>(group.get())) return nccl->device();
  }
  return Device::Cpu();
}

// ---- Small int64 collectives for metadata (shapes, flags, hashes). ---------

// Runs `op` on a tensor holding `values` on `device` and returns what it holds
// afterwards (of `out_count` elements; the op writes `out`).
template <typename Op>
absl::StatusOr<std::vector<int64_t>> IntCollective(const std::vector<int64_t>& values,
                                                   int64_t out_count, const Device& device, Op op) {
  std::vector<int64_t> in = values;
  std::vector<int64_t> out(static_cast<size_t>(out_count));
  Tensor in_host = Tensor::Contiguous(in.data(), DType::kInt64, {static_cast<int64_t>(in.size())});
  Tensor out_host = Tensor::Contiguous(out.data(), DType::kInt64, {out_count});
  if (device.is_cpu()) {
    DT_RETURN_IF_ERROR(op(in_host, out_host));
    return out;
  }
  DT_ASSIGN_OR_RETURN(Tensor in_dev, Tensor::Empty(DType::kInt64, in_host.shape(), device));
  DT_ASSIGN_OR_RETURN(Tensor out_dev, Tensor::Empty(DType::kInt64, out_host.shape(), device));
  DT_RETURN_IF_ERROR(CopyTensor(in_dev, in_host));
  DT_RETURN_IF_ERROR(op(in_dev, out_dev));
  DT_RETURN_IF_ERROR(CopyTensor(out_host, out_dev));
  return out;
}

absl::StatusOr<std::vector<int64_t>> AllGatherInts(ProcessGroup& group,
                                                   const std::vector<int64_t>& values,
                                                   const Device& device, absl::Duration timeout) {
  const int64_t n = static_cast<int64_t>(values.size());
  return IntCollective(values, n * group.size(), device, [&](Tensor in, Tensor out) {
    return Finish(group.AllGather(in, out), group, timeout, device.is_cuda());
  });
}

// The minimum of `value` over every rank of the mesh: an all-reduce along
// each dim in turn reaches every rank.
absl::StatusOr<int64_t> MeshMin(const DeviceMesh& mesh, int64_t value, const Device& device,
                                absl::Duration timeout) {
  for (const auto& group : mesh.GetAllGroups()) {
    DT_ASSIGN_OR_RETURN(
        std::vector<int64_t> v,
        IntCollective({value}, 1, device, [&](Tensor in, Tensor out) -> absl::Status {
          DT_RETURN_IF_ERROR(
              Finish(group->AllReduce(in, ReduceOp::kMin), *group, timeout, device.is_cuda()));
          return CopyTensor(out, in);
        }));
    value = v[0];
  }
  return value;
}

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

struct StepContext {
  const DeviceMesh& mesh;
  absl::Span<const int64_t> shape;
  const RedistributeStep& step;
  absl::Duration timeout;
};

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
      DT_RETURN_IF_ERROR(sharding::CopyStrided(own, local));
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
      DT_RETURN_IF_ERROR(sharding::CopyStrided(SubBuffer(repeated, j * own, {own}), send_flat));
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
      DT_RETURN_IF_ERROR(sharding::CopyStrided(dst, SubBuffer(recv, offset, p.shape)));
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
      DT_RETURN_IF_ERROR(sharding::CopyStrided(SubBuffer(send, offset, p.shape), piece));
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
    DT_RETURN_IF_ERROR(sharding::CopyStrided(out, SubBuffer(recv, 0, peers[me].shape)));
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
      DT_RETURN_IF_ERROR(sharding::CopyStrided(dst, piece));
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
      DT_RETURN_IF_ERROR(sharding::CopyStrided(SubBuffer(send, offset, piece.shape()), piece));
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
      DT_RETURN_IF_ERROR(sharding::CopyStrided(dst, SubBuffer(recv, offset, dst.shape())));
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

// The rank's index in the mesh in row-major coordinate order.
int64_t MeshRank(const DeviceMesh& mesh) {
  int64_t r = 0;
  for (int i = 0; i < mesh.ndim(); ++i) r = r * mesh.Size(i) + mesh.GetCoordinate()[i];
  return r;
}

// Applies Replicate -> Partial to a value every rank holds: Partial(sum) and
// Partial(prod) keep it on coordinate 0 of each such dim only (see
// RunLocalPartial).
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

// ---- DistributeTensor. -----------------------------------------------------

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
    DT_ASSIGN_OR_RETURN(
        header, IntCollective(header, static_cast<int64_t>(header.size()), device,
                              [&](Tensor in, Tensor out) -> absl::Status {
                                DT_RETURN_IF_ERROR(
                                    Finish(group->Broadcast(in, static_cast<int>(src_coord[i])),
                                           *group, options.timeout, cuda));
                                return CopyTensor(out, in);
                              }));
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
