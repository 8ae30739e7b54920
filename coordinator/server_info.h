// ServerInfo: the facts AdminService.GetServerInfo reports about this
// coordinator process. Plain C++: no gRPC types, time from an injected Clock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"

namespace mesh::coordinator {

struct ServerInfoSnapshot {
  std::string version;
  int protocol_version = 0;
  absl::Time start_time;
  absl::Duration uptime;
  std::string hostname;
  int64_t pid = 0;
  std::vector<std::string> features;
};

// Thread safety: immutable after construction; Snapshot() is thread-safe.
class ServerInfo {
 public:
  // `clock` must outlive this object. The start time is clock->Now().
  explicit ServerInfo(const Clock* clock);

  ServerInfoSnapshot Snapshot() const;

 private:
  const Clock* const clock_;
  const absl::Time start_time_;
  const std::string hostname_;
  const int64_t pid_;
};

}  // namespace mesh::coordinator
