// BarrierTable: the named barriers of one job generation.
//
// A barrier is created by its first arrival, which fixes its participant
// set, its timeout and its deadline; it completes once every participant has
// arrived, or fails, and then keeps its result for late callers. A plain data
// structure: the owner (Coordination) registers a waiter per arrival, hands
// its id to the barrier, and completes the ids that Finish returns.
//
//   (absent) ──Open──▶ OPEN ──last Arrive / Finish(status)──▶ FINISHED(result)
//
// Thread safety: none. The owner's mutex guards every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mesh::coordinator {

class BarrierTable {
 public:
  class Barrier {
   public:
    // Whether `rank` is a participant.
    bool Includes(int rank) const;
    bool arrived(int rank) const { return arrived_[rank] != 0; }
    // Sorted participants; empty means every rank of the world.
    const std::vector<int>& participants() const { return participants_; }
    int expected() const { return expected_; }
    int arrived_count() const { return arrived_count_; }
    absl::Time deadline() const { return deadline_; }
    absl::Duration timeout() const { return timeout_; }
    // Set once the barrier has finished.
    const std::optional<absl::Status>& result() const { return result_; }
    // Participants that have not arrived, ascending.
    std::vector<int> Missing() const;

    // Adds a waiter to complete when the barrier finishes.
    void AddWaiter(uint64_t waiter_id) { waiters_.push_back(waiter_id); }
    size_t num_waiters() const { return waiters_.size(); }
    // Records the arrival of participant `rank` (idempotent). Returns whether
    // every participant has now arrived.
    bool Arrive(int rank);

   private:
    friend class BarrierTable;

    std::vector<int> participants_;
    std::vector<char> arrived_;  // Indexed by rank.
    int arrived_count_ = 0;
    int expected_ = 0;
    absl::Time deadline_;
    absl::Duration timeout_;
    std::vector<uint64_t> waiters_;
    std::optional<absl::Status> result_;
  };

  explicit BarrierTable(int world_size) : world_size_(world_size) {}

  BarrierTable(const BarrierTable&) = delete;
  BarrierTable& operator=(const BarrierTable&) = delete;

  // Normalizes the participant list `ranks` of a call from `caller`: sorted,
  // and empty when it names the whole world (so that {} and {0..n-1} are the
  // same barrier). Errors: INVALID_ARGUMENT for a rank listed twice or out
  // of range, or a caller that is not a participant; the message names
  // neither job nor barrier.
  absl::StatusOr<std::vector<int>> NormalizeParticipants(std::vector<int> ranks, int caller) const;

  // "all ranks" or "{1,3}".
  static std::string DescribeParticipants(const std::vector<int>& participants);

  // The barrier `name`; when absent, creates it with `participants` (from
  // NormalizeParticipants) and the deadline now + timeout. Sets *created.
  // The reference stays valid while the table lives.
  Barrier& Open(const std::string& name, std::vector<int> participants, absl::Time now,
                absl::Duration timeout, bool* created);

  // Null when absent.
  Barrier* Find(const std::string& name);

  // Barriers created so far, open and finished (finished ones are kept for
  // late callers until the generation ends).
  size_t size() const { return barriers_.size(); }

  // Gives the open barrier `name` its result and returns its waiters, which
  // the owner completes: with expected() when `status` is OK, else with it.
  std::vector<uint64_t> Finish(const std::string& name, absl::Status status);

  // Open barriers that include `rank` and that it has not arrived at.
  std::vector<std::string> AwaitingRank(int rank) const;

  // Takes back `rank`'s arrival at every open barrier (the process that
  // arrived was replaced by a newer one of the same rank, which must arrive
  // itself). Finished barriers keep their result.
  void Withdraw(int rank);

  // Finishes every open barrier with `status` and forgets every waiter (the
  // owner ends those itself, as when a generation ends).
  void FinishAll(const absl::Status& status);

 private:
  const int world_size_;
  std::map<std::string, Barrier> barriers_;
};

}  // namespace mesh::coordinator
