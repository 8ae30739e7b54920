#include "coordinator/server_info.h"

#include <unistd.h>

#include <array>

#include "common/version.h"

namespace mesh::coordinator {
namespace {

std::string HostName() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0) return "unknown";
  return std::string(buf.data());
}

}  // namespace

ServerInfo::ServerInfo(const Clock* clock)
    : clock_(clock), start_time_(clock->Now()), hostname_(HostName()), pid_(getpid()) {}

ServerInfoSnapshot ServerInfo::Snapshot() const {
  ServerInfoSnapshot snapshot;
  snapshot.version = kVersion;
  snapshot.protocol_version = kProtocolVersion;
  snapshot.start_time = start_time_;
  snapshot.uptime = clock_->Now() - start_time_;
  snapshot.hostname = hostname_;
  snapshot.pid = pid_;
  snapshot.features = BuildFeatures();
  return snapshot;
}

}  // namespace mesh::coordinator
