#include "coordinator/hang_detector.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"

namespace mesh::coordinator {
namespace {

// "300 s", "2.5 s": whole seconds from ten seconds up.
std::string Seconds(absl::Duration d) {
  const double s = absl::ToDoubleSeconds(std::max(d, absl::ZeroDuration()));
  if (s >= 10) return absl::StrCat(static_cast<int64_t>(std::floor(s)), " s");
  return absl::StrCat(std::floor(s * 10) / 10, " s");
}

std::string Op(v1::CollectiveKind kind, uint64_t seq) {
  return absl::StrCat(CollectiveKindLabel(kind), " #", seq);
}

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", FormatRankList(ranks));
}

}  // namespace

const char* CollectiveKindLabel(v1::CollectiveKind kind) {
  switch (kind) {
    case v1::COLLECTIVE_KIND_ALL_REDUCE:
      return "all_reduce";
    case v1::COLLECTIVE_KIND_BROADCAST:
      return "broadcast";
    case v1::COLLECTIVE_KIND_REDUCE:
      return "reduce";
    case v1::COLLECTIVE_KIND_ALL_GATHER:
      return "all_gather";
    case v1::COLLECTIVE_KIND_REDUCE_SCATTER:
      return "reduce_scatter";
    case v1::COLLECTIVE_KIND_ALL_TO_ALL:
      return "all_to_all";
    case v1::COLLECTIVE_KIND_BARRIER:
      return "barrier";
    case v1::COLLECTIVE_KIND_OTHER:
      return "other";
    default:
      return "op";
  }
}

std::string FormatRankList(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (j - i >= 2) {
      parts.push_back(absl::StrCat(ranks[i], "-", ranks[j]));
      i = j + 1;
    } else {
      parts.push_back(absl::StrCat(ranks[i]));
      ++i;
    }
  }
  return absl::StrJoin(parts, ", ");
}

HangDetector::HangDetector(int world_size, absl::Duration timeout)
    : world_size_(world_size), timeout_(timeout) {
  MESH_CHECK(world_size >= 1 && timeout > absl::ZeroDuration(),
             "HangDetector needs a world and a positive timeout");
}

bool HangDetector::Report(int rank, const std::vector<GroupProgressReport>& groups,
                          absl::Time now) {
  bool need_members = false;
  for (const GroupProgressReport& report : groups) {
    if (groups_.size() >= kMaxGroups && groups_.find(report.name) == groups_.end()) continue;
    Group& group = groups_[report.name];
    if (!report.members.empty() && report.members != group.members) {
      const bool valid =
          std::all_of(report.members.begin(), report.members.end(),
                      [&](int r) { return r >= 0 && r < world_size_; }) &&
          std::find(report.members.begin(), report.members.end(), rank) != report.members.end();
      if (valid) {
        // New members: a different group under a reused name. Progress
        // seen under the old membership no longer applies.
        group.members = report.members;
        group.seen.clear();
      }
    }
    if (group.members.empty()) {
      need_members = true;
      continue;
    }
    if (std::find(group.members.begin(), group.members.end(), rank) == group.members.end()) {
      continue;
    }
    Seen& seen = group.seen[rank];
    seen.entered = report.entered;
    seen.completed = std::min(report.completed, report.entered);
    seen.pending_kind = report.pending_kind;
    seen.completed_kind = report.completed_kind;
    seen.waiting = std::max(report.waiting, absl::ZeroDuration());
    seen.since_completed = std::max(report.since_completed, absl::ZeroDuration());
    seen.received = now;
  }
  return need_members;
}

bool HangDetector::WaitsAnywhere(int rank) const {
  for (const auto& [name, group] : groups_) {
    auto it = group.seen.find(rank);
    if (it != group.seen.end() && it->second.entered > it->second.completed) return true;
  }
  return false;
}

