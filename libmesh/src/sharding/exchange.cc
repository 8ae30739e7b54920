#include "sharding/exchange.h"

#include <algorithm>
#include <utility>

#include "mesh/process_group_gloo.h"
#include "mesh/process_group_nccl.h"
#include "sharding/status_macros.h"
#include "sharding/strided_copy.h"
#include "sharding/tensor_views.h"

namespace mesh::sharding {

namespace {

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

}  // namespace

absl::Status Finish(absl::StatusOr<WorkPtr> work, const ProcessGroup& group, absl::Duration timeout,
                    bool cuda) {
  if (!work.ok()) return work.status();
  if (timeout == absl::ZeroDuration()) timeout = group.options().timeout;
  if (cuda) return SynchronizeWork(**work, timeout);
  return (*work)->Wait(timeout);
}

// ---- Point-to-point exchanges. -------------------------------------------------

bool CpuOverTcp(const ProcessGroup& group, bool cuda) {
  if (cuda) return false;
  const auto* gloo = dynamic_cast<const ProcessGroupGloo*>(&group.Underlying());
  return gloo == nullptr || !gloo->uses_shared_memory();
}

PointToPoint::PointToPoint(ProcessGroup& group, absl::Duration timeout)
    : group_(group),
      timeout_(timeout == absl::ZeroDuration() ? group.options().timeout : timeout) {}

absl::Status PointToPoint::Send(const Tensor& piece, int peer) {
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
      DT_RETURN_IF_ERROR(CopyStrided(SubBuffer(staging, offset, segment.shape()), segment));
    }
    offset += segment.numel();
    DT_ASSIGN_OR_RETURN(WorkPtr work, group_.Send(flat, peer, kRedistributeTag));
    sends_.push_back(std::move(work));
  }
  return absl::OkStatus();
}

absl::Status PointToPoint::Recv(const Tensor& dst, int peer) {
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

absl::Status PointToPoint::Wait() {
  for (PendingRecv& r : recvs_) {
    DT_RETURN_IF_ERROR(r.work->Wait(timeout_));
    if (r.unpack) {
      DT_RETURN_IF_ERROR(CopyStrided(
          r.unpack_to,
          Tensor::Contiguous(r.flat.data(), r.flat.dtype(), r.unpack_to.shape(), r.flat.device())));
    }
  }
  for (WorkPtr& w : sends_) DT_RETURN_IF_ERROR(w->Wait(timeout_));
  return absl::OkStatus();
}

// ---- Small int64 collectives. ----------------------------------------------------

Device GroupDevice(const DeviceMesh& mesh) {
  for (const auto& group : mesh.GetAllGroups()) {
    if (auto* nccl = dynamic_cast<const ProcessGroupNccl*>(&group->Underlying()))
      return nccl->device();
  }
  return Device::Cpu();
}

absl::StatusOr<std::vector<int64_t>> AllGatherInts(ProcessGroup& group,
                                                   const std::vector<int64_t>& values,
                                                   const Device& device, absl::Duration timeout) {
  const int64_t n = static_cast<int64_t>(values.size());
  return IntCollective(values, n * group.size(), device, [&](Tensor in, Tensor out) {
    return Finish(group.AllGather(in, out), group, timeout, device.is_cuda());
  });
}

absl::StatusOr<std::vector<int64_t>> BroadcastInts(ProcessGroup& group,
                                                   const std::vector<int64_t>& values, int root,
                                                   const Device& device, absl::Duration timeout) {
  return IntCollective(
      values, static_cast<int64_t>(values.size()), device,
      [&](Tensor in, Tensor out) -> absl::Status {
        DT_RETURN_IF_ERROR(Finish(group.Broadcast(in, root), group, timeout, device.is_cuda()));
        return CopyTensor(out, in);
      });
}

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

}  // namespace mesh::sharding
