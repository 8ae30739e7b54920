#include "mesh/process_group.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mesh {

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kProd:
      return "prod";
  }
  return "unknown";
}

absl::Status CheckMembershipSpec(const GroupSpec& spec, int world_rank, int world_size) {
  const std::vector<int>& ranks = spec.global_ranks;
  const bool ascending = std::adjacent_find(ranks.begin(), ranks.end(),
                                            [](int a, int b) { return a >= b; }) == ranks.end();
  if (spec.family.empty() || ranks.empty() || !ascending || ranks.front() < 0 ||
      ranks.back() >= world_size || !std::binary_search(ranks.begin(), ranks.end(), world_rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("membership '", spec.family, "' of ranks [", absl::StrJoin(ranks, ", "),
                     "]: needs a family name and distinct ranks, ascending, within the world of ",
                     world_size, " and holding the calling rank ", world_rank));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Membership>> ProcessGroupFactory::NewMembership(
    const GroupSpec& spec, const std::shared_ptr<Membership>& previous) {
  if (absl::Status s = CheckMembershipSpec(spec, world_rank(), world_size()); !s.ok()) return s;
  if (absl::Status s = CheckWithinPrevious(spec, previous.get()); !s.ok()) return s;
  return std::make_shared<Membership>(spec.family, spec.global_ranks);
}

absl::Status CheckWithinPrevious(const GroupSpec& spec, const Membership* previous) {
  if (previous == nullptr) return absl::OkStatus();
  const std::vector<int>& before = previous->ranks();
  for (int rank : spec.global_ranks) {
    if (!std::binary_search(before.begin(), before.end(), rank)) {
      return absl::InvalidArgumentError(
          absl::StrCat("membership '", spec.family, "': rank ", rank,
                       " is not in the previous membership '", previous->family(), "' (ranks [",
                       absl::StrJoin(before, ", "), "]), so it cannot be derived from it"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGroupsWithin(const Membership& membership, const std::vector<GroupSpec>& specs) {
  const std::vector<int>& members = membership.ranks();
  for (const GroupSpec& spec : specs) {
    for (int rank : spec.global_ranks) {
      if (!std::binary_search(members.begin(), members.end(), rank)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "group family '", spec.family, "' (ranks [", absl::StrJoin(spec.global_ranks, ", "),
            "]) holds rank ", rank, ", which is not in membership '", membership.family(),
            "' (ranks [", absl::StrJoin(members, ", "), "])"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> ProcessGroupFactory::NewGroupsWithin(
    const Membership& membership, const std::vector<GroupSpec>& specs) {
  if (absl::Status s = CheckGroupsWithin(membership, specs); !s.ok()) return s;
  return NewGroupsAmongMembers(specs);
}

}  // namespace mesh
