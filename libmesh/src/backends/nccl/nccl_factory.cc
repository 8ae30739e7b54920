// NcclProcessGroupFactory and GenerateNcclUniqueId; compiled only when
// MESH_HAVE_NCCL (nccl_unavailable.cc stands in otherwise).
#include "backends/nccl/nccl_factory.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "backends/nccl/nccl_api.h"
#include "backends/nccl/nccl_checks.h"
#include "backends/nccl/nccl_group.h"
#include "backends/nccl/nccl_util.h"
#include "backends/nccl/nccl_watchdog.h"
#include "mesh/build_info.h"

namespace mesh {
namespace nccl {
namespace {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes && kUniqueIdBytes == kNcclUniqueIdBytes,
              "ncclUniqueId changed size");

absl::StatusOr<std::string> GenerateIdBytes(NcclApi& api) {
  ncclUniqueId id;
  if (ncclResult_t r = api.GetUniqueId(&id); r != ncclSuccess) {
    return NcclError(api, "ncclGetUniqueId", r, nullptr);
  }
  return std::string(id.internal, sizeof(id.internal));
}

ncclUniqueId ToUniqueId(const std::string& bytes) {
  ncclUniqueId id;
  std::memcpy(id.internal, bytes.data(), sizeof(id.internal));  // Size checked by the caller.
  return id;
}

std::string GroupName(const GroupSpec& spec) { return absl::StrCat(spec.family, "/", spec.color); }

std::string GroupWhat(absl::string_view name, int rank, int size, int device) {
  return absl::StrCat("NCCL group '", name, "' (rank ", rank, " of ", size, ", cuda:", device, ")");
}

// A split or init that succeeded with different members than the spec means
// ranks passed different specs for one group.
absl::Status CheckCommShape(NcclApi& api, ncclComm_t comm, int size, int rank,
                            absl::string_view what) {
  int count = 0;
  int user_rank = 0;
  if (ncclResult_t r = api.CommCount(comm, &count); r != ncclSuccess) {
    return NcclError(api, absl::StrCat(what, ": ncclCommCount"), r, comm);
  }
  if (ncclResult_t r = api.CommUserRank(comm, &user_rank); r != ncclSuccess) {
    return NcclError(api, absl::StrCat(what, ": ncclCommUserRank"), r, comm);
  }
  if (count != size || user_rank != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": NCCL made a communicator of ", count, " ranks with this one as rank ",
                     user_rank, ", but the spec says ", size, " ranks and rank ", rank,
                     "; the members passed different specs for this group"));
  }
  return absl::OkStatus();
}

// The communicator of a membership, made for deriving groups only: no op
// ever runs on it, so a lost member leaves it quiet and it can still be
// shrunk. Released with ncclCommAbort, a local call (members may be gone);
// shared by the memberships of the same ranks.
class MembershipComm {
 public:
  explicit MembershipComm(std::shared_ptr<NcclGroup> group) : group_(std::move(group)) {}
  ~MembershipComm() {
    group_->Abort(
        absl::CancelledError(absl::StrCat(group_->name(), ": membership communicator released")));
  }
  MembershipComm(const MembershipComm&) = delete;
  MembershipComm& operator=(const MembershipComm&) = delete;

  GroupCore& core() const { return *group_->core(); }

 private:
  const std::shared_ptr<NcclGroup> group_;
};

// A membership with its communicator, when NCCL can split (else the
// factory makes plain Memberships and brokers every group).
class NcclMembership final : public Membership {
 public:
  NcclMembership(std::string family, std::vector<int> ranks, uint64_t factory,
                 std::shared_ptr<MembershipComm> comm)
      : Membership(std::move(family), std::move(ranks)),
        factory_(factory),
        comm_(std::move(comm)) {}

  uint64_t factory() const { return factory_; }
  const std::shared_ptr<MembershipComm>& comm() const { return comm_; }

 private:
  const uint64_t factory_;  // NcclFactory::id_ of the factory that made it.
  const std::shared_ptr<MembershipComm> comm_;
};

