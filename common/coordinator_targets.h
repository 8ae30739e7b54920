// The coordinator address a client is given (--coordinator,
// MESH_COORDINATOR): one host:port, or the comma-separated addresses of
// the replicas of a coordinator on an etcd store (docs/ha.md), or one DNS
// name whose records are those replicas. One replica leads; the others are
// standbys whose every RPC fails with UNAVAILABLE and whose standard health
// service says NOT_SERVING.
//
// Thread safety: free functions; LeaderTracker is thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mesh {

// "a:1, b:2" -> {"a:1", "b:2"}: split at commas, blanks trimmed, empty
// entries dropped. One address gives a list of one, and so does a gRPC URI
// ("ipv4:a:1,b:2", "dns:///name:7450": one channel, its own resolver).
std::vector<std::string> SplitCoordinatorTargets(const std::string& value);

// Whether one target may stand for several replicas behind one channel: a
// host name other than "localhost" (its DNS records), a dns: URI, or an
// ipv4:/ipv6: URI listing several addresses. Not an IP address, a unix:
// socket or "localhost".
bool MayNameSeveralReplicas(const std::string& target);

// Channel arguments for one coordinator target. When the target may name
// several replicas (MayNameSeveralReplicas), the channel spreads calls
// over all of its addresses (round_robin, re-resolving the name as gRPC's
// resolver does when connections fail) and retries a call that a replica
// answers with UNAVAILABLE, as a standby does, on the next address: up to
// 5 attempts in all, 20 ms apart and doubling, so that with up to 5
// replicas every call reaches the leader. Other targets are left alone
// (no retries: a single coordinator's UNAVAILABLE reaches the caller at
// once).
void AddCoordinatorChannelArgs(const std::string& target, grpc::ChannelArguments* args);

using ChannelMaker =
    std::function<absl::StatusOr<std::shared_ptr<grpc::Channel>>(const std::string& target)>;

// The target of `targets` that leads: with one target, that one, without a
// call. With several, asks each in turn, round after round until
// `deadline`, for its health (grpc.health.v1, service ""): the first that
// answers SERVING leads.
// Possible errors: the channel maker's; UNAVAILABLE when none answered
// SERVING by the deadline (the message gives each target's last answer).
absl::StatusOr<std::string> FindLeader(const std::vector<std::string>& targets,
                                       const ChannelMaker& make_channel, absl::Time deadline);

// For clients that keep calling: which replica to call now. Rotate() after
// a call fails with UNAVAILABLE moves to the next replica (a standby's
// answer, or one that is down), so the caller's own retry reaches the
// leader within a round of the list.
class LeaderTracker {
 public:
  explicit LeaderTracker(std::vector<std::string> targets) : targets_(std::move(targets)) {}
  size_t size() const { return targets_.size(); }
  // Index and address of the replica to call.
  size_t current() const { return current_.load() % targets_.size(); }
  const std::string& target(size_t i) const { return targets_[i]; }
  // Moves on from replica `failed` (the index the failed call used); a
  // no-op when another caller moved on already.
  void Rotate(size_t failed);

 private:
  const std::vector<std::string> targets_;
  std::atomic<size_t> current_{0};
};

}  // namespace mesh
