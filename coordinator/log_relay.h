// LogRelay: the fan-in of worker logs to `meshctl logs` readers. One GetLogs
// request asks several nodes for some ranks each; every asked node opens an
// UploadLogs call (an upload) and streams chunks of its ranks until each
// rank's eof chunk. The relay matches uploads to their request, passes every
// chunk on to the request's reader and ends the request once every asked
// rank has sent its eof, or as soon as it cannot complete.
//
//   Start ──▶ waiting for uploads ──Attach (each node)──▶ relaying chunks
//                 │                                          │
//                 │ a node not attached within               │ every rank's eof:  End(OK)
//                 │ attach_timeout: End(UNAVAILABLE)         │ an upload ends early,
//                 │ a node lost: End(UNAVAILABLE)            │ a node lost: End(UNAVAILABLE)
//                 ▼                                          ▼
//               ended (Cancel or Shutdown end it too; Cancel without End)
//
// When a request ends, the uploads of nodes that still owe ranks are aborted
// (UploadControl::Abort with CANCELLED); an upload that delivered all of its
// ranks ends by itself. Shutdown also aborts every upload still attached.
//
// Who orders the nodes to upload is the owner's business (JobManager sends
// UPLOAD_LOGS orders naming RequestId(handle)); the relay knows only which
// ranks each node owes.
//
// Limits: the relay holds no chunk: each one is handed to the reader's sink
// inside Chunk(), so memory and back-pressure are the sink's (the RPC
// layer's reactor queues them, optionally capped). A request waits at most
// attach_timeout for each node to attach; after that only the uploads'
// own progress bounds it (a follow request lasts until its ranks end).
// There is no cap on the number of requests: each is one GetLogs call,
// which the RPC server limits.
//
// Ownership: sinks and controls are borrowed. A request's sink must stay
// valid until the request has ended (End ran) or Cancel has returned; an
// upload's control until UploadEnded has returned.
//
// Thread safety: not thread-safe. The owner serializes every call (JobManager
// holds its mutex around them), and sinks and controls are called inside
// those calls, so their rules are StreamSink's (stream_sink.h): no blocking,
// no calls back into the owner.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/stream_sink.h"
#include "mesh/v1/job.pb.h"

namespace mesh::coordinator {

using LogSink = StreamSink<mesh::v1::LogChunk>;

// The agent side of one UploadLogs call, so the relay can end it early (its
// reader went away). Abort is called at most once, inside a LogRelay call;
// it must not block or call into the relay or its owner.
class UploadControl {
 public:
  virtual ~UploadControl() = default;
  virtual void Abort(const absl::Status& status) = 0;
};

class LogRelay {
 public:
  // Node name → the ranks asked of it (each set non-empty).
  using RanksByNode = std::map<std::string, std::set<int>>;

  // `clock` must outlive the relay; `attach_timeout` must be positive.
  LogRelay(const Clock* clock, absl::Duration attach_timeout);
  ~LogRelay();

  LogRelay(const LogRelay&) = delete;
  LogRelay& operator=(const LogRelay&) = delete;

  // Opens a request for `ranks` whose chunks go to `sink`; its nodes must
  // attach within attach_timeout from now. Returns its handle, for Cancel
  // and RequestId. Possible errors: INVALID_ARGUMENT when `ranks` is empty
  // or names a node with no rank; UNAVAILABLE after Shutdown.
  absl::StatusOr<uint64_t> Start(RanksByNode ranks, LogSink* sink);

  // The id an agent's upload names its request by ("logs-<handle>").
  static std::string RequestId(uint64_t handle);

  // The reader went away: ends the request without calling its sink and
  // aborts its uploads. Unknown or ended handles are ignored.
  void Cancel(uint64_t handle);

  // Attaches `node`'s upload to the request `request_id` names.
  // Possible errors: NOT_FOUND (malformed id, or the request has ended or
  // never existed); FAILED_PRECONDITION (the request did not ask `node`, or
  // its upload is already attached).
  absl::StatusOr<uint64_t> Attach(const std::string& node, const std::string& request_id,
                                  UploadControl* control);

  // One chunk of an attached upload, passed on to the reader; an eof chunk
  // ends its rank. Possible errors: CANCELLED once the upload or its request
  // has ended (finish the call); INVALID_ARGUMENT for a rank the request did
  // not ask of this node, or whose eof has already come.
  absl::Status Chunk(uint64_t upload, const mesh::v1::LogChunk& chunk);

  // The upload's call ended (`status`: how). A node that still owed ranks
  // ends its request with UNAVAILABLE. Unknown handles are ignored.
  void UploadEnded(uint64_t upload, const absl::Status& status);

  // `node` is gone: every request still waiting for its ranks ends with
  // UNAVAILABLE.
  void NodeLost(const std::string& node);

  // Ends with UNAVAILABLE every request with a node that owes ranks and has
  // not attached within attach_timeout. Call periodically.
  void ExpireAttachDeadlines();

  // Ends every request with `status` and aborts every attached upload with
  // it; later Starts fail with UNAVAILABLE. Idempotent.
  void Shutdown(const absl::Status& status);

  // Requests not yet ended.
  int active_requests() const { return static_cast<int>(requests_.size()); }

 private:
  struct Request;
  struct Upload;

  void EndRequest(Request& request, const absl::Status& status);

  const Clock* const clock_;
  const absl::Duration attach_timeout_;
  bool shut_down_ = false;
  uint64_t next_handle_ = 1;
  std::map<uint64_t, std::unique_ptr<Request>> requests_;
  std::map<uint64_t, std::unique_ptr<Upload>> uploads_;
};

}  // namespace mesh::coordinator
