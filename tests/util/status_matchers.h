// gMock matchers for absl::Status and absl::StatusOr<T>, shared by every
// test (Abseil 20220623 ships none): IsOk(), IsOkAndHolds(matcher),
// StatusIs(code), StatusIs(code, message_matcher).
#pragma once

#include <string>

#include <gmock/gmock.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mesh::testing {

inline absl::Status GetStatus(const absl::Status& status) { return status; }
template <typename T>
absl::Status GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status status = ::mesh::testing::GetStatus(arg);
  *result_listener << "status is " << status;
  return status.ok();
}

// A StatusOr<T> that is OK and whose value matches `matcher`.
MATCHER_P(IsOkAndHolds, matcher, "") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(matcher, *arg, result_listener);
}

MATCHER_P(StatusIs, code, "") {
  const absl::Status status = ::mesh::testing::GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == code;
}

MATCHER_P2(StatusIs, code, message_matcher, "") {
  const absl::Status status = ::mesh::testing::GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == code &&
         ::testing::ExplainMatchResult(message_matcher, std::string(status.message()),
                                       result_listener);
}

}  // namespace mesh::testing
