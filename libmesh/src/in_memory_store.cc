#include "mesh/in_memory_store.h"

#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace mesh {

InMemoryStore::InMemoryStore(InMemoryStoreOptions options)
    : Store(options.timeout), options_(std::move(options)) {}

InMemoryStore::~InMemoryStore() {
  Shutdown();
  // Blocked callers still hold pointers into this object until they have
  // seen shut_down_ and left AwaitKeysLocked.
  absl::MutexLock lock(&mu_);
  auto drained = [this]() {
    mu_.AssertReaderHeld();
    return blocked_ == 0;
  };
  mu_.Await(absl::Condition(&drained));
}

void InMemoryStore::Shutdown() {
  // Every waiter's condition reads shut_down_; the unlock re-evaluates them.
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
}

int InMemoryStore::NumBlocked() const {
  absl::ReaderMutexLock lock(&mu_);
  return blocked_;
}

absl::Status InMemoryStore::CheckOpenLocked() const {
  if (!shut_down_) return absl::OkStatus();
  return absl::UnavailableError("in-memory store is shut down");
}

absl::Status InMemoryStore::CheckSizes(const std::string& key, absl::string_view value) const {
  if (key.size() > options_.max_key_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "key of ", key.size(), " bytes exceeds the limit of ", options_.max_key_bytes));
  }
  if (value.size() > options_.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("value of ", value.size(), " bytes for key '",
                                                     key, "' exceeds the limit of ",
                                                     options_.max_value_bytes));
  }
  return absl::OkStatus();
}

absl::Status InMemoryStore::CheckKeyCountLocked(int64_t new_keys) const {
  const int64_t keys = static_cast<int64_t>(data_.size());
  if (new_keys <= options_.max_keys - keys) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("storing ", new_keys, " new key(s) beside ",
                                                   keys, " exceeds the limit of ",
                                                   options_.max_keys, " keys"));
}

void InMemoryStore::StoreLocked(const std::string& key, std::string value) {
  data_.insert_or_assign(key, std::move(value));
}

bool InMemoryStore::HasAllLocked(absl::Span<const std::string> keys) const {
  for (const std::string& key : keys) {
    if (!data_.contains(key)) return false;
  }
  return true;
}

absl::Status InMemoryStore::AwaitKeysLocked(absl::Span<const std::string> keys,
                                            absl::Duration timeout,
                                            std::vector<std::string>* values) {
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  // Evaluated by absl::Mutex whenever a writer releases mu_, so a waiter
  // wakes exactly when a write (or Shutdown) may have satisfied it.
  auto ready = [this, keys]() {
    mu_.AssertReaderHeld();
    return shut_down_ || HasAllLocked(keys);
  };
  ++blocked_;
  const bool satisfied = mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  --blocked_;
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  if (!satisfied) {
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (!data_.contains(key)) missing.push_back(key);
    }
    return KeyTimeoutError(missing, timeout);
  }
  if (values != nullptr) {
    values->clear();
    values->reserve(keys.size());
    for (const std::string& key : keys) values->push_back(data_.find(key)->second);
  }
  return absl::OkStatus();
}

absl::Status InMemoryStore::DoSet(const std::string& key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  if (absl::Status s = CheckSizes(key, value); !s.ok()) return s;
  if (absl::Status s = CheckKeyCountLocked(data_.contains(key) ? 0 : 1); !s.ok()) return s;
  StoreLocked(key, std::string(value));
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::DoGet(const std::string& key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> values;
  if (absl::Status s = AwaitKeysLocked({key}, timeout, &values); !s.ok()) return s;
  return std::move(values.front());
}

absl::StatusOr<std::string> InMemoryStore::DoTryGet(const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  auto it = data_.find(key);
  if (it == data_.end()) return absl::NotFoundError(absl::StrCat("key '", key, "' is not set"));
  return it->second;
}

absl::Status InMemoryStore::DoWait(absl::Span<const std::string> keys, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return AwaitKeysLocked(keys, timeout, nullptr);
}

absl::StatusOr<std::vector<std::string>> InMemoryStore::DoMultiGet(
    absl::Span<const std::string> keys, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> values;
  if (absl::Status s = AwaitKeysLocked(keys, timeout, &values); !s.ok()) return s;
  return values;
}

absl::StatusOr<int64_t> InMemoryStore::DoAdd(const std::string& key, int64_t delta) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  int64_t current = 0;
  auto it = data_.find(key);
  if (it != data_.end() && !absl::SimpleAtoi(it->second, &current)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", key, "' holds a value that is not a decimal int64"));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(current, delta, &sum)) {
    return absl::InvalidArgumentError(
        absl::StrCat("adding ", delta, " to key '", key, "' overflows int64"));
  }
  std::string value = absl::StrCat(sum);
  if (absl::Status s = CheckSizes(key, value); !s.ok()) return s;
  if (absl::Status s = CheckKeyCountLocked(it == data_.end() ? 1 : 0); !s.ok()) return s;
  StoreLocked(key, std::move(value));
  return sum;
}

absl::StatusOr<CompareSetResult> InMemoryStore::DoCompareSet(const std::string& key,
                                                             absl::string_view expected,
                                                             absl::string_view desired) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  auto it = data_.find(key);
  // c10d: an empty `expected` stands for "absent" as well as for "".
  const bool match = it == data_.end() ? expected.empty() : it->second == expected;
  CompareSetResult result;
  if (match) {
    if (absl::Status s = CheckSizes(key, desired); !s.ok()) return s;
    if (absl::Status s = CheckKeyCountLocked(it == data_.end() ? 1 : 0); !s.ok()) return s;
    StoreLocked(key, std::string(desired));
    result.swapped = true;
    result.present = true;
    result.value = std::string(desired);
  } else if (it != data_.end()) {
    result.present = true;
    result.value = it->second;
  }
  return result;
}

absl::StatusOr<bool> InMemoryStore::DoDeleteKey(const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  return data_.erase(key) > 0;
}

absl::StatusOr<int64_t> InMemoryStore::DoNumKeys() {
  absl::ReaderMutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  return static_cast<int64_t>(data_.size());
}

absl::Status InMemoryStore::DoMultiSet(absl::Span<const std::string> keys,
                                       absl::Span<const std::string> values) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  // Check everything before storing anything: all or nothing.
  std::set<absl::string_view> new_keys;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (absl::Status s = CheckSizes(keys[i], values[i]); !s.ok()) return s;
    if (!data_.contains(keys[i])) new_keys.insert(keys[i]);
  }
  if (absl::Status s = CheckKeyCountLocked(static_cast<int64_t>(new_keys.size())); !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < keys.size(); ++i) StoreLocked(keys[i], values[i]);
  return absl::OkStatus();
}

}  // namespace mesh
