// StreamSink: where the coordinator's logic classes deliver the messages of
// one server stream (WatchJobState, GetLogs, WatchAssignments). The RPC
// layer implements it with a gRPC write reactor (sink_write_reactor.h);
// tests record what they get.
//
// Rules for the caller (JobManager, LogRelay): Send() any number of times,
// then End() exactly once, after which the sink is never touched again.
// Calls run with the caller's lock held, so a sink must not block and must
// not call back into the class that feeds it from Send/End.
#pragma once

#include "absl/status/status.h"

namespace mesh::coordinator {

template <typename Message>
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  virtual void Send(const Message& message) = 0;
  virtual void End(const absl::Status& status) = 0;
};

}  // namespace mesh::coordinator
