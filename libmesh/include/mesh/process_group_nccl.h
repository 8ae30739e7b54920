// The NCCL backend: process groups over CUDA tensors, and the factory that
// builds the world group and DeviceMesh's per-dim groups.
//
// See docs/nccl.md for the design; the contract is summarized here.
//
// Streams (c10d semantics; see mesh/cuda_stream.h for "current stream").
//   NcclStreamMode picks where a group's ops run. With kGroupStream (the
//   default) each group owns one CUDA stream, and an op
//     1. records an event on the caller's current stream and makes the
//        group's stream wait for it (the op sees every write the caller
//        enqueued before it),
//     2. enqueues the NCCL call(s) on the group's stream,
//     3. records a completion event there, and returns its Work.
//   Communication then overlaps whatever the caller enqueues next on its
//   own stream. With kCurrentStream an op enqueues the NCCL call(s) and its
//   completion event on the caller's current stream itself: no event
//   orders it, later work on that stream runs after it, and nothing
//   overlaps it there (c10d's choice for synchronous collectives). It is the
//   lighter of the two on the host, one CUDA call per op besides NCCL's.
//   Work::Wait(timeout) makes the caller's *current* stream wait for the
//   completion event (nothing to do when the op ran on that stream) and
//   returns without blocking the host, so its `timeout` has nothing to
//   bound (it never returns DEADLINE_EXCEEDED); the device-side bound is the
//   watchdog's ProcessGroupOptions::timeout. Work::IsCompleted polls the
//   event (cudaEventQuery). To block the host, use SynchronizeWork below.
//   Tensor memory must stay valid until the op completes on the device, as
//   ProcessGroup requires (the op keeps no reference to it). Memory freed
//   with cudaFree, as Tensor::Empty's is, is safe to drop early because
//   cudaFree synchronizes the device. Ops of different groups on different
//   streams may overlap; as with any NCCL program, every rank must issue
//   them in an order that cannot deadlock (NCCL kernels wait for their
//   peers).
//
// Communicators.
//   The world communicator is made from the world ncclUniqueId that rank 0
//   generated (GenerateNcclUniqueId) and the coordinator brokered. Groups
//   from NewGroups are split from it (ncclCommSplit, one collective call per
//   family, color = GroupSpec::color, key = group rank) or, when splitting is
//   unavailable or disabled, built from per-group unique IDs exchanged over a
//   mesh::Store with one publish and one multi-get per rank per NewGroups
//   call. All communicators are non-blocking (ncclConfig_t::blocking = 0):
//   creation is polled with a deadline, and a communicator that does not
//   come up in time is aborted and reported as DEADLINE_EXCEEDED naming the
//   group.
//
// Failure.
//   ProcessGroup::Abort / Work::Abort / NcclProcessGroupFactory::AbortAll
//   call ncclCommAbort and fail every pending Work with the reason. A
//   watchdog thread per factory polls each group's oldest pending op and its
//   communicator's asynchronous error every `watchdog_interval`; an op that
//   has been pending longer than ProcessGroupOptions::timeout aborts the
//   group with DEADLINE_EXCEEDED, and an asynchronous NCCL error aborts it
//   with UNAVAILABLE (peer or network failure) or INTERNAL; either message
//   names the group and the pending op.
//
// Errors of an op, beyond mesh/process_group.h's:
//   synchronous  INVALID_ARGUMENT from the checks below, decided before any
//                CUDA call; the abort reason once the group is aborted;
//                INTERNAL when CUDA refuses to order the group stream after
//                the caller's current stream (e.g. that stream belongs to
//                another device); nothing was issued and the group stays
//                healthy.
//   Work         the abort reason (Abort, AbortAll, the watchdog), or the
//                NCCL/CUDA error that broke issuing the op, which aborts the
//                group since its peers issued the op too.
//
// Tensors: CUDA tensors on the group's device, contiguous (INVALID_ARGUMENT
// otherwise), any libmesh dtype; bool travels as uint8, so its reductions
// are kMin/kMax only. kAvg on integers is NCCL's sum-then-divide in the
// element type, so the sum may wrap where the average would fit. NCCL matches sends and receives
// between a pair in issue order whatever their tags: tags are accepted and ignored, which is
// equivalent whenever both sides issue their tagged messages in the same
// order (c10d's NCCL backend behaves alike).
//
// Builds without NCCL: the header compiles, Create and GenerateNcclUniqueId
// return UNIMPLEMENTED.
//
// Thread safety: as mesh/process_group.h; the factory is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "mesh/device.h"
#include "mesh/process_group.h"
#include "mesh/work.h"

