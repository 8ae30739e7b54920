// PendingCall: one blocking call made on its own thread, so a test can
// start several waits, disturb the server (kill -9, SIGTERM) and then check
// how and when each ended. The destructor joins the thread, so every call
// must end on its own (each has a deadline).
//
// Thread safety: thread-safe.
#pragma once

#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mesh::testing {

// `Status` is what the call returns: absl::Status or grpc::Status.
template <typename Status>
class PendingCall {
 public:
  template <typename Call>
  explicit PendingCall(Call call)
      : thread_([this, call = std::move(call)]() mutable {
          Status status = call();
          absl::MutexLock lock(&mu_);
          status_ = std::move(status);
          ended_ = absl::Now();
        }) {}
  ~PendingCall() { thread_.join(); }

  PendingCall(const PendingCall&) = delete;
  PendingCall& operator=(const PendingCall&) = delete;

  bool ended() {
    absl::MutexLock lock(&mu_);
    return ended_.has_value();
  }
  Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  // When the call ended; InfiniteFuture while it runs.
  absl::Time ended_at() {
    absl::MutexLock lock(&mu_);
    return ended_.value_or(absl::InfiniteFuture());
  }

 private:
  absl::Mutex mu_;
  Status status_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> ended_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // Last: started once the members above exist.
};

}  // namespace mesh::testing
