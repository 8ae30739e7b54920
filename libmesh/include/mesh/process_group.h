// ProcessGroup: collectives and point-to-point ops among a fixed set of ranks,
// in the spirit of c10d's ProcessGroup.
//
// A group has `size()` members, numbered 0..size()-1 ("group ranks"); member
// i is world rank `global_ranks()[i]`. Ranks and roots in this API are group
// ranks.
//
// Ordering contract: every member must issue the group's collectives in the
// same order (as with MPI, NCCL and c10d). Ops of one group run in issue
// order; ops of different groups are independent.
//
// Tensors are views (mesh/tensor.h): the caller keeps their memory alive and
// does not touch it until the op's Work completes.
//
// Which tensors are accepted:
//   - Every tensor of one op has the same dtype and lives on the group's
//     device kind (CPU for Gloo, CUDA for NCCL).
//   - Gloo accepts inputs and outputs with any strides: non-contiguous ones
//     are staged through a contiguous buffer (one extra copy each way).
//     NCCL requires contiguous tensors and rejects others.
//   - Element counts: "numel" below counts elements, whatever the shapes.
//     Shapes are not checked beyond numel, so a [4,2] output may receive an
//     all-gather of [2,2] inputs.
//   - bool supports only broadcast, all_gather, all_to_all, send/recv and
//     reductions kMin/kMax (logical and/or); kSum/kAvg/kProd on bool are
//     INVALID_ARGUMENT. kAvg on integer dtypes divides with truncation
//     toward zero.
//
// Errors, synchronous (the op returns them and nothing starts):
//   INVALID_ARGUMENT     bad root/peer, mismatched dtype/device/numel, bad
//                        splits, unsupported dtype for the op.
//   ABORTED / the abort  the group was aborted earlier (by Abort(), a Work's
//   reason                Abort(), or the runtime on a peer's failure).
// Errors, asynchronous (Work::Wait/status): see mesh/work.h.
//
// Thread safety: all methods are thread-safe. Issuing ops of one group from
// several threads at once is allowed but their order is then unspecified, so
// it is only useful when every rank serializes them the same way.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "mesh/tensor.h"
#include "mesh/work.h"

namespace mesh {

enum class ReduceOp : uint8_t { kSum, kAvg, kMin, kMax, kProd };

// "sum", "avg", "min", "max", "prod".
absl::string_view ReduceOpName(ReduceOp op);

struct ProcessGroupOptions {
  // Default for Work::Wait(), and the bound on any one op inside the
  // backend (Gloo's per-op timeout; the NCCL watchdog's).
  absl::Duration timeout = absl::Minutes(5);
};

class ProcessGroup {
 public:
  using WorkPtr = std::shared_ptr<Work>;

  virtual ~ProcessGroup() = default;

  // This process's rank in the group, 0 <= rank() < size().
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(global_ranks_.size()); }
  // World rank of each member, in group-rank order.
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  // For messages and metrics, e.g. "world" or "mesh/tp/1".
  const std::string& name() const { return name_; }
  const ProcessGroupOptions& options() const { return options_; }

  // "gloo" or "nccl".
  virtual absl::string_view backend() const = 0;

  // In place: every member ends with the reduction over all members.
  virtual absl::StatusOr<WorkPtr> AllReduce(Tensor tensor, ReduceOp op) = 0;

  // Out of place: `output` (numel = input's) ends with the reduction over
  // members of their `input`s, which are only read. For a caller whose
  // input must stay intact this spares the copy the in-place form needs:
  // NCCL reduces from one buffer into the other, and Gloo over TCP runs a
  // fused ring reduce-scatter + all-gather from the input into the output.
  // `output` may be the same view as `input` (then this is the in-place
  // form); any other overlap of their spans is INVALID_ARGUMENT.
  virtual absl::StatusOr<WorkPtr> AllReduce(Tensor input, Tensor output, ReduceOp op) = 0;

  // In place: every member ends with `root`'s tensor.
  virtual absl::StatusOr<WorkPtr> Broadcast(Tensor tensor, int root) = 0;

  // In place on `root` only: it ends with the reduction; other members'
  // tensors are left with unspecified contents (they may serve as scratch).
  virtual absl::StatusOr<WorkPtr> Reduce(Tensor tensor, int root, ReduceOp op) = 0;