namespace mesh {

class Store;  // mesh/store.h; only held here.

// Size of an ncclUniqueId.
inline constexpr size_t kNcclUniqueIdBytes = 128;

// A fresh ncclUniqueId (ncclGetUniqueId) as 128 raw bytes, for rank 0 to
// hand to the coordinator at Join. Needs no GPU, but starts NCCL's bootstrap
// root (a listening socket and thread) in this process, which must therefore
// live until every rank has created its world communicator.
// Possible errors: UNIMPLEMENTED without NCCL; UNAVAILABLE when NCCL cannot
// set up its bootstrap network.
absl::StatusOr<std::string> GenerateNcclUniqueId();

// Blocks the host until `work` completes or `timeout` passes, and returns
// its status. Works for any backend's Work (it polls IsCompleted), and is
// the host-side counterpart of the NCCL Work::Wait, which only orders
// streams.
// Possible errors: DEADLINE_EXCEEDED when `timeout` passes first (the op
// keeps running); the op's own error.
absl::Status SynchronizeWork(const Work& work, absl::Duration timeout);

// A process group whose ops run on NCCL. Made only by
// NcclProcessGroupFactory.
class ProcessGroupNccl : public ProcessGroup {
 public:
  absl::string_view backend() const override { return "nccl"; }

  // The CUDA device every tensor of this group must live on.
  const Device& device() const { return device_; }

  // The group's own stream (a cudaStream_t, non-blocking with respect to
  // the legacy default stream), for callers that want to enqueue work
  // directly behind the group's ops. It stays valid while the group lives.
  // With NcclStreamMode::kCurrentStream the ops run on their callers'
  // streams instead, and this one carries none of them.
  virtual void* stream() const = 0;

 protected:
  ProcessGroupNccl(int rank, std::vector<int> global_ranks, std::string name,
                   ProcessGroupOptions options, Device device)
      : ProcessGroup(rank, std::move(global_ranks), std::move(name), options), device_(device) {}