std::optional<HangDiagnosis> HangDetector::DiagnoseGroup(const std::string& name,
                                                         const Group& group, absl::Time now) const {
  // The op the group is stuck in is the lowest one anybody waits in: ranks
  // waiting in later ops are stuck behind it too (they had to complete it).
  uint64_t op = 0;
  for (const auto& [rank, seen] : group.seen) {
    if (seen.entered > seen.completed && (op == 0 || seen.completed + 1 < op)) {
      op = seen.completed + 1;
    }
  }
  if (op == 0) return std::nullopt;

  HangDiagnosis d;
  d.group = name;
  d.seq = op;
  absl::Time earliest_start = absl::InfiniteFuture();
  for (const auto& [rank, seen] : group.seen) {
    if (seen.entered > seen.completed && seen.completed + 1 == op) {
      d.waiting.push_back(rank);
      const absl::Time started = seen.received - seen.waiting;
      if (started < earliest_start) {
        earliest_start = started;
        d.kind = seen.pending_kind;
      }
    }
  }
  d.waited = now - earliest_start;
  if (d.waited < timeout_) return std::nullopt;

  // Missing: members whose latest report, newer than the wait, has not
  // entered the op. A member that never reported the group is missing too
  // once the waiters have waited the whole timeout.
  for (int member : group.members) {
    auto it = group.seen.find(member);
    if (it == group.seen.end()) {
      d.missing.push_back(member);
    } else if (it->second.entered < op && it->second.received > earliest_start) {
      d.missing.push_back(member);
    }
  }
  if (d.missing.empty()) return std::nullopt;
  std::sort(d.waiting.begin(), d.waiting.end());
  std::sort(d.missing.begin(), d.missing.end());

  d.culprit = d.missing.front();
  for (int rank : d.missing) {
    if (!WaitsAnywhere(rank)) {
      d.culprit = rank;
      break;
    }
  }

  std::string culprit_state;
  auto it = group.seen.find(d.culprit);
  if (it == group.seen.end()) {
    culprit_state = "never reported this group";
  } else {
    const Seen& seen = it->second;
    const absl::Duration since = seen.since_completed + (now - seen.received);
    if (seen.entered == 0) {
      culprit_state = absl::StrCat("no collective in it yet, group made ", Seconds(since), " ago");
    } else if (seen.entered > seen.completed) {
      culprit_state = absl::StrCat("waits in ", Op(seen.pending_kind, seen.completed + 1), " for ",
                                   Seconds(seen.waiting + (now - seen.received)));
    } else {
      culprit_state = absl::StrCat("last: ", Op(seen.completed_kind, seen.completed),
                                   ", completed ", Seconds(since), " ago");
    }
  }
  // Other groups the culprit waits in: where it is stuck, if it is.
  for (const auto& [other_name, other] : groups_) {
    if (other_name == name) continue;
    auto seen = other.seen.find(d.culprit);
    if (seen != other.seen.end() && seen->second.entered > seen->second.completed) {
      absl::StrAppend(&culprit_state, "; it waits in ",
                      Op(seen->second.pending_kind, seen->second.completed + 1), " of group '",
                      other_name, "'");
      break;
    }
  }

  const std::vector<int> others = [&] {
    std::vector<int> rest;
    for (int r : d.missing) {
      if (r != d.culprit) rest.push_back(r);
    }
    return rest;
  }();
  d.message =
      absl::StrCat("hang in group '", name, "' (", Ranks(group.members), "): ", Ranks(d.waiting),
                   d.waiting.size() == 1 ? " has" : " have", " waited ", Seconds(d.waited), " in ",
                   Op(d.kind, op), "; rank ", d.culprit, " never entered it (", culprit_state, ")");
  if (!others.empty()) {
    absl::StrAppend(&d.message, "; ", Ranks(others), " did not enter it either");
  }
  return d;
}

std::optional<HangDiagnosis> HangDetector::Diagnose(absl::Time now) const {
  std::optional<HangDiagnosis> worst;
  for (const auto& [name, group] : groups_) {
    if (group.members.empty()) continue;
    std::optional<HangDiagnosis> d = DiagnoseGroup(name, group, now);
    if (d.has_value() && (!worst.has_value() || d->waited > worst->waited)) worst = std::move(d);
  }
  return worst;
}

}  // namespace mesh::coordinator
