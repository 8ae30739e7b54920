#include "mesh/progress.h"

#include <time.h>

#include <algorithm>
#include <array>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace mesh {

namespace {

constexpr std::array<absl::string_view, kNumCollectiveKinds> kKindNames = {
    "none",           "all_reduce", "broadcast", "reduce", "all_gather",
    "reduce_scatter", "all_to_all", "barrier",   "other",
};

}  // namespace

absl::Time ProgressNow() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return absl::TimeFromTimespec(ts);
}

namespace internal {

void ProgressSpinLock::Lock() {
  while (held_.test_and_set(std::memory_order_acquire)) {
    while (held_.test(std::memory_order_relaxed)) std::this_thread::yield();
  }
}

}  // namespace internal

absl::string_view CollectiveKindName(CollectiveKind kind) {
  const auto index = static_cast<size_t>(kind);
  return index < kKindNames.size() ? kKindNames[index] : "other";
}

CollectiveKind CollectiveKindFromName(absl::string_view name) {
  for (size_t i = 0; i < kKindNames.size(); ++i) {
    if (kKindNames[i] == name) return static_cast<CollectiveKind>(i);
  }
  return CollectiveKind::kOther;
}

GroupProgress::GroupProgress(std::string name, std::vector<int> members, absl::Time now)
    : name_(std::move(name)), members_(std::move(members)), completed_at_(now) {}

uint64_t GroupProgress::Enter(CollectiveKind kind, absl::Time now) {
  internal::ProgressSpinLockHolder lock(&mu_);
  const uint64_t seq = next_seq_++;
  pending_.push_back(Op{seq, kind, now, false, {}});
  return seq;
}

void GroupProgress::Attach(uint64_t seq, std::shared_ptr<Work> work) {
  std::shared_ptr<Work> released;  // Dropped after unlocking.
  internal::ProgressSpinLockHolder lock(&mu_);
  if (pending_.empty() || seq < pending_.front().seq) return;
  const uint64_t index = seq - pending_.front().seq;
  if (index >= pending_.size()) return;
  pending_[index].work = work;
  if (seq >= latest_seq_) {
    released = std::move(latest_work_);
    latest_work_ = std::move(work);
    latest_seq_ = seq;
  }
}

void GroupProgress::Complete(uint64_t seq, absl::Time now) {
  std::shared_ptr<Work> released;
  internal::ProgressSpinLockHolder lock(&mu_);
  if (pending_.empty() || seq < pending_.front().seq) return;
  const uint64_t index = seq - pending_.front().seq;
  if (index >= pending_.size()) return;
  pending_[index].done = true;
  pending_[index].work.reset();
  if (seq == latest_seq_) released = std::move(latest_work_);
  AdvanceLocked(now);
}

void GroupProgress::AdvanceLocked(absl::Time now) {
  while (!pending_.empty() && pending_.front().done) {
    completed_ = pending_.front().seq;
    completed_kind_ = pending_.front().kind;
    completed_at_ = now;
    pending_.pop_front();
  }
}

std::shared_ptr<Work> GroupProgress::CompleteThroughLocked(uint64_t seq, absl::Time now) {
  for (Op& op : pending_) {
    if (op.seq > seq) break;
    op.done = true;
    op.work.reset();
  }
  std::shared_ptr<Work> released;
  if (latest_seq_ <= seq) released = std::move(latest_work_);
  AdvanceLocked(now);
  return released;
}

GroupProgressSnapshot GroupProgress::Snapshot(absl::Time now) {
  // Ops may have completed with nobody looking (an async op never waited
  // on, an NCCL op the host has not synchronized with). Their completion
  // time is unknown; now is the best bound. Works are asked outside the
  // lock: IsCompleted may query a device.
  std::shared_ptr<Work> latest;
  uint64_t latest_seq = 0;
  {
    internal::ProgressSpinLockHolder lock(&mu_);
    latest = latest_work_;
    latest_seq = latest_seq_;
  }
  if (latest != nullptr && latest->IsCompleted()) {
    std::shared_ptr<Work> released;
    {
      internal::ProgressSpinLockHolder lock(&mu_);
      released = CompleteThroughLocked(latest_seq, now);
    }
  }
  latest.reset();
  while (true) {
    uint64_t seq = 0;
    std::shared_ptr<Work> work;
    {
      internal::ProgressSpinLockHolder lock(&mu_);
      if (pending_.empty()) break;
      seq = pending_.front().seq;
      work = pending_.front().work.lock();
    }
    if (work == nullptr || !work->IsCompleted()) break;
    Complete(seq, now);
  }
  internal::ProgressSpinLockHolder lock(&mu_);
  GroupProgressSnapshot snapshot;
  snapshot.entered = next_seq_ - 1;
  snapshot.completed = completed_;
  snapshot.completed_kind = completed_kind_;
  snapshot.since_completed = std::max(absl::ZeroDuration(), now - completed_at_);
  if (!pending_.empty()) {
    const Op& op = pending_.front();
    snapshot.pending_kind = op.kind;
    // In issue order, op #completed+1 started when it was entered or when
    // op #completed completed, whichever came later.
    const absl::Time started = std::max(op.entered, completed_at_);
    snapshot.waiting = std::max(absl::ZeroDuration(), now - started);
  }
  return snapshot;
}

std::shared_ptr<GroupProgress> ProgressRegistry::Add(std::string name, std::vector<int> members) {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_set<std::string> taken;
  for (const auto& weak : groups_) {
    if (std::shared_ptr<GroupProgress> group = weak.lock()) taken.insert(group->name());
  }
  std::string unique = name;
  for (int n = 2; taken.contains(unique); ++n) unique = absl::StrCat(name, "~", n);
  auto group = std::make_shared<GroupProgress>(std::move(unique), std::move(members));
  groups_.push_back(group);
  return group;
}

std::vector<GroupProgressReport> ProgressRegistry::Snapshot(absl::Time now, size_t max_groups) {
  std::vector<std::shared_ptr<GroupProgress>> live;
  {
    absl::MutexLock lock(&mu_);
    live.reserve(groups_.size());
    auto kept = groups_.begin();
    for (auto& weak : groups_) {
      std::shared_ptr<GroupProgress> group = weak.lock();
      if (group == nullptr) continue;
      live.push_back(std::move(group));
      // A self-move would empty the pointer.
      if (&*kept != &weak) *kept = std::move(weak);
      ++kept;
    }
    groups_.erase(kept, groups_.end());
  }
  // Snapshots outside the registry's lock: each polls its own Work.
  std::vector<GroupProgressReport> reports;
  reports.reserve(live.size());
  for (const auto& group : live) {
    reports.push_back(GroupProgressReport{group->name(), group->members(), group->Snapshot(now)});
  }
  if (reports.size() > max_groups) {
    // Groups with an op in flight first, then the most recently added.
    std::reverse(reports.begin(), reports.end());
    std::stable_partition(reports.begin(), reports.end(), [](const GroupProgressReport& r) {
      return r.progress.entered > r.progress.completed;
    });
    reports.resize(max_groups);
  }
  return reports;
}

}  // namespace mesh