  // `output` (numel = size() * input numel) receives every member's input,
  // concatenated in group-rank order.
  virtual absl::StatusOr<WorkPtr> AllGather(Tensor input, Tensor output) = 0;

  // `input` (numel = size() * output numel) is reduced over members, and
  // member r receives chunk r of the result in `output`.
  virtual absl::StatusOr<WorkPtr> ReduceScatter(Tensor input, Tensor output, ReduceOp op) = 0;

  // c10d's all_to_all_single. Splits count rows of dim 0 (a row is the
  // product of the other dims). Empty splits mean equal splits: dim 0
  // divisible by size(). Otherwise input_splits[j] rows go to member j and
  // output_splits[j] rows come from member j; each list has size() entries
  // summing to that tensor's dim 0, and member j's input_splits[i] must equal
  // member i's output_splits[j] (not checked: a mismatch is a usage error
  // that the backend reports as a transport error or a hang until timeout).
  virtual absl::StatusOr<WorkPtr> AllToAll(Tensor input, Tensor output,
                                           std::vector<int64_t> input_splits = {},
                                           std::vector<int64_t> output_splits = {}) = 0;

  // Point to point. Sends and receives between a pair match in issue order
  // per tag. `peer` != rank().
  virtual absl::StatusOr<WorkPtr> Send(Tensor tensor, int peer, int tag = 0) = 0;
  virtual absl::StatusOr<WorkPtr> Recv(Tensor tensor, int peer, int tag = 0) = 0;

  // Completes once every member has called it.
  virtual absl::StatusOr<WorkPtr> Barrier() = 0;

  // Fails every pending and future op of the group with `reason` (must not
  // be OK) and releases its transport (Gloo closes its pairs; NCCL calls
  // ncclCommAbort). Idempotent: the first reason wins. Does not block on
  // peers.
  virtual void Abort(absl::Status reason) = 0;

  // OK, or the reason the group was aborted.
  virtual absl::Status health() const = 0;

  // The group that runs the ops: this one, or, for a decorator that the
  // Runtime wraps around every group (metrics, collective progress), the
  // backend's group underneath. For code that needs the backend's own type
  // (dynamic_cast<const ProcessGroupNccl*>(&group.Underlying())).
  virtual const ProcessGroup& Underlying() const { return *this; }

 protected:
  ProcessGroup(int rank, std::vector<int> global_ranks, std::string name,
               ProcessGroupOptions options)
      : rank_(rank),
        global_ranks_(std::move(global_ranks)),
        name_(std::move(name)),
        options_(options) {}

 private:
  const int rank_;
  const std::vector<int> global_ranks_;
  const std::string name_;
  const ProcessGroupOptions options_;
};

// One group to create: its members (world ranks, in group-rank order) and
// where it sits in a family of disjoint groups. A DeviceMesh dim of shape
// (2,4) produces, per dim, a family of disjoint groups that cover the world;
// `color` is the group's index in its family, so backends that split a world
// communicator (ncclCommSplit) can do it with one collective call per family.
struct GroupSpec {
  // Unique per family, e.g. "mesh/tp"; the backend scopes its rendezvous
  // keys with it, so two families must not share a name.
  std::string family;
  int color = 0;
  std::vector<int> global_ranks;  // Must include the calling rank.
};

// A set of world ranks that make groups among themselves alone: in-place
// recovery's live members (mesh/elastic_mesh.h). A backend may keep, per
// membership, what lets those groups be made without a new rendezvous:
// NCCL keeps a communicator of the members that no op ever uses, splits
// their groups from it, and shrinks it when members are lost. Made by
// ProcessGroupFactory::NewMembership. Immutable and thread-safe. Dropping
// the last reference releases the backend's resources without waiting on
// the other members, some of which may be gone (NCCL: ncclCommAbort; one
// whose shrink or split NCCL never finished waits up to the factory's
// destroy_timeout for it first, as a group does).
class Membership {
 public:
  Membership(std::string family, std::vector<int> ranks)
      : family_(std::move(family)), ranks_(std::move(ranks)) {}
  virtual ~Membership() = default;
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // The family it was made as (GroupSpec::family).
  const std::string& family() const { return family_; }
  // The members: distinct world ranks, ascending.
  const std::vector<int>& ranks() const { return ranks_; }

 private:
  const std::string family_;
  const std::vector<int> ranks_;
};

