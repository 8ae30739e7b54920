// Rendezvous: who has joined one job generation — which process
// (incarnation), on which host, with which device — and, once the whole
// world has, the node topology derived from the hosts.
//
//   OPEN ──Join of the last missing rank──▶ COMPLETE (topology fixed)
//
// Topology: nodes are hosts, numbered in order of their lowest rank; local
// ranks follow rank order within a host. Deterministic for a given set of
// joins, whatever order they came in.
//
// A plain data structure: fencing (which incarnation may act as a rank),
// waiting for the world and error context (job, generation) belong to the
// owner (Coordination).
//
// Thread safety: none. The owner's mutex guards every call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mesh::coordinator {

struct DeviceInfo {
  std::string kind;  // "cuda" or "cpu"; empty when unknown.
  int index = -1;
  std::string uuid;
  std::string pci_bus_id;
};

struct RankDescription {
  int rank = 0;
  std::string host;
  int node_rank = 0;
  int local_rank = 0;
  DeviceInfo device;
};

class Rendezvous {
 public:
  // Most ranks one DescribeRanks call may name.
  static constexpr size_t kMaxDescribeRanks = 4096;

  // Where a rank sits once the rendezvous is complete.
  struct Placement {
    int node_rank = 0;
    int local_rank = 0;
    int local_world_size = 0;
  };

  // `world_size` >= 1 (checked).
  explicit Rendezvous(int world_size);

  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  int world_size() const { return static_cast<int>(members_.size()); }
  int num_joined() const { return num_joined_; }
  bool complete() const { return complete_; }

  // Per rank, for 0 <= rank < world_size().
  bool joined(int rank) const { return members_[rank].joined; }
  // The incarnation that joined as `rank`; requires joined(rank).
  uint64_t incarnation(int rank) const { return members_[rank].incarnation; }
  // Empty until `rank` joins.
  const std::string& host(int rank) const { return members_[rank].host; }
  // "3 (host-b)", or "3 (not joined)".
  std::string RankName(int rank) const;

  // Records the first join of `rank`. A rank that has joined already keeps
  // its first record; whether the later call comes from the same process is
  // the owner's check. Returns whether this call completed the world.
  // Errors (nothing recorded): INVALID_ARGUMENT for an empty host, or a
  // world unique ID that is not kUniqueIdBytes long or comes from a rank
  // other than 0. Messages name the rank, not the job.
  absl::StatusOr<bool> Join(int rank, uint64_t incarnation, std::string host, DeviceInfo device,
                            std::string world_unique_id);
  // Join's argument checks alone (the same INVALID_ARGUMENT errors), for an
  // owner that must validate a join before it changes anything.
  static absl::Status CheckJoin(int rank, const std::string& host,
                                const std::string& world_unique_id);

  // Forgets the join of `rank`, which a newer process of the same rank
  // replaces before the world is complete: the rank is missing again, and
  // rank 0's world unique ID goes with it. The incarnation that held it
  // counts as superseded from now on. Requires joined(rank) and
  // !complete() (checked).
  void Unjoin(int rank);
  // Whether `incarnation` held `rank` and was replaced (Unjoin or
  // SetIncarnation): such a process is stale for good, and may not join
  // again and displace its successor.
  bool superseded(int rank, uint64_t incarnation) const;

  // Records that `incarnation` now holds `rank`, once the world is complete
  // (the owner fails the generation: the topology stays as it was).
  // Requires joined(rank) (checked).
  void SetIncarnation(int rank, uint64_t incarnation);
  // Once the world is complete, the process that now holds `rank` (a new
  // one, with in-place recovery) runs on `host` with `device`: host() and
  // device() name them from now on. Its placement in the topology stays as
  // formed. Requires complete() and a non-empty host (checked).
  void Rehost(int rank, std::string host, DeviceInfo device);

  // Requires complete().
  Placement placement(int rank) const;
  int num_nodes() const { return num_nodes_; }
  // Rank 0's world unique ID; empty when it gave none.
  const std::string& world_unique_id() const { return world_unique_id_; }

  // Ranks that have not joined, ascending.
  std::vector<int> Missing() const;

  // Host, node and device of `ranks`, in the order given. Errors:
  // INVALID_ARGUMENT (more than kMaxDescribeRanks, a rank out of range),
  // FAILED_PRECONDITION (the rendezvous is not complete).
  absl::StatusOr<std::vector<RankDescription>> Describe(const std::vector<int>& ranks) const;

 private:
  struct Member {
    bool joined = false;
    uint64_t incarnation = 0;
    std::string host;
    DeviceInfo device;
    Placement placement;
    // Incarnations that held this rank before (few: one per restart of
    // the rank's process within the generation).
    std::vector<uint64_t> superseded;
  };

  void Complete();

  std::vector<Member> members_;
  int num_joined_ = 0;
  bool complete_ = false;
  int num_nodes_ = 0;
  std::string world_unique_id_;
};

}  // namespace mesh::coordinator
