// The data exchanges of the sharding executor: waiting for a group's Work on
// the host, point-to-point moves of strided pieces between group members,
// and the small int64 collectives that carry metadata (shapes, flags,
// hashes). Private to libmesh (libmesh/src/sharding/); plan_steps.cc,
// dtensor.cc and distribute_tensor.cc move bytes only through these and the
// groups' collectives.
//
// Every call here is collective over the group (or mesh) it names, like the
// ProcessGroup calls it makes: every member must make the same calls in the
// same order. A zero `timeout` means the group's default
// (ProcessGroupOptions::timeout).
// Errors: the groups' errors (Work::Wait, SynchronizeWork) and those of
// Tensor::Empty, CopyTensor and CopyStrided.
// Thread safety: one thread per group at a time, as for the groups
// themselves; a PointToPoint object belongs to one thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mesh/device.h"
#include "mesh/device_mesh.h"
#include "mesh/process_group.h"
#include "mesh/tensor.h"

namespace mesh::sharding {

using WorkPtr = ProcessGroup::WorkPtr;

// Waits for `work` on the host: Work::Wait for CPU groups, SynchronizeWork
// for CUDA ones (whose Wait only orders streams). Returns `work`'s error if
// it holds one.
absl::Status Finish(absl::StatusOr<WorkPtr> work, const ProcessGroup& group, absl::Duration timeout,
                    bool cuda);

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
// into segments of about 1 MiB along their dim 0, so that packing segment
// s + 1 overlaps sending segment s, and unpacking segment s overlaps
// receiving s + 1. The bytes on the wire are the collective's. Both ends of
// a piece know its shape (from the global shape alone), so they cut it the
// same way, and messages between a pair match in issue order under one tag.
//
// Only over TCP: a Gloo group on shared memory (GlooOptions::shared_memory)
// runs its collectives through a shared segment, which beats point-to-point
// over TCP even with the pack and unpack (measured: docs/performance.md),
// so such groups keep the collective path, with pooled buffers.

// Whether `group` takes the point-to-point path: a CPU group that is not a
// Gloo group on shared memory.
bool CpuOverTcp(const ProcessGroup& group, bool cuda);

// Posts the sends and receives of one exchange over `group`, then waits for
// them all. `group` must outlive the object; the tensors passed in stay
// alive through the posted work's own references.
class PointToPoint {
 public:
  PointToPoint(ProcessGroup& group, absl::Duration timeout);

  // Sends `piece` (any strides) to group rank `peer`, packing strided
  // segments into a pooled buffer just before each is posted.
  absl::Status Send(const Tensor& piece, int peer);

  // Posts the receives of `dst` (any strides) from group rank `peer`;
  // strided segments land in a pooled buffer and are unpacked by Wait.
  absl::Status Recv(const Tensor& dst, int peer);

  // Waits for every receive in posting order, unpacking each as it lands,
  // then for every send. Returns the first error (after posting nothing
  // more; buffers stay alive through the posted work's own references).
  absl::Status Wait();

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

// ---- Small int64 collectives for metadata (shapes, flags, hashes). ---------
// `device` is where the group moves tensors (GroupDevice); values cross
// through a device copy when it is not the CPU.

// The device the mesh's groups move tensors on: an NCCL group's device, else
// the CPU.
Device GroupDevice(const DeviceMesh& mesh);

// Every member's `values` (each the same length), concatenated in group
// rank order.
absl::StatusOr<std::vector<int64_t>> AllGatherInts(ProcessGroup& group,
                                                   const std::vector<int64_t>& values,
                                                   const Device& device, absl::Duration timeout);

// Group rank `root`'s `values` on every member (every member passes a
// vector of the same length).
absl::StatusOr<std::vector<int64_t>> BroadcastInts(ProcessGroup& group,
                                                   const std::vector<int64_t>& values, int root,
                                                   const Device& device, absl::Duration timeout);

// The minimum of `value` over every rank of the mesh: an all-reduce along
// each dim in turn reaches every rank.
absl::StatusOr<int64_t> MeshMin(const DeviceMesh& mesh, int64_t value, const Device& device,
                                absl::Duration timeout);

}  // namespace mesh::sharding
