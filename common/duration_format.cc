#include "common/duration_format.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace mesh {
namespace {

// `value` with `decimals` decimals at most, trailing zeros dropped.
std::string Trimmed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, value);
  std::string s(buf);
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s;
}

// Three significant digits for a value in [1, 1000).
std::string ThreeDigits(double value) {
  const int decimals = value >= 100 ? 0 : value >= 10 ? 1 : 2;
  return Trimmed(value, decimals);
}

}  // namespace

std::string FormatDurationShort(absl::Duration d) {
  if (d < absl::ZeroDuration()) return absl::StrCat("-", FormatDurationShort(-d));
  if (d == absl::InfiniteDuration()) return "forever";
  if (d == absl::ZeroDuration()) return "0 s";
  if (d < absl::Milliseconds(1)) {
    const double us = absl::ToDoubleMicroseconds(d);
    // 999.7 us rounds to "1000 us"; say "1 ms" instead.
    if (std::round(us) >= 1000) return "1 ms";
    return absl::StrCat(ThreeDigits(us), " us");
  }
  if (d < absl::Seconds(1)) {
    const double ms = absl::ToDoubleMilliseconds(d);
    if (std::round(ms) >= 1000) return "1 s";
    return absl::StrCat(ThreeDigits(ms), " ms");
  }
  if (d < absl::Minutes(1)) {
    const double s = absl::ToDoubleSeconds(d);
    if (std::round(s * 100) >= 6000) return "1 min";
    return absl::StrCat(Trimmed(s, 2), " s");
  }
  if (d < absl::Hours(1)) {
    const int64_t total =
        absl::ToInt64Seconds(absl::Floor(d + absl::Milliseconds(500), absl::Seconds(1)));
    if (total >= 3600) return "1 h";
    const int64_t minutes = total / 60, seconds = total % 60;
    return seconds == 0 ? absl::StrCat(minutes, " min")
                        : absl::StrCat(minutes, " min ", seconds, " s");
  }
  const int64_t total = absl::ToInt64Minutes(absl::Floor(d + absl::Seconds(30), absl::Minutes(1)));
  const int64_t hours = total / 60, minutes = total % 60;
  return minutes == 0 ? absl::StrCat(hours, " h") : absl::StrCat(hours, " h ", minutes, " min");
}

}  // namespace mesh
