#include "coordinator/log_relay.h"

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/duration_format.h"

namespace mesh::coordinator {

namespace {

constexpr absl::string_view kRequestIdPrefix = "logs-";

}  // namespace

struct LogRelay::Request {
  uint64_t handle = 0;
  LogSink* sink = nullptr;  // Null once ended or cancelled.
  // Ranks each node still owes an eof for.
  RanksByNode left;
  std::map<std::string, uint64_t> uploads;  // Node → attached upload.
  absl::Time attach_deadline;
};

struct LogRelay::Upload {
  uint64_t request = 0;
  std::string node;
  UploadControl* control = nullptr;  // Null once aborted.
};

LogRelay::LogRelay(const Clock* clock, absl::Duration attach_timeout)
    : clock_(clock), attach_timeout_(attach_timeout) {
  MESH_CHECK(clock_ != nullptr, "LogRelay needs a clock");
  MESH_CHECK(attach_timeout_ > absl::ZeroDuration(), "LogRelay's attach timeout must be positive");
}

LogRelay::~LogRelay() = default;

std::string LogRelay::RequestId(uint64_t handle) { return absl::StrCat(kRequestIdPrefix, handle); }

absl::StatusOr<uint64_t> LogRelay::Start(RanksByNode ranks, LogSink* sink) {
  if (shut_down_) return absl::UnavailableError("the log relay has shut down");
  if (ranks.empty()) return absl::InvalidArgumentError("a log request needs at least one rank");
  for (const auto& [node, node_ranks] : ranks) {
    if (node_ranks.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("node ", node, " is asked for no rank"));
    }
  }
  const uint64_t handle = next_handle_++;
  auto request = std::make_unique<Request>();
  request->handle = handle;
  request->sink = sink;
  request->left = std::move(ranks);
  request->attach_deadline = clock_->Now() + attach_timeout_;
  requests_.emplace(handle, std::move(request));
  return handle;
}

void LogRelay::EndRequest(Request& request, const absl::Status& status) {
  if (request.sink != nullptr) {
    request.sink->End(status);
    request.sink = nullptr;
  }
  for (const auto& [node, upload_handle] : request.uploads) {
    // An upload that delivered every rank ends by itself; only the others
    // are cut short.
    auto left = request.left.find(node);
    if (left == request.left.end() || left->second.empty()) continue;
    auto it = uploads_.find(upload_handle);
    if (it != uploads_.end() && it->second->control != nullptr) {
      it->second->control->Abort(absl::CancelledError("the log request has ended"));
      it->second->control = nullptr;
    }
  }
  requests_.erase(request.handle);  // Destroys `request`.
}

void LogRelay::Cancel(uint64_t handle) {
  auto it = requests_.find(handle);
  if (it == requests_.end()) return;
  it->second->sink = nullptr;  // Its owner went away: no End.
  EndRequest(*it->second, absl::CancelledError("cancelled"));
}

absl::StatusOr<uint64_t> LogRelay::Attach(const std::string& node, const std::string& request_id,
                                          UploadControl* control) {
  uint64_t request_handle = 0;
  if (!absl::StartsWith(request_id, kRequestIdPrefix) ||
      !absl::SimpleAtoi(absl::string_view(request_id).substr(kRequestIdPrefix.size()),
                        &request_handle)) {
    return absl::NotFoundError(absl::StrCat("unknown log request '", request_id, "'"));
  }
  auto it = requests_.find(request_handle);
  if (it == requests_.end()) {
    return absl::NotFoundError(
        absl::StrCat("log request '", request_id, "' has ended or never existed"));
  }
  Request& request = *it->second;
  if (!request.left.contains(node) || request.uploads.contains(node)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "log request '", request_id, "' did not ask node ", node, " (or it already attached)"));
  }
  const uint64_t handle = next_handle_++;
  auto upload = std::make_unique<Upload>();
  upload->request = request_handle;
  upload->node = node;
  upload->control = control;
  uploads_.emplace(handle, std::move(upload));
  request.uploads.emplace(node, handle);
  return handle;
}

absl::Status LogRelay::Chunk(uint64_t upload_handle, const mesh::v1::LogChunk& chunk) {
  auto up = uploads_.find(upload_handle);
  if (up == uploads_.end()) return absl::CancelledError("the upload has ended");
  auto it = requests_.find(up->second->request);
  if (it == requests_.end()) return absl::CancelledError("the log request has ended");
  Request& request = *it->second;
  std::set<int>& left = request.left[up->second->node];
  if (!left.contains(chunk.rank())) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", chunk.rank(), " was not asked of node ",
                                                   up->second->node, " or has already ended"));
  }
  if (request.sink != nullptr) request.sink->Send(chunk);
  if (chunk.eof()) {
    left.erase(chunk.rank());
    bool done = true;
    for (const auto& [node, ranks] : request.left) done = done && ranks.empty();
    if (done) EndRequest(request, absl::OkStatus());
  }
  return absl::OkStatus();
}

void LogRelay::UploadEnded(uint64_t upload_handle, const absl::Status& status) {
  auto up = uploads_.find(upload_handle);
  if (up == uploads_.end()) return;
  const std::string node = up->second->node;
  const uint64_t request_handle = up->second->request;
  uploads_.erase(up);
  auto it = requests_.find(request_handle);
  if (it == requests_.end()) return;
  Request& request = *it->second;
  const std::set<int>& left = request.left[node];
  if (!left.empty()) {
    EndRequest(request, absl::UnavailableError(absl::StrCat(
                            "node ", node, " ended its log upload before rank ", *left.begin(),
                            " was complete", status.ok() ? "" : ": ", status.message())));
  }
}

void LogRelay::NodeLost(const std::string& node) {
  std::vector<uint64_t> broken;
  for (const auto& [handle, request] : requests_) {
    auto left = request->left.find(node);
    if (left != request->left.end() && !left->second.empty()) broken.push_back(handle);
  }
  for (uint64_t handle : broken) {
    EndRequest(*requests_.at(handle),
               absl::UnavailableError(absl::StrCat("node ", node, " was lost")));
  }
}

void LogRelay::ExpireAttachDeadlines() {
  const absl::Time now = clock_->Now();
  std::vector<uint64_t> late;
  for (const auto& [handle, request] : requests_) {
    if (request->attach_deadline > now) continue;
    for (const auto& [node, ranks] : request->left) {
      if (!ranks.empty() && !request->uploads.contains(node)) {
        late.push_back(handle);
        break;
      }
    }
  }
  for (uint64_t handle : late) {
    Request& request = *requests_.at(handle);
    std::string node;
    for (const auto& [name, ranks] : request.left) {
      if (!ranks.empty() && !request.uploads.contains(name)) node = name;
    }
    EndRequest(request, absl::UnavailableError(absl::StrCat("node ", node,
                                                            " did not start uploading logs within ",
                                                            FormatDurationShort(attach_timeout_))));
  }
}

void LogRelay::Shutdown(const absl::Status& status) {
  if (shut_down_) return;
  shut_down_ = true;
  while (!requests_.empty()) EndRequest(*requests_.begin()->second, status);
  for (auto& [handle, upload] : uploads_) {
    if (upload->control != nullptr) upload->control->Abort(status);
    upload->control = nullptr;
  }
}

}  // namespace mesh::coordinator
