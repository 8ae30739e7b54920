// Work: the handle of one asynchronous collective or point-to-point op.
//
// Every ProcessGroup op returns a Work at once; the op runs in the
// background (on the group's worker thread for Gloo, on the group's CUDA
// stream for NCCL). The tensors an op names must stay alive and untouched
// until its Work completes.
//
//   PENDING ──op finishes──▶ SUCCEEDED
//      │ └───op fails─────▶ FAILED (status says why)
//      └──Abort(reason) / the group is aborted──▶ FAILED (status = reason)
//
// Thread safety: all methods are thread-safe; Abort may be called from any
// thread while another thread waits.
#pragma once

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace mesh {

class Work {
 public:
  virtual ~Work() = default;

  // Waits up to `timeout` for the op to complete and returns its status.
  //
  // CPU backends block the caller until the op is done. NCCL follows CUDA
  // stream semantics: Wait makes the caller's current stream wait on the
  // op's completion event and returns without blocking the host; use
  // Synchronize-style helpers (or IsCompleted) when the host must see the
  // result.
  //
  // Possible errors: DEADLINE_EXCEEDED when `timeout` passes first (the op
  // keeps running: wait again or abort it); the op's own error (e.g.
  // UNAVAILABLE when a peer's connection broke); ABORTED or the abort reason
  // given to Abort()/ProcessGroup::Abort(), which names the failed rank when
  // the runtime aborted the group because a peer died.
  virtual absl::Status Wait(absl::Duration timeout) = 0;

  // Waits with the group's default op timeout (ProcessGroupOptions::timeout).
  absl::Status Wait() { return Wait(default_timeout()); }

  // True once the op has succeeded or failed. Never blocks.
  virtual bool IsCompleted() const = 0;

  // The op's final status once IsCompleted(); before that,
  // FAILED_PRECONDITION ("still pending").
  virtual absl::Status status() const = 0;

  // Ends the op with `reason` (must not be OK). A collective cannot be
  // cancelled on one rank alone, so this aborts the whole group: every other
  // pending and future op of the group fails with `reason` too. No-op once
  // completed.
  virtual void Abort(absl::Status reason) = 0;

 protected:
  virtual absl::Duration default_timeout() const = 0;
};

}  // namespace mesh
