#include "coordinator/kv_table.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace mesh::coordinator {
namespace {

int64_t EntryBytes(const std::string& key, const std::string& value) {
  return static_cast<int64_t>(key.size() + value.size());
}

}  // namespace

absl::Status ValidateKvLimits(const KvLimits& limits) {
  if (limits.max_key_bytes == 0 || limits.max_value_bytes == 0 || limits.max_total_bytes <= 0 ||
      limits.max_keys <= 0) {
    return absl::InvalidArgumentError("KV limits must be positive");
  }
  return absl::OkStatus();
}

absl::Status CheckKvKey(const std::string& key, size_t max_key_bytes) {
  if (key.empty()) return absl::InvalidArgumentError("key must not be empty");
  if (key.size() > max_key_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("key of ", key.size(), " bytes exceeds the limit of ", max_key_bytes));
  }
  return absl::OkStatus();
}

KvTable::KvTable(KvLimits limits) : limits_(limits) {
  MESH_CHECK(ValidateKvLimits(limits_).ok(), "KvTable needs positive limits");
}

absl::Status KvTable::CheckKey(const std::string& key) const {
  return CheckKvKey(key, limits_.max_key_bytes);
}

const std::string* KvTable::Find(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::vector<std::string>> KvTable::Get(const std::vector<std::string>& keys) const {
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
    const std::string* value = Find(key);
    if (value == nullptr) return absl::NotFoundError(absl::StrCat("key '", key, "' is not set"));
    values.push_back(*value);
  }
  return values;
}

absl::Status KvTable::CheckSet(const Entries& entries) const {
  // Final size of each key the call touches; a later entry for a key
  // replaces an earlier one, so only the last counts.
  std::map<std::string, int64_t> final_bytes;
  for (const auto& [key, value] : entries) {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
    if (value.size() > limits_.max_value_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("value of ", value.size(), " bytes for key '", key,
                       "' exceeds the limit of ", limits_.max_value_bytes));
    }
    final_bytes[key] = EntryBytes(key, value);
  }
  int64_t bytes = total_bytes_;
  int64_t keys = static_cast<int64_t>(data_.size());
  for (const auto& [key, size] : final_bytes) {
    if (const std::string* old = Find(key); old != nullptr) {
      bytes -= EntryBytes(key, *old);
    } else {
      ++keys;
    }
    bytes += size;
  }
  if (keys > limits_.max_keys) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the store would hold ", keys, " keys; the limit is ", limits_.max_keys));
  }
  if (bytes > limits_.max_total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the store would hold ", bytes, " bytes; the limit is ", limits_.max_total_bytes));
  }
  return absl::OkStatus();
}

void KvTable::Store(const std::string& key, std::string value) {
  auto [it, inserted] = data_.try_emplace(key);
  if (!inserted) total_bytes_ -= EntryBytes(key, it->second);
  it->second = std::move(value);
  total_bytes_ += EntryBytes(key, it->second);
}

absl::Status KvTable::Set(Entries entries) {
  if (absl::Status s = CheckSet(entries); !s.ok()) return s;
  for (auto& [key, value] : entries) Store(key, std::move(value));
  return absl::OkStatus();
}

absl::Status KvTable::Set(const std::string& key, std::string value) {
  Entries entries;
  entries.emplace_back(key, std::move(value));
  return Set(std::move(entries));
}

absl::StatusOr<int64_t> KvTable::Add(const std::string& key, int64_t delta) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  int64_t current = 0;
  if (const std::string* value = Find(key);
      value != nullptr && !absl::SimpleAtoi(*value, &current)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", key, "' holds a value that is not a decimal int64"));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(current, delta, &sum)) {
    return absl::InvalidArgumentError(
        absl::StrCat("adding ", delta, " to key '", key, "' (", current, ") overflows int64"));
  }
  if (absl::Status s = Set(key, absl::StrCat(sum)); !s.ok()) return s;
  return sum;
}

absl::StatusOr<CompareSetResult> KvTable::CompareSet(const std::string& key,
                                                     const std::optional<std::string>& expected,
                                                     std::string desired) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  // A value that could never be stored is bad input whatever the key holds.
  if (desired.size() > limits_.max_value_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("value of ", desired.size(), " bytes for key '", key,
                     "' exceeds the limit of ", limits_.max_value_bytes));
  }
  const std::string* current = Find(key);
  const bool match =
      expected.has_value() ? (current != nullptr && *current == *expected) : current == nullptr;
  CompareSetResult result;
  if (match) {
    if (absl::Status s = Set(key, std::move(desired)); !s.ok()) return s;
    result.swapped = true;
  }
  if (const std::string* now = Find(key); now != nullptr) {
    result.present = true;
    result.value = *now;
  }
  return result;
}

int64_t KvTable::Delete(const std::string& key, bool prefix) {
  int64_t deleted = 0;
  auto erase = [&](std::map<std::string, std::string>::iterator it) {
    total_bytes_ -= EntryBytes(it->first, it->second);
    ++deleted;
    return data_.erase(it);
  };
  if (!prefix) {
    if (auto it = data_.find(key); it != data_.end()) erase(it);
    return deleted;
  }
  for (auto it = data_.lower_bound(key); it != data_.end() && absl::StartsWith(it->first, key);) {
    it = erase(it);
  }
  return deleted;
}

KvListResult KvTable::List(const std::string& prefix, const std::string& start_after,
                           int limit) const {
  MESH_CHECK(limit >= 1, "KvTable::List needs a limit of at least 1");
  auto it = start_after < prefix ? data_.lower_bound(prefix) : data_.upper_bound(start_after);
  KvListResult result;
  for (; it != data_.end() && absl::StartsWith(it->first, prefix); ++it) {
    if (static_cast<int>(result.keys.size()) == limit) {
      result.truncated = true;
      break;
    }
    result.keys.push_back(it->first);
  }
  return result;
}

absl::StatusOr<int> KvTable::ListLimit(int requested) {
  if (requested < 0 || requested > kMaxListLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("list limit ", requested, " is outside 0..", kMaxListLimit));
  }
  return requested == 0 ? kDefaultListLimit : requested;
}

KvStats KvTable::Stats() const { return KvStats{static_cast<int64_t>(data_.size()), total_bytes_}; }

}  // namespace mesh::coordinator
