#include "common/clock.h"

#include "common/check.h"

namespace mesh {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* const clock = new RealClock();  // Never destroyed.
  return clock;
}

FakeClock::FakeClock() : FakeClock(absl::FromUnixSeconds(1'700'000'000)) {}

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::Advance(absl::Duration d) {
  MESH_CHECK(d >= absl::ZeroDuration(), "FakeClock cannot go backwards");
  absl::MutexLock lock(&mu_);
  now_ += d;
}

}  // namespace mesh