class NcclFactory final : public NcclProcessGroupFactory {
 public:
  NcclFactory(NcclApi& api, NcclProcessGroupFactoryOptions options, bool split,
              std::unique_ptr<NcclUniqueIdBroker> broker, std::shared_ptr<Watchdog> watchdog,
              std::shared_ptr<NcclGroup> world)
      : api_(api),
        options_(std::move(options)),
        split_(split),
        broker_(std::move(broker)),
        watchdog_(std::move(watchdog)),
        world_(std::move(world)) {
    absl::MutexLock lock(&mu_);
    cores_.push_back(world_->core());
  }

  int world_rank() const override { return options_.world_rank; }
  int world_size() const override { return options_.world_size; }
  const Device& device() const override { return options_.device; }
  bool splits_communicators() const override { return split_; }

  absl::StatusOr<std::shared_ptr<ProcessGroup>> World() override { return world_; }

  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroups(
      const std::vector<GroupSpec>& specs) override {
    return MakeGroups(specs, /*members_only=*/false);
  }
  // Brokered initialization of every group, never a split: the world
  // communicator's other ranks do not take part.
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroupsAmongMembers(
      const std::vector<GroupSpec>& specs) override {
    return MakeGroups(specs, /*members_only=*/true);
  }

  absl::StatusOr<std::shared_ptr<Membership>> NewMembership(
      const GroupSpec& spec, const std::shared_ptr<Membership>& previous) override;
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroupsWithin(
      const Membership& membership, const std::vector<GroupSpec>& specs) override;

  void AbortAll(absl::Status reason) override;

 private:
  // NewGroups, or with `members_only` NewGroupsAmongMembers; with
  // `split_from` (members_only too) NewGroupsWithin: every group a split of
  // that communicator.
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> MakeGroups(
      const std::vector<GroupSpec>& specs, bool members_only, GroupCore* split_from = nullptr);
  // The calling rank's rank in the membership of `spec` (its index among
  // the ascending ranks).
  int MembershipRank(const GroupSpec& spec) const;
  // Checks `comm`'s shape and wraps it as the communicator of a new
  // NcclMembership, registered for AbortAll.
  absl::StatusOr<std::shared_ptr<Membership>> AdoptMembership(const GroupSpec& spec, int rank,
                                                              ncclComm_t comm);
  // The AbortAll reason, else OK.
  absl::Status Cancelled() const;
  // Wraps `comm` in a group and registers it for AbortAll (aborting it at
  // once if AbortAll came first).
  absl::StatusOr<std::shared_ptr<NcclGroup>> Adopt(const GroupSpec& spec, int group_rank,
                                                   ncclComm_t comm);

  // Unique among the factories of this process (an address could be
  // reused): which memberships are this factory's.
  static inline std::atomic<uint64_t> next_id_{1};
  const uint64_t id_ = next_id_.fetch_add(1, std::memory_order_relaxed);
  NcclApi& api_;
  const NcclProcessGroupFactoryOptions options_;
  const bool split_;
  const std::unique_ptr<NcclUniqueIdBroker> broker_;  // May be null.
  const std::shared_ptr<Watchdog> watchdog_;
  // Destroyed before watchdog_ (declared after it), though the group keeps
  // its own reference to the watchdog anyway.
  const std::shared_ptr<NcclGroup> world_;

  // NewGroups is collective: one call at a time, numbered.
  absl::Mutex new_groups_mu_;
  uint64_t calls_ ABSL_GUARDED_BY(new_groups_mu_) = 0;

  std::atomic<bool> aborted_{false};
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(new_groups_mu_);
  absl::Status abort_reason_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<GroupCore>> cores_ ABSL_GUARDED_BY(mu_);
};

