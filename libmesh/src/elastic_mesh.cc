#include "mesh/elastic_mesh.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/duration_format.h"
#include "mesh/dtype.h"

namespace mesh {

namespace {

// How long an op aborted after its deadline may take to let go of its
// tensors.
constexpr absl::Duration kAbortBound = absl::Seconds(30);

// Waits for `work` up to `timeout`. Past it, aborts the op's group (a
// collective cannot be cancelled on one rank alone) and waits until the op
// has let go of its tensors, so the caller may free them on any return.
absl::Status WaitOrAbort(Work& work, absl::Duration timeout) {
  absl::Status status = work.Wait(timeout);
  if (status.code() != absl::StatusCode::kDeadlineExceeded || work.IsCompleted()) return status;
  work.Abort(status);
  (void)work.Wait(kAbortBound);
  return status;
}

// Runs `op` over `values` (int64) in a tensor of its own on `device`, and
// reads the result back into `values`. The tensor owns its memory and the op
// holds it, so nothing the caller frees is ever written to.
absl::Status Int64Collective(
    std::vector<int64_t>& values, const Device& device, absl::Duration timeout,
    const std::function<absl::StatusOr<ProcessGroup::WorkPtr>(Tensor)>& op) {
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor host = Tensor::Contiguous(values.data(), DType::kInt64, {n});
  absl::StatusOr<Tensor> owned = Tensor::Empty(DType::kInt64, {n}, device);
  if (!owned.ok()) return owned.status();
  if (absl::Status s = CopyTensor(*owned, host); !s.ok()) return s;
  absl::StatusOr<ProcessGroup::WorkPtr> work = op(*owned);
  if (!work.ok()) return work.status();
  if (absl::Status s = WaitOrAbort(**work, timeout); !s.ok()) return s;
  return CopyTensor(host, *owned);
}

absl::Status WithContext(const absl::Status& status, absl::string_view what) {
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ElasticMesh>> ElasticMesh::Create(Runtime& runtime,
                                                                 ElasticMeshOptions options) {
  const JoinInfo& info = runtime.info();
  if (!info.in_place) {
    return absl::FailedPreconditionError(
        absl::StrCat("ElasticMesh needs a job with in-place recovery (restart_policy IN_PLACE, "
                     "or CreateJob in_place); job ",
                     info.job_id, " restarts every rank on a failure"));
  }
  if (options.timeout <= absl::ZeroDuration() || options.timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError("ElasticMesh timeout must be positive and finite");
  }
  if (options.shape.empty()) {
    options.shape = info.mesh_shape;
    if (options.dim_names.empty()) options.dim_names = info.mesh_dim_names;
  }
  if (options.dim.empty()) options.dim = info.in_place_dim.empty() ? "dp" : info.in_place_dim;
  absl::StatusOr<MeshLayout> layout =
      MeshLayout::Create(options.shape, options.dim_names, runtime.world_size());
  if (!layout.ok()) return layout.status();
  absl::StatusOr<int> dim = layout->DimIndex(options.dim);
  if (!dim.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("ElasticMesh dim: ", dim.status().message()));
  }
  std::unique_ptr<ElasticMesh> mesh(
      new ElasticMesh(runtime, std::move(options), *std::move(layout), *dim));
  absl::StatusOr<bool> first = mesh->Reconfigure();
  if (!first.ok()) return first.status();
  return mesh;
}

ElasticMesh::ElasticMesh(Runtime& runtime, ElasticMeshOptions options, MeshLayout job_layout,
                         int dim_index)
    : runtime_(runtime),
      options_(std::move(options)),
      job_layout_(std::move(job_layout)),
      dim_index_(dim_index),
      dim_(options_.dim),
      // A process that joined in epoch 0 started with the job.
      has_state_(runtime.info().membership_epoch == 0) {}

const DeviceMesh& ElasticMesh::mesh() const {
  MESH_CHECK(mesh_.has_value(), "ElasticMesh::mesh() of a rank that is not a member");
  return *mesh_;
}

void ElasticMesh::Drop(const absl::Status& reason) {
  if (mesh_.has_value()) {
    for (const std::shared_ptr<ProcessGroup>& group : mesh_->GetAllGroups()) group->Abort(reason);
  }
  if (members_group_ != nullptr) members_group_->Abort(reason);
  mesh_.reset();
  members_group_.reset();
}

absl::StatusOr<bool> ElasticMesh::Sync() {
  if (absl::Status s = runtime_.health(); !s.ok()) return s;
  if (created_) {
    // Create's reconfiguration was this step's: a replacement's Create
    // joins the round that the others' Sync began.
    created_ = false;
    return true;
  }
  if (unfinished_) {
    // The last reconfiguration failed part way (a round timed out, a
    // rebuild failed): the others are in, or coming to, the next round.
  } else if (members_group_ != nullptr) {
    // The members agree on the highest epoch any of them has heard of, and
    // on whether any of them has a broken group (a step's collective failed
    // on it): either one means a rebuild, for all of them alike. A failure
    // of this all-reduce itself means a member is gone.
    std::vector<int64_t> vote = {runtime_.membership_epoch(), AnyGroupBroken() ? 1 : 0};
    const absl::Status agreed = Int64Collective(
        vote, options_.device, options_.timeout,
        [this](Tensor t) { return members_group_->AllReduce(std::move(t), ReduceOp::kMax); });
    if (agreed.ok() && vote[0] == epoch_ && vote[1] == 0) return false;
  } else if (absl::Status s = AwaitEpochChange(); !s.ok()) {
    // Not a member: the members call AliveRanks only once the membership
    // changes, so wait for that instead of parking a round no one joins.
    return s;
  }
  return Reconfigure();
}

bool ElasticMesh::AnyGroupBroken() const {
  if (members_group_ != nullptr && !members_group_->health().ok()) return true;
  if (mesh_.has_value()) {
    for (const std::shared_ptr<ProcessGroup>& group : mesh_->GetAllGroups()) {
      if (!group->health().ok()) return true;
    }
  }
  return false;
}

absl::Status ElasticMesh::AwaitEpochChange() {
  const absl::Time deadline = absl::Now() + options_.timeout;
  while (runtime_.membership_epoch() == epoch_) {
    if (absl::Status s = runtime_.health(); !s.ok()) return s;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", runtime_.rank(), " is not a member (its replica along '", dim_,
                       "' misses a rank) and the membership stayed at epoch ", epoch_, " for ",
                       FormatDurationShort(options_.timeout), "; call Sync again to keep waiting"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ElasticMesh::Reconfigure() {
  const absl::Time start = absl::Now();
  unfinished_ = true;
  // The old mesh goes first: aborting its groups (Gloo closes their
  // connections) ends at once any peer still waiting in one of its
  // collectives, so that every live rank comes to AliveRanks instead of
  // waiting for this one. A retry after a failed round goes straight to
  // AliveRanks again.
  Drop(absl::AbortedError(absl::StrCat("rank ", runtime_.rank(),
                                       " is rebuilding the mesh (membership epoch ",
                                       runtime_.membership_epoch(), ")")));
  // The membership this process held, if any: the new one derives from it
  // when every new member is a process it held. Whatever happens below, a
  // failed reconfiguration leaves this process without one (see the header).
  std::shared_ptr<Membership> previous = std::move(membership_);
  const std::vector<int> previous_members = members_;
  const std::vector<uint64_t> previous_incarnations = incarnations_;
  membership_derived_ = false;
  absl::StatusOr<AliveRanksResult> alive = runtime_.AliveRanks(options_.timeout);
  if (!alive.ok()) return alive.status();
  // Every live rank is past its previous reconfiguration now, so no one
  // reads this process's vote of it any more.
  for (const std::string& key : vote_keys_) (void)runtime_.store()->DeleteKey(key);
  vote_keys_.clear();
  const absl::Time agreed = absl::Now();
  const int self = runtime_.rank();

  // A replica stays while each of its ranks is live.
  std::set<int> live;
  std::vector<uint64_t> incarnation_of(static_cast<size_t>(runtime_.world_size()), 0);
  for (const AliveRanksResult::Rank& r : alive->ranks) {
    live.insert(r.rank);
    incarnation_of[r.rank] = r.incarnation;
  }
  const int64_t extent = job_layout_.Size(dim_index_);
  std::vector<bool> whole(static_cast<size_t>(extent), true);
  for (int rank : job_layout_.ranks()) {
    const std::vector<int64_t> coordinate = job_layout_.Coordinate(rank).value();
    if (!live.contains(rank)) whole[coordinate[dim_index_]] = false;
  }
  // Row-major over the job's mesh without the broken replicas is row-major
  // over the smaller mesh.
  std::vector<int> ordered;
  for (int rank : job_layout_.ranks()) {
    if (whole[job_layout_.Coordinate(rank).value()[dim_index_]]) ordered.push_back(rank);
  }
  const int64_t replicas = std::count(whole.begin(), whole.end(), true);
  std::vector<int> members = ordered;
  std::sort(members.begin(), members.end());
  std::vector<uint64_t> incarnations;
  for (int rank : members) incarnations.push_back(incarnation_of[rank]);

  // Every live rank is in the round, so all of them rebuild together, even
  // when the set is the one they had: some may have come here because a
  // collective of the old mesh failed, which leaves its groups unusable.
  round_ = alive->round;
  epoch_ = alive->membership_epoch;
  members_ = std::move(members);
  incarnations_ = std::move(incarnations);
  replicas_ = replicas;
  last_donor_.reset();
  if (replicas == 0) {
    // Everyone is a non-member: there is no one to carry on with. The state
    // stays as it is, for when a replica is whole again.
    return absl::FailedPreconditionError(absl::StrCat(
        "membership epoch ", epoch_, ": no replica along '", dim_, "' has all of its ranks live"));
  }
  if (!std::binary_search(members_.begin(), members_.end(), self)) {
    // Live, but its replica is broken: it falls behind the members.
    has_state_ = false;
    unfinished_ = false;
    return true;
  }

  std::vector<int64_t> shape = job_layout_.shape();
  shape[dim_index_] = replicas;
  absl::StatusOr<MeshLayout> layout =
      MeshLayout::FromMembers(shape, job_layout_.dim_names(), ordered, runtime_.world_size());
  if (!layout.ok()) return layout.status();
  const std::string name = absl::StrCat("elastic", round_);
  const std::shared_ptr<ProcessGroupFactory>& factory = runtime_.process_group_factory();
  // Derived from the previous membership only where each new member is a
  // process of it (same rank, same incarnation) and holds it: a
  // replacement, a rank that rejoins after a broken replica, or a member
  // whose last rebuild failed makes it a new one for all. The members agree
  // on it through the job's store (AgreeToDerive).
  bool can_derive = previous != nullptr;
  for (size_t i = 0; can_derive && i < members_.size(); ++i) {
    auto it = std::lower_bound(previous_members.begin(), previous_members.end(), members_[i]);
    can_derive = it != previous_members.end() && *it == members_[i] &&
                 previous_incarnations[it - previous_members.begin()] == incarnations_[i];
  }
  absl::StatusOr<bool> derive = AgreeToDerive(can_derive);
  if (!derive.ok()) return WithContext(derive.status(), absl::StrCat("membership epoch ", epoch_));
  absl::StatusOr<std::shared_ptr<Membership>> membership = factory->NewMembership(
      GroupSpec{absl::StrCat(name, "/membership"), 0, members_}, *derive ? previous : nullptr);
  // Dropped here; freed (NCCL: aborted) once no mesh of it is held either.
  previous.reset();
  if (!membership.ok()) {
    return WithContext(membership.status(), absl::StrCat("membership epoch ", epoch_));
  }
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> all = factory->NewGroupsWithin(
      **membership, {GroupSpec{absl::StrCat(name, "/members"), 0, members_}});
  if (!all.ok()) return WithContext(all.status(), absl::StrCat("membership epoch ", epoch_));
  DeviceMeshOptions mesh_options;
  mesh_options.name = name;
  mesh_options.members_only = true;
  mesh_options.membership = *membership;
  // The dim that spans every member (dp of a (n, 1) mesh) shares this group
  // instead of connecting the same ranks again.
  if (members_ == ordered) mesh_options.members_group = (*all)[0];
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(factory, *std::move(layout), mesh_options);
  if (!mesh.ok()) {
    (*all)[0]->Abort(mesh.status());
    return WithContext(mesh.status(), absl::StrCat("membership epoch ", epoch_));
  }
  members_group_ = (*all)[0];
  mesh_ = *std::move(mesh);
  membership_ = *std::move(membership);
  membership_round_ = round_;
  membership_derived_ = *derive;
  const absl::Time built = absl::Now();
  if (absl::Status s = TransferState(); !s.ok()) {
    Drop(s);
    membership_.reset();
    return s;
  }
  unfinished_ = false;
  // One line per rebuild in the worker's log: what a slow recovery spent.
  std::fprintf(stderr,
               "mesh: rank %d: membership epoch %lld, %lld of %lld replicas along '%s' "
               "(AliveRanks %s, groups %s %s, state %s)\n",
               self, static_cast<long long>(epoch_), static_cast<long long>(replicas_),
               static_cast<long long>(job_layout_.Size(dim_index_)), dim_.c_str(),
               FormatDurationShort(agreed - start).c_str(),
               FormatDurationShort(built - agreed).c_str(),
               *derive ? "from the previous membership" : "from a new membership",
               FormatDurationShort(absl::Now() - built).c_str());
  return true;
}

absl::StatusOr<bool> ElasticMesh::AgreeToDerive(bool can_derive) {
  const std::shared_ptr<Store>& store = runtime_.store();
  const std::string prefix = absl::StrCat("mesh/elastic/", dim_, "/round", round_, "/");
  auto vote_key = [&](int rank) { return absl::StrCat(prefix, "derive/", rank); };
  const std::string decision_key = absl::StrCat(prefix, "derived");
  // Which membership this member would derive from, by the round that made
  // it (members that hold one all built it in the same round).
  const std::string mine = can_derive ? absl::StrCat(membership_round_) : "none";
  const int self = runtime_.rank();
  vote_keys_.push_back(vote_key(self));
  if (absl::Status s = store->Set(vote_key(self), mine); !s.ok()) {
    return WithContext(s, "voting on the membership");
  }
  // The lowest member counts the votes and publishes the decision; the
  // others wait for that one key, so the coordinator's work is O(members).
  if (self != members_.front()) {
    absl::StatusOr<std::string> decision = store->Get(decision_key, options_.timeout);
    if (!decision.ok()) {
      return WithContext(decision.status(), absl::StrCat("rank ", members_.front(),
                                                         "'s count of the membership votes"));
    }
    return *decision == "1";
  }
  std::vector<std::string> keys;
  keys.reserve(members_.size());
  for (int rank : members_) keys.push_back(vote_key(rank));
  absl::StatusOr<std::vector<std::string>> votes = store->MultiGet(keys, options_.timeout);
  if (!votes.ok()) return WithContext(votes.status(), "the members' votes on the membership");
  bool derive = can_derive;
  for (const std::string& vote : *votes) derive = derive && vote == mine;
  vote_keys_.push_back(decision_key);
  if (absl::Status s = store->Set(decision_key, derive ? "1" : "0"); !s.ok()) {
    return WithContext(s, "publishing the membership decision");
  }
  return derive;
}

absl::Status ElasticMesh::TransferState() {
  const int self = runtime_.rank();
  // Who holds the state: the lowest rank that does. The donor's state then
  // goes to every member, those that hold one too:
  // a step whose collective failed on some members and completed on others
  // leaves them one step apart, and this makes them agree again.
  constexpr int64_t kNobody = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> vote = {has_state_ ? self : kNobody};
  const absl::Status voted = Int64Collective(
      vote, options_.device, options_.timeout,
      [this](Tensor t) { return members_group_->AllReduce(std::move(t), ReduceOp::kMin); });
  if (!voted.ok()) return WithContext(voted, "membership vote on the state");
  if (vote[0] == kNobody) {
    return absl::FailedPreconditionError(absl::StrCat(
        "membership epoch ", epoch_, ": members [", absl::StrJoin(members_, ", "),
        "] lack the state and none of them holds it (every process that held it is gone)"));
  }
  const int donor = static_cast<int>(vote[0]);
  const int root = static_cast<int>(std::lower_bound(members_.begin(), members_.end(), donor) -
                                    members_.begin());
  if (!options_.state) {
    has_state_ = true;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<Tensor>> state = options_.state();
  if (!state.ok()) return WithContext(state.status(), "ElasticMesh state");
  // The donor's layout of the state, checked by every member before any
  // tensor moves: [count, then dtype and numel of each].
  std::vector<int64_t> header = {static_cast<int64_t>(state->size())};
  for (const Tensor& t : *state) {
    header.push_back(static_cast<int64_t>(t.dtype()));
    header.push_back(t.numel());
  }
  std::vector<int64_t> count = {header[0]};
  auto broadcast = [&](Tensor t) { return members_group_->Broadcast(std::move(t), root); };
  if (absl::Status s = Int64Collective(count, options_.device, options_.timeout, broadcast);
      !s.ok()) {
    return WithContext(s, "broadcasting the state's layout");
  }
  std::vector<int64_t> donor_header(static_cast<size_t>(1 + 2 * std::max<int64_t>(count[0], 0)));
  if (self == donor) donor_header = header;
  donor_header[0] = count[0];
  std::vector<int64_t> body(donor_header.begin() + 1, donor_header.end());
  if (!body.empty()) {
    if (absl::Status s = Int64Collective(body, options_.device, options_.timeout, broadcast);
        !s.ok()) {
      return WithContext(s, "broadcasting the state's layout");
    }
  }
  std::copy(body.begin(), body.end(), donor_header.begin() + 1);
  if (donor_header != header) {
    auto describe = [](const std::vector<int64_t>& h) {
      std::vector<std::string> parts;
      for (size_t i = 1; i + 1 < h.size(); i += 2) {
        parts.push_back(absl::StrCat(DTypeName(static_cast<DType>(h[i])), "[", h[i + 1], "]"));
      }
      return absl::StrCat(h[0], " tensors (", absl::StrJoin(parts, ", "), ")");
    };
    return absl::InvalidArgumentError(absl::StrCat("ElasticMesh state of rank ", self, " is ",
                                                   describe(header), ", but the donor rank ", donor,
                                                   "'s is ", describe(donor_header)));
  }
  // Through tensors of its own: the application's are written only once
  // every tensor has arrived, so a transfer cut short (the donor died)
  // leaves them as they were, and no op left running can write into them.
  std::vector<Tensor> staged;
  for (size_t i = 0; i < state->size(); ++i) {
    const Tensor& t = (*state)[i];
    absl::StatusOr<Tensor> copy = Tensor::Empty(t.dtype(), t.shape(), t.device());
    if (!copy.ok()) return WithContext(copy.status(), absl::StrCat("state tensor ", i));
    if (self == donor) {
      if (absl::Status s = CopyTensor(*copy, t); !s.ok()) {
        return WithContext(s, absl::StrCat("state tensor ", i));
      }
    }
    staged.push_back(*std::move(copy));
  }
  for (size_t i = 0; i < staged.size(); ++i) {
    absl::StatusOr<ProcessGroup::WorkPtr> work = members_group_->Broadcast(staged[i], root);
    if (!work.ok()) return WithContext(work.status(), absl::StrCat("state tensor ", i));
    if (absl::Status s = WaitOrAbort(**work, options_.timeout); !s.ok()) {
      return WithContext(s, absl::StrCat("state tensor ", i));
    }
  }
  if (self != donor) {
    for (size_t i = 0; i < staged.size(); ++i) {
      if (absl::Status s = CopyTensor((*state)[i], staged[i]); !s.ok()) {
        return WithContext(s, absl::StrCat("state tensor ", i));
      }
    }
  }
  if (!has_state_) {
    std::fprintf(stderr, "mesh: rank %d: took the state from rank %d\n", self, donor);
  }
  has_state_ = true;
  last_donor_ = donor;
  return absl::OkStatus();
}

}  // namespace mesh
