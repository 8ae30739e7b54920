#include "coordinator/barrier_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"

namespace mesh::coordinator {

bool BarrierTable::Barrier::Includes(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(arrived_.size())) return false;
  return participants_.empty() ||
         std::binary_search(participants_.begin(), participants_.end(), rank);
}

std::vector<int> BarrierTable::Barrier::Missing() const {
  std::vector<int> missing;
  for (int rank = 0; rank < static_cast<int>(arrived_.size()); ++rank) {
    if (Includes(rank) && !arrived_[rank]) missing.push_back(rank);
  }
  return missing;
}

bool BarrierTable::Barrier::Arrive(int rank) {
  MESH_CHECK(Includes(rank), "only a participant arrives at a barrier");
  if (!arrived_[rank]) {
    arrived_[rank] = 1;
    ++arrived_count_;
  }
  return arrived_count_ == expected_;
}

absl::StatusOr<std::vector<int>> BarrierTable::NormalizeParticipants(std::vector<int> ranks,
                                                                     int caller) const {
  std::sort(ranks.begin(), ranks.end());
  if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) {
    return absl::InvalidArgumentError("a participant is listed twice");
  }
  if (!ranks.empty() && (ranks.front() < 0 || ranks.back() >= world_size_)) {
    return absl::InvalidArgumentError(absl::StrCat("participants must be in 0..", world_size_ - 1));
  }
  // Sorted, unique and in range: as many as the world means the world.
  if (static_cast<int>(ranks.size()) == world_size_) ranks.clear();
  if (!ranks.empty() && !std::binary_search(ranks.begin(), ranks.end(), caller)) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", caller, " is not a participant"));
  }
  return ranks;
}

std::string BarrierTable::DescribeParticipants(const std::vector<int>& participants) {
  if (participants.empty()) return "all ranks";
  return absl::StrCat("{", absl::StrJoin(participants, ","), "}");
}

BarrierTable::Barrier& BarrierTable::Open(const std::string& name, std::vector<int> participants,
                                          absl::Time now, absl::Duration timeout, bool* created) {
  auto [it, inserted] = barriers_.try_emplace(name);
  *created = inserted;
  Barrier& b = it->second;
  if (inserted) {
    b.expected_ = participants.empty() ? world_size_ : static_cast<int>(participants.size());
    b.participants_ = std::move(participants);
    b.arrived_.assign(world_size_, 0);
    b.timeout_ = timeout;
    b.deadline_ = now + timeout;
  }
  return b;
}

BarrierTable::Barrier* BarrierTable::Find(const std::string& name) {
  auto it = barriers_.find(name);
  return it == barriers_.end() ? nullptr : &it->second;
}

std::vector<uint64_t> BarrierTable::Finish(const std::string& name, absl::Status status) {
  Barrier* b = Find(name);
  MESH_CHECK(b != nullptr && !b->result_.has_value(), "Finish needs an open barrier");
  b->result_ = std::move(status);
  return std::exchange(b->waiters_, {});
}

std::vector<std::string> BarrierTable::AwaitingRank(int rank) const {
  std::vector<std::string> names;
  for (const auto& [name, b] : barriers_) {
    if (!b.result_.has_value() && b.Includes(rank) && !b.arrived_[rank]) names.push_back(name);
  }
  return names;
}

void BarrierTable::Withdraw(int rank) {
  for (auto& [name, b] : barriers_) {
    if (b.result_.has_value() || rank < 0 || rank >= static_cast<int>(b.arrived_.size())) continue;
    if (b.arrived_[rank]) {
      b.arrived_[rank] = 0;
      --b.arrived_count_;
    }
  }
}

void BarrierTable::FinishAll(const absl::Status& status) {
  for (auto& [name, b] : barriers_) {
    if (!b.result_.has_value()) b.result_ = status;
    b.waiters_.clear();
  }
}

}  // namespace mesh::coordinator