absl::Status NcclFactory::Cancelled() const {
  if (!aborted_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return abort_reason_;
}

absl::StatusOr<std::shared_ptr<NcclGroup>> NcclFactory::Adopt(const GroupSpec& spec, int group_rank,
                                                              ncclComm_t comm) {
  GroupCore::Params params;
  params.name = GroupName(spec);
  params.rank = group_rank;
  params.size = static_cast<int>(spec.global_ranks.size());
  params.device = options_.device.index();
  params.options = options_.group_options;
  params.caps = BuiltCaps();
  params.stream_mode = options_.stream_mode;
  absl::StatusOr<std::shared_ptr<NcclGroup>> group = NcclGroup::Create(
      api_, std::move(params), spec.global_ranks, comm, watchdog_, options_.destroy_timeout);
  if (!group.ok()) return group.status();
  absl::Status reason;
  {
    absl::MutexLock lock(&mu_);
    if (abort_reason_.ok()) {
      // Groups come and go with every in-place rebuild: forget the dead.
      std::erase_if(cores_, [](const std::weak_ptr<GroupCore>& core) { return core.expired(); });
      cores_.push_back((*group)->core());
    } else {
      reason = abort_reason_;
    }
  }
  if (!reason.ok()) {
    (*group)->Abort(reason);
    return reason;
  }
  return group;
}

absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NcclFactory::MakeGroups(
    const std::vector<GroupSpec>& specs, bool members_only, GroupCore* split_from) {
  absl::MutexLock lock(&new_groups_mu_);
  if (absl::Status s = Cancelled(); !s.ok()) return s;
  absl::StatusOr<std::vector<int>> group_ranks =
      CheckGroupSpecs(specs, options_.world_rank, options_.world_size);
  if (!group_ranks.ok()) return group_ranks.status();
  // Members-only calls are not numbered: their callers may have made
  // different numbers of calls before.
  const uint64_t call = members_only ? kMembersOnlyCall : calls_++;
  const bool split = split_from != nullptr || (split_ && !members_only);
  GroupCore& parent = split_from != nullptr ? *split_from : *world_->core();
  const absl::Time deadline = absl::Now() + options_.init_timeout;
  const int device = options_.device.index();
  auto cancelled = [this] { return Cancelled(); };

  std::vector<std::string> ids;
  if (!split) {
    if (broker_ == nullptr) {
      return absl::FailedPreconditionError(
          members_only
              ? "NCCL NewGroupsAmongMembers: building groups from unique ids needs a store in "
                "NcclProcessGroupFactoryOptions"
              : "NCCL NewGroups: building groups from unique ids (ncclCommSplit is unavailable or "
                "disabled) needs a store in NcclProcessGroupFactoryOptions");
    }
    absl::StatusOr<std::vector<std::string>> exchanged = ExchangeUniqueIds(
        specs, options_.world_rank, call, *broker_, [this] { return GenerateIdBytes(api_); },
        deadline);
    if (!exchanged.ok()) return exchanged.status();
    ids = *std::move(exchanged);
  }

  std::vector<std::shared_ptr<ProcessGroup>> groups;
  groups.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const GroupSpec& spec = specs[i];
    const int group_rank = (*group_ranks)[i];
    const int size = static_cast<int>(spec.global_ranks.size());
    const std::string name = GroupName(spec);
    const std::string what = GroupWhat(name, group_rank, size, device);
    const char* comm_name = PersistentName(name);  // NCCL keeps the pointer.
    absl::StatusOr<ncclComm_t> comm =
        split ? parent.Split(spec.color, group_rank, comm_name, what, deadline, cancelled)
              : InitComm(api_, ToUniqueId(ids[i]), size, group_rank, device, comm_name, what,
                         deadline, cancelled);
    if (!comm.ok()) return comm.status();
    if (absl::Status s = CheckCommShape(api_, *comm, size, group_rank, what); !s.ok()) {
      api_.CommAbort(*comm);
      return s;
    }
    absl::StatusOr<std::shared_ptr<NcclGroup>> group = Adopt(spec, group_rank, *comm);
    if (!group.ok()) return group.status();
    groups.push_back(*std::move(group));
  }
  return groups;
}

