// Argument checks of the NCCL backend that run before any CUDA or NCCL call.
// Private to libmesh.
//
// They are plain C++ over tensor metadata, compiled in every build and unit
// tested without a GPU, so that every INVALID_ARGUMENT the NCCL backend
// returns is decided here, never by NCCL (whose own argument errors would
// arrive after the op is half-issued and the group must be aborted).
//
// Every error is INVALID_ARGUMENT and names the group, the op and the tensor.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "mesh/device.h"
#include "mesh/dtype.h"
#include "mesh/process_group.h"
#include "mesh/process_group_nccl.h"
#include "mesh/tensor.h"

namespace mesh::nccl {

// What the NCCL headers libmesh was built against support. bfloat16 and
// ncclAvg arrived in NCCL 2.10.
struct NcclCaps {
  bool bfloat16 = true;
  bool avg = true;
};

// The facts about a group the checks need.
struct GroupView {
  absl::string_view name;
  int rank = 0;
  int size = 1;
  Device device;
};

// The tensor lives on the group's device, is contiguous, and its dtype is
// one NCCL can carry. `role` names it in messages ("tensor", "input", ...).
absl::Status CheckTensor(const GroupView& group, absl::string_view op, absl::string_view role,
                         const Tensor& tensor, const NcclCaps& caps);

// `output` has the dtype of `input`.
absl::Status CheckSameDType(const GroupView& group, absl::string_view op, const Tensor& input,
                            const Tensor& output);

// The reduction exists for the dtype: bool takes only kMin and kMax (logical
// and / or on 0/1 bytes); kAvg needs NCCL >= 2.10.
absl::Status CheckReduceOp(const GroupView& group, absl::string_view op, DType dtype,
                           ReduceOp reduce_op, const NcclCaps& caps);

// 0 <= root < size.
absl::Status CheckRoot(const GroupView& group, absl::string_view op, int root);

// 0 <= peer < size and peer != rank.
absl::Status CheckPeer(const GroupView& group, absl::string_view op, int peer);

// output numel == input numel, and the two are the same tensor or do not
// overlap (the out-of-place all_reduce).
absl::Status CheckAllReduceBuffers(const GroupView& group, const Tensor& input,
                                   const Tensor& output);

// output numel == size * input numel.
absl::Status CheckAllGatherSizes(const GroupView& group, const Tensor& input, const Tensor& output);

// input numel == size * output numel.
absl::Status CheckReduceScatterSizes(const GroupView& group, const Tensor& input,
                                     const Tensor& output);

// Element counts and offsets of one all-to-all, per peer (group rank).
struct AllToAllPlan {
  std::vector<int64_t> send_counts;
  std::vector<int64_t> send_offsets;
  std::vector<int64_t> recv_counts;
  std::vector<int64_t> recv_offsets;
};

// Turns AllToAll's row splits (mesh/process_group.h) into element counts.
// Each side is checked on its own: an empty split list means equal splits of
// that tensor's dim 0, which must then be divisible by size(); otherwise the
// list has size() non-negative entries summing to dim 0. Both tensors need
// at least one dimension and the same row size (product of dims 1..), and
// their memory must not overlap.
absl::StatusOr<AllToAllPlan> PlanAllToAll(const GroupView& group, const Tensor& input,
                                          const Tensor& output,
                                          absl::Span<const int64_t> input_splits,
                                          absl::Span<const int64_t> output_splits);

// Checks ProcessGroupFactory::NewGroups' specs for the calling rank and
// returns its group rank in each. INVALID_ARGUMENT for: an empty family
// name, a family named twice, a negative color, an empty member list, a
// rank outside [0, world_size), a rank listed twice, or a spec that omits
// `world_rank`.
absl::StatusOr<std::vector<int>> CheckGroupSpecs(absl::Span<const GroupSpec> specs, int world_rank,
                                                 int world_size);

// Checks NcclProcessGroupFactory::Create's options before anything touches
// CUDA: world_size >= 1, world_rank in range, a 128-byte unique id, a CUDA
// device, positive finite init_timeout, group timeout and watchdog interval,
// a non-negative finite destroy_timeout. INVALID_ARGUMENT naming the field.
absl::Status CheckFactoryOptions(const NcclProcessGroupFactoryOptions& options);

}  // namespace mesh::nccl
