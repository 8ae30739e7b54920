#include "common/coordinator_targets.h"

#include <arpa/inet.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace mesh {

std::vector<std::string> SplitCoordinatorTargets(const std::string& value) {
  std::vector<std::string> targets;
  // A gRPC URI names one channel, whose own address list may have commas.
  for (absl::string_view scheme : {"dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(value, scheme)) return {value};
  }
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (!part.empty()) targets.emplace_back(part);
  }
  return targets;
}

bool MayNameSeveralReplicas(const std::string& target) {
  if (absl::StartsWith(target, "dns:")) return true;
  for (absl::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (absl::StartsWith(target, scheme)) return absl::StrContains(target, ',');
  }
  if (absl::StartsWith(target, "unix") || absl::StrContains(target, ":/")) return false;
  // host:port; an IPv6 literal is bracketed.
  if (absl::StartsWith(target, "[")) return false;
  const size_t colon = target.rfind(':');
  const std::string host = target.substr(0, colon);
  if (host.empty() || absl::AsciiStrToLower(host) == "localhost") return false;
  in_addr v4;
  in6_addr v6;
  return inet_pton(AF_INET, host.c_str(), &v4) != 1 && inet_pton(AF_INET6, host.c_str(), &v6) != 1;
}

void AddCoordinatorChannelArgs(const std::string& target, grpc::ChannelArguments* args) {
  if (!MayNameSeveralReplicas(target)) return;
  args->SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
  // A standby answers at once, without a response message, so the retry is
  // transparent to the call; it picks again, and round_robin moves on.
  args->SetServiceConfigJSON(R"json({
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{
      "name": [{}],
      "retryPolicy": {
        "maxAttempts": 5,
        "initialBackoff": "0.02s",
        "maxBackoff": "0.5s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"]
      }
    }]
  })json");
}

absl::StatusOr<std::string> FindLeader(const std::vector<std::string>& targets,
                                       const ChannelMaker& make_channel, absl::Time deadline) {
  if (targets.empty()) return absl::InvalidArgumentError("no coordinator address");
  if (targets.size() == 1) return targets.front();
  std::vector<std::unique_ptr<grpc::health::v1::Health::Stub>> stubs;
  for (const std::string& target : targets) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = make_channel(target);
    if (!channel.ok()) return channel.status();
    stubs.push_back(grpc::health::v1::Health::NewStub(*channel));
  }
  std::vector<std::string> answers(targets.size(), "not asked");
  absl::Duration pause = absl::Milliseconds(50);
  for (;;) {
    for (size_t i = 0; i < targets.size(); ++i) {
      grpc::ClientContext context;
      // A short look each, so that a replica that hangs (a paused process)
      // does not use up the time the others need.
      const absl::Duration share = (deadline - absl::Now()) / static_cast<int>(targets.size() - i);
      context.set_deadline(absl::ToChronoTime(
          absl::Now() + std::clamp(share, absl::Milliseconds(100), absl::Milliseconds(500))));
      grpc::health::v1::HealthCheckRequest request;
      grpc::health::v1::HealthCheckResponse response;
      const grpc::Status status = stubs[i]->Check(&context, request, &response);
      if (status.ok() && response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
        return targets[i];
      }
      answers[i] =
          status.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())
                      : status.error_message();
    }
    if (absl::Now() + pause >= deadline) break;
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(500));
  }
  std::vector<std::string> lines;
  for (size_t i = 0; i < targets.size(); ++i)
    lines.push_back(absl::StrCat(targets[i], ": ", answers[i]));
  return absl::UnavailableError(
      absl::StrCat("no coordinator replica leads (", absl::StrJoin(lines, "; "), ")"));
}

void LeaderTracker::Rotate(size_t failed) {
  size_t expected = current_.load();
  if (expected % targets_.size() != failed) return;
  current_.compare_exchange_strong(expected, expected + 1);
}

}  // namespace mesh