absl::StatusOr<std::shared_ptr<Membership>> NcclFactory::NewMembership(
    const GroupSpec& spec, const std::shared_ptr<Membership>& previous) {
  if (absl::Status s = CheckMembershipSpec(spec, options_.world_rank, options_.world_size);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckWithinPrevious(spec, previous.get()); !s.ok()) return s;
  if (!split_ || SplitSharesResources()) {
    // Nothing could be split from a communicator of the members, or its
    // splits would share its abort flag (so that aborting an old mesh's
    // groups would abort it too), so none is made: NewGroupsWithin brokers
    // every group.
    if (absl::Status s = Cancelled(); !s.ok()) return s;
    return std::make_shared<Membership>(spec.family, spec.global_ranks);
  }
  const auto* before = dynamic_cast<const NcclMembership*>(previous.get());
  if (before != nullptr && before->factory() == id_) {
    if (before->ranks() == spec.global_ranks) {
      if (absl::Status s = Cancelled(); !s.ok()) return s;
      return std::make_shared<NcclMembership>(spec.family, spec.global_ranks, id_, before->comm());
    }
    if (ShrinkAvailable(api_)) {
      absl::MutexLock lock(&new_groups_mu_);
      if (absl::Status s = Cancelled(); !s.ok()) return s;
      // The excluded members, as ranks of the previous communicator (its
      // members in ascending world-rank order).
      std::vector<int> exclude;
      for (size_t i = 0; i < before->ranks().size(); ++i) {
        if (!std::binary_search(spec.global_ranks.begin(), spec.global_ranks.end(),
                                before->ranks()[i])) {
          exclude.push_back(static_cast<int>(i));
        }
      }
      const int rank = MembershipRank(spec);
      const int size = static_cast<int>(spec.global_ranks.size());
      const std::string name = GroupName(spec);
      const std::string what = GroupWhat(name, rank, size, options_.device.index());
      absl::StatusOr<ncclComm_t> comm = before->comm()->core().Shrink(
          std::move(exclude), PersistentName(name), what, absl::Now() + options_.init_timeout,
          [this] { return Cancelled(); });
      if (!comm.ok()) return comm.status();
      return AdoptMembership(spec, rank, *comm);
    }
    // Before NCCL 2.27: a new communicator from a brokered unique ID.
  }
  absl::MutexLock lock(&new_groups_mu_);
  if (absl::Status s = Cancelled(); !s.ok()) return s;
  if (broker_ == nullptr) {
    return absl::FailedPreconditionError(
        "NCCL NewMembership: a communicator of the members comes from a unique id, which needs a "
        "store in NcclProcessGroupFactoryOptions");
  }
  const absl::Time deadline = absl::Now() + options_.init_timeout;
  absl::StatusOr<std::vector<std::string>> ids = ExchangeUniqueIds(
      {spec}, options_.world_rank, kMembersOnlyCall, *broker_,
      [this] { return GenerateIdBytes(api_); }, deadline);
  if (!ids.ok()) return ids.status();
  const int rank = MembershipRank(spec);
  const int size = static_cast<int>(spec.global_ranks.size());
  const std::string name = GroupName(spec);
  const std::string what = GroupWhat(name, rank, size, options_.device.index());
  absl::StatusOr<ncclComm_t> comm =
      InitComm(api_, ToUniqueId((*ids)[0]), size, rank, options_.device.index(),
               PersistentName(name), what, deadline, [this] { return Cancelled(); });
  if (!comm.ok()) return comm.status();
  return AdoptMembership(spec, rank, *comm);
}

int NcclFactory::MembershipRank(const GroupSpec& spec) const {
  return static_cast<int>(
      std::lower_bound(spec.global_ranks.begin(), spec.global_ranks.end(), options_.world_rank) -
      spec.global_ranks.begin());
}