// Makes process groups over subsets of the world for one backend. DeviceMesh
// uses it to build its per-dim groups.
//
// Collective contract: every world rank calls NewGroups with the specs of
// the same families, in the same order (each rank passes, per family, the
// one group that contains it). The factory may batch the exchange of
// connection data (e.g. all NCCL unique IDs in one coordinator round trip).
//
// Errors: INVALID_ARGUMENT (a spec that omits the caller, duplicate ranks,
// ranks outside the world), DEADLINE_EXCEEDED (peers did not show up), the
// backend's setup errors.
// Thread safety: implementations are thread-safe.
class ProcessGroupFactory {
 public:
  virtual ~ProcessGroupFactory() = default;

  virtual int world_rank() const = 0;
  virtual int world_size() const = 0;
  // The group of every world rank; created once and shared.
  virtual absl::StatusOr<std::shared_ptr<ProcessGroup>> World() = 0;
  // One group per spec, in spec order.
  virtual absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroups(
      const std::vector<GroupSpec>& specs) = 0;
  // As NewGroups, but collective only among the ranks the specs list: the
  // other world ranks do not call it (in-place recovery rebuilds groups
  // over the live ranks with it; mesh/elastic_mesh.h). Every listed rank
  // passes, per family, its own group, with the same families in the same
  // order; the families must be new to every caller (a rebuild names its
  // families after its round), since a process that replaced a lost rank
  // has made none of the earlier ones. Gloo connects each group among its
  // own members; NCCL initializes each from a unique ID its first member
  // publishes through the factory's store (never a split of the world
  // communicator, which needs every world rank).
  // Errors: NewGroups'; UNIMPLEMENTED for a backend that cannot.
  virtual absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroupsAmongMembers(
      const std::vector<GroupSpec>& specs) = 0;
  // Collective among `spec.global_ranks` (distinct world ranks, ascending,
  // the caller's among them; `spec.family` new to every caller, as for
  // NewGroupsAmongMembers): a Membership of those ranks. `previous`,
  // optional, is a membership this factory made earlier with the caller
  // in it, and the call derives the new one from it instead of making one
  // afresh: NCCL shrinks its communicator (ncclCommShrink with
  // NCCL_SHRINK_ABORT, NCCL >= 2.27; no unique IDs exchanged) or, with the
  // same ranks, shares it. Pass one only where it holds every new member
  // as the same process, and only where every member passes one of the
  // same ranks: members that disagree fail at the deadline (NCCL's
  // init_timeout). The default records the ranks and makes nothing.
  // Errors: INVALID_ARGUMENT for bad ranks or a `previous` that misses a
  // new member; NewGroupsAmongMembers' errors; the backend's shrink errors.
  virtual absl::StatusOr<std::shared_ptr<Membership>> NewMembership(
      const GroupSpec& spec, const std::shared_ptr<Membership>& previous);
  // As NewGroupsAmongMembers, for groups whose ranks are all in
  // `membership` (made by this factory), and collective among all of
  // membership's ranks: each passes its own group of the same families in
  // the same order, so every family covers the membership, as a mesh's
  // dims do. NCCL splits each group from the membership's communicator
  // (one ncclCommSplit per family) where NCCL can split; otherwise, and by
  // default, this is NewGroupsAmongMembers(specs).
  // Errors: NewGroupsAmongMembers'; INVALID_ARGUMENT for a group with a
  // rank outside the membership.
  virtual absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroupsWithin(
      const Membership& membership, const std::vector<GroupSpec>& specs);
  // Aborts every group this factory made (see ProcessGroup::Abort) and every
  // group it makes later.
  virtual void AbortAll(absl::Status reason) = 0;
};

// The argument checks of ProcessGroupFactory::NewMembership and
// NewGroupsWithin, for backends that override them; INVALID_ARGUMENT
// naming the family and the ranks, else OK.
absl::Status CheckMembershipSpec(const GroupSpec& spec, int world_rank, int world_size);
// Every rank of `spec` is in `previous` (OK when `previous` is null).
absl::Status CheckWithinPrevious(const GroupSpec& spec, const Membership* previous);
// Every rank of every spec is in `membership`.
absl::Status CheckGroupsWithin(const Membership& membership, const std::vector<GroupSpec>& specs);

}  // namespace mesh
