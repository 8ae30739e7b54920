#include "coordinator/rendezvous.h"

#include <algorithm>

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "coordinator/unique_id_table.h"

namespace mesh::coordinator {

Rendezvous::Rendezvous(int world_size) : members_(world_size) {
  MESH_CHECK(world_size >= 1, "Rendezvous needs a world of at least one rank");
}

std::string Rendezvous::RankName(int rank) const {
  const Member& m = members_[rank];
  return m.joined ? absl::StrCat(rank, " (", m.host, ")") : absl::StrCat(rank, " (not joined)");
}

absl::StatusOr<bool> Rendezvous::Join(int rank, uint64_t incarnation, std::string host,
                                      DeviceInfo device, std::string world_unique_id) {
  if (absl::Status s = CheckJoin(rank, host, world_unique_id); !s.ok()) return s;
  Member& m = members_[rank];
  if (m.joined) return false;
  m.joined = true;
  m.incarnation = incarnation;
  m.host = std::move(host);
  m.device = std::move(device);
  if (rank == 0) world_unique_id_ = std::move(world_unique_id);
  if (++num_joined_ < world_size()) return false;
  Complete();
  return true;
}

absl::Status Rendezvous::CheckJoin(int rank, const std::string& host,
                                   const std::string& world_unique_id) {
  if (host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " joined without a host name"));
  }
  if (!world_unique_id.empty()) {
    if (rank != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("only rank 0 may supply the world unique ID; rank ", rank, " did"));
    }
    if (world_unique_id.size() != kUniqueIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat("unique ID has ", world_unique_id.size(),
                                                     " bytes; an ncclUniqueId has ",
                                                     kUniqueIdBytes));
    }
  }
  return absl::OkStatus();
}

void Rendezvous::Unjoin(int rank) {
  MESH_CHECK(!complete_ && members_[rank].joined,
             "Unjoin needs a joined rank of an open rendezvous");
  std::vector<uint64_t> superseded = std::move(members_[rank].superseded);
  superseded.push_back(members_[rank].incarnation);
  members_[rank] = Member();
  members_[rank].superseded = std::move(superseded);
  if (rank == 0) world_unique_id_.clear();
  --num_joined_;
}

void Rendezvous::SetIncarnation(int rank, uint64_t incarnation) {
  MESH_CHECK(members_[rank].joined, "SetIncarnation needs a joined rank");
  members_[rank].superseded.push_back(members_[rank].incarnation);
  members_[rank].incarnation = incarnation;
}

void Rendezvous::Rehost(int rank, std::string host, DeviceInfo device) {
  MESH_CHECK(complete_, "Rehost needs a complete rendezvous");
  MESH_CHECK(!host.empty(), "Rehost needs a host");
  members_[rank].host = std::move(host);
  members_[rank].device = std::move(device);
}

bool Rendezvous::superseded(int rank, uint64_t incarnation) const {
  const std::vector<uint64_t>& old = members_[rank].superseded;
  return std::find(old.begin(), old.end(), incarnation) != old.end();
}

void Rendezvous::Complete() {
  absl::flat_hash_map<std::string, std::pair<int, int>> hosts;  // host -> (node, ranks so far)
  for (Member& m : members_) {
    auto [it, inserted] = hosts.try_emplace(m.host, static_cast<int>(hosts.size()), 0);
    m.placement.node_rank = it->second.first;
    m.placement.local_rank = it->second.second++;
  }
  for (Member& m : members_) m.placement.local_world_size = hosts[m.host].second;
  num_nodes_ = static_cast<int>(hosts.size());
  complete_ = true;
}

Rendezvous::Placement Rendezvous::placement(int rank) const {
  MESH_CHECK(complete_, "placement() needs a complete rendezvous");
  return members_[rank].placement;
}

std::vector<int> Rendezvous::Missing() const {
  std::vector<int> missing;
  for (int rank = 0; rank < world_size(); ++rank) {
    if (!members_[rank].joined) missing.push_back(rank);
  }
  return missing;
}

absl::StatusOr<std::vector<RankDescription>> Rendezvous::Describe(
    const std::vector<int>& ranks) const {
  if (ranks.size() > kMaxDescribeRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DescribeRanks takes at most ", kMaxDescribeRanks, " ranks, not ", ranks.size()));
  }
  if (!complete_) {
    return absl::FailedPreconditionError(absl::StrCat("rendezvous is not complete; ", num_joined_,
                                                      "/", world_size(), " ranks joined"));
  }
  std::vector<RankDescription> out;
  out.reserve(ranks.size());
  for (int rank : ranks) {
    if (rank < 0 || rank >= world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " is outside 0..", world_size() - 1));
    }
    const Member& m = members_[rank];
    out.push_back(
        RankDescription{rank, m.host, m.placement.node_rank, m.placement.local_rank, m.device});
  }
  return out;
}

}  // namespace mesh::coordinator
