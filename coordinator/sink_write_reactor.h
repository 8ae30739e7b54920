// SinkWriteReactor: a gRPC server-streaming reactor that is also a
// JobManager StreamSink (job_manager.h). Shared by the JobService and
// NodeService adapters (WatchJobState, GetLogs, WatchAssignments); private to
// the coordinator.
//
// The manager calls Send/End with its own mutex held, from any thread; gRPC
// calls the reactions (OnWriteDone, OnCancel, OnDone) from its threads. The
// reactor queues what Send gives it and keeps one write in flight; after End
// it finishes once the queue has drained, with End's status.
//
// Lock order: manager → reactor. Send/End take mu_ under the manager's mutex,
// so the reactor never calls into the manager while holding mu_: it decides
// under mu_, unlocks, then calls Release.
//
// Lifetime: deletes itself in OnDone, after Release(handle) has returned
// (Unwatch/Cancel on the manager). Release takes the manager's mutex, under
// which every Send/End runs, so a Send or End still running on another
// thread (one that just called Finish) completes before the delete, and the
// manager never calls the sink again. gRPC calls OnDone only after every
// other reaction has returned.
//
// Stopping early (the client cancelled, a write failed, or the optional
// queue cap was exceeded): the queue is dropped, later Sends are ignored, the
// registration is released from the next reaction (never from Send, which
// runs under the manager's mutex) and the call finishes once no write is in
// flight.
//
// Thread safety: as above; every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "coordinator/job_manager.h"

namespace mesh::coordinator {

template <typename Message>
class SinkWriteReactor : public grpc::ServerWriteReactor<Message>, public StreamSink<Message> {
 public:
  // `max_queued_bytes`: 0 for no cap; otherwise when the serialized bytes
  // waiting behind the write in flight exceed it, the call ends with
  // `overflow_status`.
  explicit SinkWriteReactor(size_t max_queued_bytes = 0, absl::Status overflow_status = {})
      : max_queued_bytes_(max_queued_bytes), overflow_status_(std::move(overflow_status)) {}

  // Registers this sink: `start(sink)` returns the manager's handle or the
  // error the call finishes with (nothing registered). Call once, from the
  // method handler, without any lock held: the manager may call Send/End
  // inside `start`.
  template <typename Start>
  void Begin(Start&& start) {
    absl::StatusOr<uint64_t> handle = start(static_cast<StreamSink<Message>*>(this));
    absl::MutexLock lock(&mu_);
    if (!handle.ok()) {
      if (!finish_status_) finish_status_ = ToGrpcStatus(handle.status());
      stopping_ = true;
      queue_.clear();
    } else {
      handle_ = *handle;
      registered_ = true;
    }
    StepLocked();
  }

  // StreamSink (under the manager's mutex).
  void Send(const Message& message) override {
    absl::MutexLock lock(&mu_);
    if (ended_ || stopping_) return;
    queue_.push_back(message);
    queued_bytes_ += queue_.back().ByteSizeLong();
    if (max_queued_bytes_ > 0 && queued_bytes_ > max_queued_bytes_) {
      // Release follows from OnWriteDone: a write is in flight, or the queue
      // would not have grown.
      StopLocked(ToGrpcStatus(overflow_status_));
    }
    StepLocked();
  }

  void End(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    ended_ = true;
    if (!finish_status_) finish_status_ = ToGrpcStatus(status);
    StepLocked();
  }

  // gRPC reactions.
  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) StopLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
    }
    ReleaseIfStopping();
    absl::MutexLock lock(&mu_);
    StepLocked();
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      StopLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
    }
    ReleaseIfStopping();
    absl::MutexLock lock(&mu_);
    StepLocked();
  }

  void OnDone() override {
    std::optional<uint64_t> handle;
    {
      absl::MutexLock lock(&mu_);
      if (registered_ && !released_) handle = handle_;
      released_ = true;
    }
    if (handle) Release(*handle);
    delete this;
  }

 protected:
  // Unregisters `handle` from the manager (Unwatch/Cancel). Called at most
  // once, never with mu_ held.
  virtual void Release(uint64_t handle) = 0;

 private:
  void StopLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stopping_) return;
    stopping_ = true;
    queue_.clear();
    queued_bytes_ = 0;
    // After End the manager's status stands (the client is gone anyway).
    if (!ended_ || !finish_status_) finish_status_ = std::move(status);
  }

  void ReleaseIfStopping() ABSL_LOCKS_EXCLUDED(mu_) {
    std::optional<uint64_t> handle;
    {
      absl::MutexLock lock(&mu_);
      if (!stopping_ || !registered_ || released_) return;
      released_ = true;
      handle = handle_;
    }
    Release(*handle);
  }

  // One write at a time; Finish once there is a status and nothing left to
  // write (or the call is stopping) and no write is in flight.
  void StepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_) return;
    if (!stopping_ && !queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= current_.ByteSizeLong();
      writing_ = true;
      this->StartWrite(&current_);
      return;
    }
    if (!finish_status_) return;
    finished_ = true;
    this->Finish(*finish_status_);
  }

  const size_t max_queued_bytes_;
  const absl::Status overflow_status_;

  absl::Mutex mu_;
  std::deque<Message> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The message being written; gRPC reads it until OnWriteDone.
  Message current_ ABSL_GUARDED_BY(mu_);
  uint64_t handle_ ABSL_GUARDED_BY(mu_) = 0;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;     // The manager called End.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // Cancelled, failed or overflowed.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> finish_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mesh::coordinator
