// ElasticMesh: the device mesh of a job's live ranks under in-place recovery
// (docs/elastic.md), as torchft's Manager keeps healthy data-parallel
// replicas training while a failed one is replaced.
//
//   mesh::ElasticMeshOptions options;
//   options.state = [&] { return std::vector<mesh::Tensor>{weights, step}; };
//   auto elastic = mesh::ElasticMesh::Create(*rt, options);   // collective
//   while (step < steps) {
//     absl::StatusOr<bool> changed = (*elastic)->Sync();       // collective
//     if (!changed.ok()) return changed.status();
//     if (!(*elastic)->is_member()) continue;   // its replica lost a rank
//     auto dp = (*elastic)->mesh().GetGroup("dp");
//     ... all_reduce over *dp; on an error, do not commit the step: go
//     ... back to Sync(), which rebuilds the groups without the dead rank
//   }
//
// The job (JobSpec restart_policy IN_PLACE, or CreateJob in_place) keeps a
// generation running when a rank dies after the world formed: the
// coordinator moves the membership to its next epoch, and the agent starts a
// new process as the rank, which joins the same generation. ElasticMesh
// turns that into groups:
//
//   - Sync() first asks the members, in one all-reduce over their group,
//     for the highest epoch any of them has heard of and whether any of
//     them has a broken group (a step's collective failed on it). When the
//     epoch moved, a group broke, or that all-reduce failed (a member died
//     mid-step), every live rank reconfigures: it first aborts its groups of
//     the old mesh (with Gloo this closes their connections, so a peer still
//     waiting in one of its collectives fails at once and comes to Sync
//     too), then Runtime::AliveRanks gives every live rank the same set, and
//     the mesh is rebuilt over it.
//   - The job's mesh loses whole replicas along one dim (`dim`, e.g. "dp"):
//     a replica is the ranks that share a coordinate along it, and it stays
//     only while every one of its ranks is live. A (4, 2) dp x tp mesh that
//     loses rank 5 becomes (3, 2) over ranks 0-3 and 6-7. Rank 4, live but
//     in a broken replica, is not a member: its Sync() waits (up to
//     `timeout`, then DEADLINE_EXCEEDED: call it again) until the membership
//     changes, and rejoins the mesh once its replica is whole again.
//   - The new groups come from a Membership of the members
//     (ProcessGroupFactory::NewMembership, then NewGroupsWithin), collective
//     among the members alone, in families named after the AliveRanks
//     round, so no key of an earlier epoch is reused. Where every member
//     was a member of the previous mesh as the same process (rank and
//     incarnation of the agreed round), the membership derives from the
//     previous one (NCCL: ncclCommShrink of its communicator, no unique ID
//     exchanged); otherwise it is new (NCCL: brokered initialization). The
//     members agree on which through the job's store (a vote per member
//     and a decision per round, deleted at the next round), so a member
//     whose last rebuild failed, and which forgot its membership, makes
//     everyone start a new one. The votes count against the job's KV quota:
//     a job whose KV is full cannot rebuild. Gloo makes new contexts either way; NCCL splits the
//     groups from the membership's communicator.
//   - State. At each rebuild, the lowest-ranked member that holds the state
//     broadcasts every tensor `options.state` returns to all members, whose
//     tensors are overwritten once every tensor has arrived (a transfer cut
//     short leaves them as they were). So a member that lacked it (a
//     process that joined as a replacement, or a rank whose replica was
//     broken) takes it, and members that a half-failed step left one step
//     apart (its collective completed on some and failed on others) agree
//     again. The cost is one broadcast of the state per reconfiguration.
//   - The old groups are aborted before the new ones are made, and the
//     Runtime aborts every group with a lost rank as soon as a heartbeat
//     names it, so a collective of an old epoch fails fast, naming the
//     loss, instead of hanging.
//
// Collective calls: Create and Sync are collective among the live ranks
// (members and not), in the same order on every rank. A replacement counts
// as live from its Join (Runtime::Init): call Create right after Init, since
// the others' rebuild waits for it.
//
// Limits. Making the new groups is bounded by the backend's own timeouts
// (Gloo's op timeout, NCCL's init_timeout), not by `timeout`, and a rank
// that dies while they are made is noticed only then. With NCCL an abort is
// local: a peer blocked in an old collective waits for the Runtime's abort
// (a heartbeat naming the loss) or the watchdog, not for a closed
// connection. A DeviceMesh of an earlier epoch that the application still
// holds keeps that epoch's membership (NCCL: its communicator) allocated;
// do not use it: its groups are aborted, and a Flatten of it would wait for
// members that are gone until init_timeout.
//
// A process holds the state when it started with the job (it joined in
// membership epoch 0) or received it at a reconfiguration; a process that
// joined later (a replacement) does not until it receives it.
//
// Errors: Create: FAILED_PRECONDITION when the job does not recover in
// place (JoinInfo::in_place) or has no live replica; INVALID_ARGUMENT for a
// dim that is not one of the mesh's or a bad shape. Sync: the job's error
// once it failed; AliveRanks' (DEADLINE_EXCEEDED naming the live ranks that
// did not call within `timeout`); the factory's; INVALID_ARGUMENT when this
// process's state differs from the donor's in count, dtype or element
// count (its members' group is aborted, so the others fail too);
// FAILED_PRECONDITION when a member lacks the state and no member holds it,
// or when no replica is whole. After an error, Sync may be called again: a
// reconfiguration cut short goes straight to the next AliveRanks round.
//
// Thread safety: not thread-safe; one thread drives it, as the step loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mesh/device_mesh.h"
#include "mesh/process_group.h"
#include "mesh/runtime.h"
#include "mesh/tensor.h"

