// SynchronizeWork: the host-blocking wait of mesh/process_group_nccl.h. It
// only uses the Work interface, so it is compiled in every build.
#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/duration_format.h"
#include "mesh/process_group_nccl.h"

namespace mesh {

absl::Status SynchronizeWork(const Work& work, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // Small collectives finish within microseconds of issue, so spin (with
  // yields) first; then sleep, doubling up to 1 ms, so that a long op does
  // not burn a core.
  absl::Duration sleep = absl::Microseconds(5);
  for (int polls = 0; !work.IsCompleted(); ++polls) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("the op did not complete within ", FormatDurationShort(timeout),
                       " (it keeps running; wait again or abort it)"));
    }
    if (polls < 256) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(sleep);
      sleep = std::min(sleep * 2, absl::Milliseconds(1));
    }
  }
  return work.status();
}

}  // namespace mesh
