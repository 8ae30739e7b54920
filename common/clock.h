// Time as a dependency.
//
// Logic classes never read the system clock directly: they take a `Clock&`
// so that unit tests can drive time with `FakeClock` and make timeouts happen
// deterministically, without sleeping.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace mesh {

// Source of the current time.
//
// Thread safety: implementations must be safe to call from any thread.
class Clock {
 public:
  virtual ~Clock() = default;

  // Current wall-clock time.
  virtual absl::Time Now() const = 0;

  // Process-wide real clock; never null, never destroyed.
  static Clock* Real();
};

// A clock that moves only when told to. Starts at an arbitrary fixed instant
// so that tests print stable times.
//
// Thread safety: all methods are thread-safe.
class FakeClock final : public Clock {
 public:
  FakeClock();
  explicit FakeClock(absl::Time start);

  absl::Time Now() const override;

  // Moves the clock forward. `d` must not be negative (programmer error).
  void Advance(absl::Duration d);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mesh