namespace mesh {

struct ElasticMeshOptions {
  // The dim whose replicas drop. Empty: the job's (JoinInfo::in_place_dim),
  // else "dp".
  std::string dim;
  // The job's mesh; empty: JoinInfo's mesh_shape and mesh_dim_names.
  std::vector<int64_t> shape;
  std::vector<std::string> dim_names;
  // The application's state (torchft's state_dict): views of the tensors a
  // member that lacks it takes from a live peer. Called at each
  // reconfiguration that needs a transfer, on every member; each returns
  // tensors of the same count, dtypes and element counts, on `device`.
  // Null: nothing is transferred.
  std::function<absl::StatusOr<std::vector<Tensor>>()> state;
  // Where the groups' collectives run: CPU for Gloo, the rank's CUDA device
  // for NCCL. The small tensors of the protocol are made there.
  Device device = Device::Cpu();
  // Bound on AliveRanks, on each of Sync's own collectives (the vote and
  // the state transfer) and on a non-member's wait for a membership change.
  // Making the new groups is bounded by the backend's timeouts instead (see
  // Limits above).
  absl::Duration timeout = absl::Minutes(5);
};

class ElasticMesh {
 public:
  // Collective among the live ranks: checks the options and runs the first
  // reconfiguration. `runtime` must outlive the result.
  static absl::StatusOr<std::unique_ptr<ElasticMesh>> Create(Runtime& runtime,
                                                             ElasticMeshOptions options = {});

  ElasticMesh(const ElasticMesh&) = delete;
  ElasticMesh& operator=(const ElasticMesh&) = delete;

  // Collective among the live ranks, once per step before its collectives.
  // The first call after Create returns true at once: Create's own
  // reconfiguration stands for it (so a replacement, whose Create joins the
  // round the others' Sync began, stays in step with them).
  // Returns true when the ranks reconfigured (the membership changed, or a
  // collective of the last mesh failed): the mesh and its groups are new.
  // False when the members carry on with the mesh they have. Errors: see
  // the top of this file.
  absl::StatusOr<bool> Sync();

