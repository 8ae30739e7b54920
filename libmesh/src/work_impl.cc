#include "work_impl.h"

#include "absl/strings/str_cat.h"
#include "common/duration_format.h"

namespace mesh::internal {

bool HostWork::Complete(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (done_) return false;
  done_ = true;
  status_ = std::move(status);
  return true;
}

absl::Status HostWork::Wait(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  // LockWhenWithTimeout would also do, but an explicit await keeps a
  // non-positive timeout a pure poll.
  if (!mu_.AwaitWithTimeout(absl::Condition(&done_), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("work still pending after ", FormatDurationShort(timeout),
                     "; the op keeps running: wait again or abort it"));
  }
  return status_;
}

bool HostWork::IsCompleted() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

absl::Status HostWork::status() const {
  absl::MutexLock lock(&mu_);
  if (!done_) return absl::FailedPreconditionError("work still pending");
  return status_;
}

void HostWork::Abort(absl::Status reason) {
  if (reason.ok()) reason = absl::AbortedError("Work::Abort called with an OK status");
  if (IsCompleted()) return;
  if (on_abort_) {
    on_abort_(std::move(reason));
  } else {
    Complete(std::move(reason));
  }
}

}  // namespace mesh::internal
