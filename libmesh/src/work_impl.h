// HostWork: a Work completed by a host thread (internal to libmesh).
//
// The backend that runs an op (Gloo's worker thread) calls Complete() once
// the op's tensors are no longer touched; Wait() blocks on a condition with
// the caller's timeout and never longer, whatever the backend is doing.
//
//   PENDING ──Complete(status)──▶ COMPLETED (status; the first call wins)
//
// Abort() does not complete the Work by itself: the op may still be writing
// into the caller's tensors, so it hands the reason to the owner (the group),
// which fails the op as fast as it can and then calls Complete(). That keeps
// the promise of mesh/work.h that a completed Work's tensors are free again.
//
// Thread safety: thread-safe.
#pragma once

#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mesh/work.h"

namespace mesh::internal {

class HostWork final : public Work {
 public:
  // Called by Abort() with a non-OK reason, at most once per Abort() call,
  // never while this Work's lock is held. May be empty.
  using AbortHandler = std::function<void(absl::Status reason)>;

  HostWork(absl::Duration default_timeout, AbortHandler on_abort)
      : default_timeout_(default_timeout), on_abort_(std::move(on_abort)) {}

  // Completes the Work with `status` and wakes every waiter. Returns false
  // (and changes nothing) when it was already completed.
  bool Complete(absl::Status status);

  using Work::Wait;
  absl::Status Wait(absl::Duration timeout) override;
  bool IsCompleted() const override;
  absl::Status status() const override;
  // An OK `reason` is replaced by ABORTED: the contract forbids it, and a
  // Work must never look successful because of an abort.
  void Abort(absl::Status reason) override;

 protected:
  absl::Duration default_timeout() const override { return default_timeout_; }

 private:
  const absl::Duration default_timeout_;
  const AbortHandler on_abort_;

  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mesh::internal
