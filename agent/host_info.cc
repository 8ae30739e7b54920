#include "agent/host_info.h"

#include <sched.h>
#include <unistd.h>

#include <array>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace mesh::agent {
namespace {

constexpr int kMaxGpuOrdinal = 1023;

absl::StatusOr<int> ParseOrdinal(absl::string_view item, absl::string_view whole) {
  int value = 0;
  if (!absl::SimpleAtoi(item, &value) || value < 0 || value > kMaxGpuOrdinal) {
    return absl::InvalidArgumentError(absl::StrCat("bad GPU ordinal '", item, "' in GPU list '",
                                                   whole, "': expected an integer in 0..",
                                                   kMaxGpuOrdinal));
  }
  return value;
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseGpuList(absl::string_view text) {
  std::vector<int> gpus;
  if (absl::StripAsciiWhitespace(text).empty()) return gpus;
  std::set<int> seen;
  for (absl::string_view raw : absl::StrSplit(text, ',')) {
    const absl::string_view item = absl::StripAsciiWhitespace(raw);
    if (item.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("empty item in GPU list '", text, "'"));
    }
    int first = 0, last = 0;
    if (const size_t dash = item.find('-'); dash != absl::string_view::npos) {
      auto lo = ParseOrdinal(absl::StripAsciiWhitespace(item.substr(0, dash)), text);
      if (!lo.ok()) return lo.status();
      auto hi = ParseOrdinal(absl::StripAsciiWhitespace(item.substr(dash + 1)), text);
      if (!hi.ok()) return hi.status();
      if (*hi < *lo) {
        return absl::InvalidArgumentError(
            absl::StrCat("reversed range '", item, "' in GPU list '", text, "'"));
      }
      first = *lo;
      last = *hi;
    } else {
      auto one = ParseOrdinal(item, text);
      if (!one.ok()) return one.status();
      first = last = *one;
    }
    for (int gpu = first; gpu <= last; ++gpu) {
      if (!seen.insert(gpu).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("GPU ", gpu, " appears twice in GPU list '", text, "'"));
      }
      gpus.push_back(gpu);
    }
  }
  return gpus;
}

int AvailableCpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

absl::StatusOr<HostInfo> DiscoverHost(const HostOptions& options) {
  if (options.slots < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots must be >= 0 (0 = one per CPU), got ", options.slots));
  }
  HostInfo info;
  if (!options.hostname.empty()) {
    info.hostname = options.hostname;
  } else {
    std::array<char, 256> buf{};
    info.hostname = gethostname(buf.data(), buf.size() - 1) == 0 ? buf.data() : "unknown";
  }
  info.cpu_count = AvailableCpuCount();
  info.slots = options.slots > 0 ? options.slots : info.cpu_count;
  auto gpus = ParseGpuList(options.gpus);
  if (!gpus.ok()) return gpus.status();
  info.gpus = *std::move(gpus);
  return info;
}

std::string HostInfoToJson(const HostInfo& info) {
  nlohmann::json json;
  json["hostname"] = info.hostname;
  json["cpu_count"] = info.cpu_count;
  json["slots"] = info.slots;
  json["gpus"] = info.gpus;
  return json.dump();
}

}  // namespace mesh::agent