 private:
  const Device device_;
};

// How NewGroups builds its communicators.
enum class NcclGroupCreation : uint8_t {
  // ncclCommSplit when the NCCL library is >= 2.19, else unique IDs.
  kAuto,
  // Always ncclCommSplit; FAILED_PRECONDITION where unavailable.
  kSplit,
  // Always per-group unique IDs over `store`.
  kUniqueIds,
};

// How Create makes the world communicator.
enum class NcclWorldInit : uint8_t {
  // ncclCommInitRankScalable when the world has more than ranks_per_root
  // ranks and the NCCL library is >= 2.23, else one root.
  kAuto,
  // Always ncclCommInitRankConfig with the one world unique ID.
  kSingleRoot,
  // Always ncclCommInitRankScalable (one root per ranks_per_root ranks, at
  // least one); FAILED_PRECONDITION where NCCL is older than 2.23.
  kScalable,
};

// Which stream a group's ops run on (see "Streams" above).
enum class NcclStreamMode : uint8_t {
  // The group's own stream, ordered after the caller's by events: ops
  // overlap the caller's later work.
  kGroupStream,
  // The caller's current stream: no ordering events, no overlap.
  kCurrentStream,
};

struct NcclProcessGroupFactoryOptions {
  // This process's place in the world.
  int world_rank = 0;
  int world_size = 1;
  // The GPU this rank drives; every group of the factory runs on it.
  Device device = Device::Cuda(0);
  // The world ncclUniqueId, 128 raw bytes (mesh.v1 JoinResponse's
  // nccl_unique_id), the same on every rank.
  std::string world_unique_id;
  // Several roots spread NCCL's bootstrap of a large world: root i is rank
  // i * ranks_per_root. Root 0's ID is world_unique_id; every other root
  // makes one and publishes it through the unique-ID broker (key
  // "nccl/world-root/<i>"), and every rank fetches them all before
  // ncclCommInitRankScalable. Needs a broker (or `store`).
  NcclWorldInit world_init = NcclWorldInit::kAuto;
  int ranks_per_root = 1024;  // At least 1.
  // Options of every group the factory makes (timeout = the watchdog bound).
  ProcessGroupOptions group_options;
  // Bound on creating one batch of communicators (the world in Create, one
  // NewGroups call). Must be positive and finite.
  absl::Duration init_timeout = absl::Minutes(5);
  NcclGroupCreation group_creation = NcclGroupCreation::kAuto;
  // Where every group of the factory runs its ops.
  NcclStreamMode stream_mode = NcclStreamMode::kGroupStream;
  // Where per-group unique IDs are exchanged when NewGroups does not split,
  // e.g. the coordinator's KV store for this (job, generation). Keys start
  // with "nccl/uid/". May be null when every NewGroups splits.
  std::shared_ptr<Store> store;
  // How often the watchdog polls. Must be positive.
  absl::Duration watchdog_interval = absl::Milliseconds(100);
  // How long a group's destructor waits for ncclCommFinalize to drain its
  // communicator before aborting it instead.
  absl::Duration destroy_timeout = absl::Seconds(30);
};

// Makes NCCL process groups. Create is collective over the world: every
// rank calls it, and it returns once the world communicator is up.
//
// Lifecycle of each group it makes:
//
//   HEALTHY ──Abort(reason) / AbortAll / watchdog (timeout, async error)──▶ ABORTED
//      │                                                                      │
//      └── last reference dropped: ncclCommFinalize (bounded by              └── destroyed
//          destroy_timeout, else ncclCommAbort), ncclCommDestroy
//
// Groups may outlive the factory; the watchdog thread stops when the factory
// and every group it made are gone.
class NcclProcessGroupFactory : public ProcessGroupFactory {
 public:
  // Possible errors:
  //   INVALID_ARGUMENT     world_rank/world_size out of range, a unique id
  //                        that is not 128 bytes, a non-CUDA device, or a
  //                        non-positive timeout/interval;
  //   FAILED_PRECONDITION  no CUDA device visible, or `device` is not one;
  //                        kSplit where NCCL cannot split; kScalable where
  //                        NCCL is older than 2.23; several roots but no
  //                        unique-ID broker;
  //   DEADLINE_EXCEEDED    the world communicator did not come up within
  //                        init_timeout (peers missing), or a root's unique
  //                        ID was not published by then (naming it);
  //   UNAVAILABLE          NCCL failed to create it (network, peers,
  //                        devices); FAILED_PRECONDITION for NCCL usage
  //                        errors (e.g. two ranks on one GPU);
  //   UNIMPLEMENTED        libmesh was built without NCCL.
  static absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> Create(
      NcclProcessGroupFactoryOptions options);

  // Besides ProcessGroupFactory's errors, NewGroups may return
  // FAILED_PRECONDITION (unique IDs needed but no store), DEADLINE_EXCEEDED
  // (a communicator or a peer's unique id did not arrive within
  // init_timeout, naming the group), UNAVAILABLE (NCCL setup failed), and
  // the AbortAll reason once the factory is aborted.

  // The device every group runs on.
  virtual const Device& device() const = 0;
  // True when NewGroups splits the world communicator, false when it
  // exchanges unique IDs.
  virtual bool splits_communicators() const = 0;

 protected:
  NcclProcessGroupFactory() = default;
};

}  // namespace mesh
