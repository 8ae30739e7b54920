#include "mesh/store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/duration_format.h"

namespace mesh {
namespace {

// Keys named in one message; the rest are counted.
constexpr size_t kMaxNamedKeys = 8;

bool ValidTimeout(absl::Duration timeout) {
  return timeout > absl::ZeroDuration() && timeout != absl::InfiniteDuration();
}

absl::Status CheckTimeout(absl::Duration timeout) {
  if (ValidTimeout(timeout)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("store timeout must be positive and finite, got ",
                                                 FormatDurationShort(timeout)));
}

absl::Status CheckKey(absl::string_view key) {
  if (!key.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError("store key must not be empty");
}

absl::Status CheckKeys(absl::Span<const std::string> keys) {
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

Store::Store(absl::Duration timeout) : timeout_ns_(absl::ToInt64Nanoseconds(timeout)) {
  MESH_CHECK(ValidTimeout(timeout), "a Store's default timeout must be positive and finite");
}

absl::Duration Store::timeout() const {
  return absl::Nanoseconds(timeout_ns_.load(std::memory_order_relaxed));
}

absl::Status Store::SetTimeout(absl::Duration timeout) {
  if (absl::Status s = CheckTimeout(timeout); !s.ok()) return s;
  timeout_ns_.store(absl::ToInt64Nanoseconds(timeout), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status Store::KeyTimeoutError(absl::Span<const std::string> missing, absl::Duration timeout) {
  std::string names;
  for (size_t i = 0; i < missing.size() && i < kMaxNamedKeys; ++i) {
    absl::StrAppend(&names, i == 0 ? "" : ", ", "'", missing[i], "'");
  }
  if (missing.size() > kMaxNamedKeys) {
    absl::StrAppend(&names, " and ", missing.size() - kMaxNamedKeys, " more");
  }
  return absl::DeadlineExceededError(absl::StrCat("timed out after ", FormatDurationShort(timeout),
                                                  " waiting for key(s) ", names));
}

absl::Status Store::Set(absl::string_view key, absl::string_view value) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  return DoSet(std::string(key), value);
}

absl::StatusOr<std::string> Store::Get(absl::string_view key) { return Get(key, timeout()); }

absl::StatusOr<std::string> Store::Get(absl::string_view key, absl::Duration timeout) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (absl::Status s = CheckTimeout(timeout); !s.ok()) return s;
  return DoGet(std::string(key), timeout);
}

absl::StatusOr<std::string> Store::TryGet(absl::string_view key) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  return DoTryGet(std::string(key));
}

absl::Status Store::Wait(absl::Span<const std::string> keys) { return Wait(keys, timeout()); }

absl::Status Store::Wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  if (absl::Status s = CheckKeys(keys); !s.ok()) return s;
  if (absl::Status s = CheckTimeout(timeout); !s.ok()) return s;
  if (keys.empty()) return absl::OkStatus();
  return DoWait(keys, timeout);
}

absl::StatusOr<int64_t> Store::Add(absl::string_view key, int64_t delta) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  return DoAdd(std::string(key), delta);
}

absl::StatusOr<CompareSetResult> Store::CompareSet(absl::string_view key,
                                                   absl::string_view expected,
                                                   absl::string_view desired) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  return DoCompareSet(std::string(key), expected, desired);
}

absl::StatusOr<bool> Store::DeleteKey(absl::string_view key) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  return DoDeleteKey(std::string(key));
}

absl::StatusOr<int64_t> Store::NumKeys() { return DoNumKeys(); }

absl::StatusOr<std::vector<std::string>> Store::MultiGet(absl::Span<const std::string> keys) {
  return MultiGet(keys, timeout());
}

absl::StatusOr<std::vector<std::string>> Store::MultiGet(absl::Span<const std::string> keys,
                                                         absl::Duration timeout) {
  if (absl::Status s = CheckKeys(keys); !s.ok()) return s;
  if (absl::Status s = CheckTimeout(timeout); !s.ok()) return s;
  if (keys.empty()) return std::vector<std::string>();
  return DoMultiGet(keys, timeout);
}

absl::Status Store::MultiSet(absl::Span<const std::string> keys,
                             absl::Span<const std::string> values) {
  if (keys.size() != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MultiSet got ", keys.size(), " keys but ", values.size(), " values"));
  }
  if (absl::Status s = CheckKeys(keys); !s.ok()) return s;
  if (keys.empty()) return absl::OkStatus();
  return DoMultiSet(keys, values);
}

}  // namespace mesh
