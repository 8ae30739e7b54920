// How the coordinator keeps the heartbeats it absorbs to a planned rate
// as the number of senders grows: ranks of a job (--rank-heartbeat-rate)
// and agents of a cluster (--node-heartbeat-rate). Senders are told a
// longer interval; the timeout that declares them dead does not change.
// Header-only; pure functions, thread-safe.
#pragma once

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace mesh {

// The interval each of `senders` is told so that together they send about
// `rate` heartbeats a second: `interval`, or senders / rate where that is
// longer, at most a third of `timeout` (and never below `interval`).
// `rate` <= 0 (off) or no senders: `interval`.
inline absl::Duration SpreadHeartbeatInterval(double senders, double rate, absl::Duration interval,
                                              absl::Duration timeout) {
  if (rate <= 0 || senders <= 0) return interval;
  const absl::Duration spread = absl::Seconds(senders / rate);
  const absl::Duration longest = std::max(interval, timeout / 3);
  return std::clamp(spread, interval, longest);
}

// OK for a rate of 0 (off) or a positive finite number of heartbeats a
// second; otherwise INVALID_ARGUMENT naming the option `name`.
inline absl::Status CheckHeartbeatRate(double rate, absl::string_view name) {
  if (!(rate >= 0) || std::isinf(rate)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " must be 0 (off) or a positive number of heartbeats a second, not ", rate));
  }
  return absl::OkStatus();
}

}  // namespace mesh
