// One way to print a duration in messages, logs and CLI output: rounded to
// what a reader needs, with its unit, e.g. "4.05 s", "250 ms", "2 min 30 s".
// absl::FormatDuration prints every digit ("4.05485s"), which reads as noise
// in an error message.
//
//   |d| < 1 ms      "850 us", "12.5 us"   (3 significant digits)
//   |d| < 1 s       "250 ms", "12.5 ms"   (3 significant digits)
//   |d| < 1 min     "4.05 s", "10 s"      (at most 2 decimals)
//   |d| < 1 h       "2 min 30 s", "5 min" (whole seconds)
//   otherwise       "3 h 5 min", "2 h"    (whole minutes)
//   infinite        "forever" / "-forever"
//
// Trailing zeros are dropped, negative durations get a leading '-'.
// Thread safety: a pure function.
#pragma once

#include <string>

#include "absl/time/time.h"

namespace mesh {

std::string FormatDurationShort(absl::Duration d);

}  // namespace mesh