absl::StatusOr<std::shared_ptr<Membership>> NcclFactory::AdoptMembership(const GroupSpec& spec,
                                                                         int rank,
                                                                         ncclComm_t comm) {
  const int size = static_cast<int>(spec.global_ranks.size());
  if (absl::Status s = CheckCommShape(
          api_, comm, size, rank, GroupWhat(GroupName(spec), rank, size, options_.device.index()));
      !s.ok()) {
    api_.CommAbort(comm);
    return s;
  }
  absl::StatusOr<std::shared_ptr<NcclGroup>> group = Adopt(spec, rank, comm);
  if (!group.ok()) return group.status();
  return std::make_shared<NcclMembership>(spec.family, spec.global_ranks, id_,
                                          std::make_shared<MembershipComm>(*std::move(group)));
}

absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NcclFactory::NewGroupsWithin(
    const Membership& membership, const std::vector<GroupSpec>& specs) {
  if (absl::Status s = CheckGroupsWithin(membership, specs); !s.ok()) return s;
  const auto* within = dynamic_cast<const NcclMembership*>(&membership);
  if (within == nullptr || within->factory() != id_) return MakeGroups(specs, true);
  return MakeGroups(specs, true, &within->comm()->core());
}

void NcclFactory::AbortAll(absl::Status reason) {
  if (reason.ok()) reason = absl::AbortedError("NCCL process groups aborted without a reason");
  std::vector<std::shared_ptr<GroupCore>> live;
  {
    absl::MutexLock lock(&mu_);
    if (abort_reason_.ok()) abort_reason_ = std::move(reason);
    aborted_.store(true, std::memory_order_release);
    reason = abort_reason_;
    for (const std::weak_ptr<GroupCore>& weak : cores_) {
      if (std::shared_ptr<GroupCore> core = weak.lock()) live.push_back(std::move(core));
    }
  }
  for (const std::shared_ptr<GroupCore>& core : live) core->Abort(reason);
}

// The root unique IDs of a scalable world init, in root order: root 0's
// is the world ID; root i (rank i * ranks_per_root) makes one and
// publishes it, and every rank fetches those of roots 1.. in one Get.
absl::StatusOr<std::vector<ncclUniqueId>> WorldRootIds(
    NcclApi& api, const NcclProcessGroupFactoryOptions& options, NcclUniqueIdBroker* broker,
    absl::Time deadline) {
  const int roots = (options.world_size + options.ranks_per_root - 1) / options.ranks_per_root;
  std::vector<ncclUniqueId> ids = {ToUniqueId(options.world_unique_id)};
  if (roots == 1) return ids;
  if (broker == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL world init with ", roots,
        " roots needs a unique-ID broker or a store to exchange their IDs; none was given"));
  }
  std::vector<std::string> keys;
  for (int root = 1; root < roots; ++root) keys.push_back(WorldRootKey(root));
  if (options.world_rank % options.ranks_per_root == 0) {
    const int root = options.world_rank / options.ranks_per_root;
    absl::StatusOr<std::string> mine = GenerateIdBytes(api);
    if (!mine.ok()) return mine.status();
    const std::pair<std::string, std::string> published[] = {{keys[root - 1], *mine}};
    if (absl::Status s = broker->Publish(published); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("publishing NCCL world root ", root,
                                                 "'s unique ID: ", s.message()));
    }
  }
  absl::StatusOr<std::vector<std::string>> fetched = broker->Get(keys, deadline);
  if (!fetched.ok()) {
    return absl::Status(fetched.status().code(), absl::StrCat("NCCL world init with ", roots,
                                                              " roots: fetching their unique IDs: ",
                                                              fetched.status().message()));
  }
  for (const std::string& id : *fetched) ids.push_back(ToUniqueId(id));
  return ids;
}

}  // namespace

std::string WorldRootKey(int root) { return absl::StrCat("nccl/world-root/", root); }

absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> CreateNcclFactory(
    NcclProcessGroupFactoryOptions options, std::unique_ptr<NcclUniqueIdBroker> broker) {
  return CreateNcclFactory(std::move(options), std::move(broker), RealNcclApi());
}

absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> CreateNcclFactory(
    NcclProcessGroupFactoryOptions options, std::unique_ptr<NcclUniqueIdBroker> broker,
    NcclApi& api) {
  if (absl::Status s = CheckFactoryOptions(options); !s.ok()) return s;
  bool split = false;
  switch (options.group_creation) {
    case NcclGroupCreation::kAuto:
      split = SplitAvailable(api);
      break;
    case NcclGroupCreation::kSplit:
      if (!SplitAvailable(api)) {
        return absl::FailedPreconditionError(
            "NCCL factory options: group_creation is kSplit, but ncclCommSplit needs NCCL >= "
            "2.19");
      }
      split = true;
      break;
    case NcclGroupCreation::kUniqueIds:
      split = false;
      break;
  }
  if (broker == nullptr && options.store != nullptr) {
    broker = std::make_unique<StoreUniqueIdBroker>(options.store);
  }
  const int device = options.device.index();
  int visible = 0;
  if (api.GetDeviceCount(&visible) != cudaSuccess) {
    api.GetLastCudaError();  // No driver or no device; clear it for later calls.
    visible = 0;
  }
  if (visible == 0) {
    return absl::FailedPreconditionError(
        "the NCCL backend needs a CUDA device, but none is visible to this process (no driver, "
        "no GPU, or CUDA_VISIBLE_DEVICES hides them all)");
  }
  if (device >= visible) {
    return absl::FailedPreconditionError(absl::StrCat("NCCL factory options: device cuda:", device,
                                                      " is not visible; this process sees ",
                                                      visible, " CUDA device(s)"));
  }

  const std::string what = GroupWhat("world", options.world_rank, options.world_size, device);
  const absl::Time deadline = absl::Now() + options.init_timeout;
  bool scalable = false;
  switch (options.world_init) {
    case NcclWorldInit::kAuto:
      scalable = options.world_size > options.ranks_per_root && ScalableInitAvailable(api);
      break;
    case NcclWorldInit::kSingleRoot:
      break;
    case NcclWorldInit::kScalable:
      if (!ScalableInitAvailable(api)) {
        return absl::FailedPreconditionError(
            "NCCL factory options: world_init is kScalable, but ncclCommInitRankScalable needs "
            "NCCL >= 2.23");
      }
      scalable = true;
      break;
  }
  absl::StatusOr<ncclComm_t> comm;
  if (scalable) {
    absl::StatusOr<std::vector<ncclUniqueId>> ids =
        WorldRootIds(api, options, broker.get(), deadline);
    if (!ids.ok()) return ids.status();
    comm = InitCommScalable(api, *std::move(ids), options.world_size, options.world_rank, device,
                            "world", what, deadline, [] { return absl::OkStatus(); });
  } else {
    comm =
        InitComm(api, ToUniqueId(options.world_unique_id), options.world_size, options.world_rank,
                 device, "world", what, deadline, [] { return absl::OkStatus(); });
  }
  if (!comm.ok()) return comm.status();

  auto watchdog = std::make_shared<Watchdog>(options.watchdog_interval);
  GroupCore::Params params;
  params.name = "world";
  params.rank = options.world_rank;
  params.size = options.world_size;
  params.device = device;
  params.options = options.group_options;
  params.caps = BuiltCaps();
  params.stream_mode = options.stream_mode;
  std::vector<int> ranks(options.world_size);
  std::iota(ranks.begin(), ranks.end(), 0);
  absl::StatusOr<std::shared_ptr<NcclGroup>> world = NcclGroup::Create(
      api, std::move(params), std::move(ranks), *comm, watchdog, options.destroy_timeout);
  if (!world.ok()) return world.status();
  return std::unique_ptr<NcclProcessGroupFactory>(new NcclFactory(
      api, std::move(options), split, std::move(broker), std::move(watchdog), *std::move(world)));
}

}  // namespace nccl

absl::StatusOr<std::string> GenerateNcclUniqueId() {
  return nccl::GenerateIdBytes(nccl::RealNcclApi());
}

absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> NcclProcessGroupFactory::Create(
    NcclProcessGroupFactoryOptions options) {
  return nccl::CreateNcclFactory(std::move(options), nullptr);
}

}  // namespace mesh