  // Whether this rank is in the current mesh (its replica is whole).
  bool is_member() const { return mesh_.has_value(); }
  // The mesh of the members; requires is_member().
  const DeviceMesh& mesh() const;
  // The group of every member, in rank order; null unless is_member().
  const std::shared_ptr<ProcessGroup>& members_group() const { return members_group_; }
  // The members (job ranks, ascending) of the latest reconfiguration.
  const std::vector<int>& members() const { return members_; }
  // Replicas along the dim in the current mesh.
  int64_t replicas() const { return replicas_; }
  // The dim whose replicas drop.
  const std::string& dim() const { return dim_; }
  // The membership epoch and AliveRanks round of the latest
  // reconfiguration.
  int64_t membership_epoch() const { return epoch_; }
  int64_t round() const { return round_; }
  // Whether this process holds the state (see the top of this file).
  bool has_state() const { return has_state_; }
  // Whether the latest reconfiguration transferred the state, and from
  // which rank.
  std::optional<int> last_donor() const { return last_donor_; }
  // Whether the latest rebuild, which succeeded, derived the members'
  // Membership from the one before rather than making a new one
  // (ProcessGroupFactory::NewMembership): true when every member was a
  // member of the previous mesh as the same process and still held it.
  // What deriving saves is the backend's: NCCL >= 2.27 shrinks (or keeps)
  // the members' communicator instead of initializing one from a brokered
  // ID; Gloo makes its contexts anew either way.
  bool membership_derived() const { return membership_derived_; }

 private:
  ElasticMesh(Runtime& runtime, ElasticMeshOptions options, MeshLayout job_layout, int dim_index);

  // Drops the mesh, then AliveRanks, then the mesh, groups and state of its
  // live set.
  absl::StatusOr<bool> Reconfigure();
  // Whether a group of the current mesh (or the members' group) is aborted.
  bool AnyGroupBroken() const;
  // Not a member: waits (up to options_.timeout) until the membership epoch
  // differs from epoch_.
  absl::Status AwaitEpochChange();
  // The members' state after a rebuild: from the lowest-ranked holder to
  // every member, when one lacks it.
  absl::Status TransferState();
  // Whether the members derive the new membership from their previous one:
  // each member publishes under this round's key in the job's store which
  // one it can derive from (`can_derive`: the previous membership's round);
  // the lowest member reads every vote and publishes the decision, derive
  // only where every member named the same one, which the others read.
  absl::StatusOr<bool> AgreeToDerive(bool can_derive);
  // Aborts this process's groups of the current mesh with `reason`.
  void Drop(const absl::Status& reason);

  Runtime& runtime_;
  const ElasticMeshOptions options_;
  // The job's whole mesh, and the index of dim_ in it.
  const MeshLayout job_layout_;
  const int dim_index_;
  const std::string dim_;

  std::optional<DeviceMesh> mesh_;
  std::shared_ptr<ProcessGroup> members_group_;
  // The members' Membership (ProcessGroupFactory::NewMembership), the next
  // one's source; kept by a member after a successful rebuild only.
  std::shared_ptr<Membership> membership_;
  int64_t membership_round_ = -1;  // The round that made membership_.
  // The keys this process wrote in its latest AgreeToDerive (its vote, and
  // as the counting member the decision), deleted once every live rank is
  // past that round.
  std::vector<std::string> vote_keys_;
  std::vector<int> members_;
  // Incarnation of each member, by position in members_.
  std::vector<uint64_t> incarnations_;
  int64_t replicas_ = 0;
  int64_t epoch_ = -1;
  int64_t round_ = 0;
  // Set by Create; the first Sync returns true without a collective.
  bool created_ = true;
  // A reconfiguration began and has not completed: the next Sync goes
  // straight to AliveRanks.
  bool unfinished_ = false;
  bool has_state_ = false;
  std::optional<int> last_donor_;
  bool membership_derived_ = false;
};

}  // namespace mesh
