// KvTable: the keys and values of one job generation's key-value store, with
// its limits. A plain data structure: waiting for keys, fencing and error
// context (job, generation) belong to the owner (Coordination).
//
// Limits (KvLimits): a key is 1..max_key_bytes bytes, a value at most
// max_value_bytes; the table holds at most max_keys keys and at most
// max_total_bytes bytes, counting each entry as key size + value size.
//
// Every mutation is all or nothing: it checks every limit against the state
// it would produce before it changes anything, so an error leaves the table
// exactly as it was.
//
// Error contract of the mutations:
//   INVALID_ARGUMENT    an empty key; Add on a value that is not a decimal
//                       int64, or a sum that overflows.
//   RESOURCE_EXHAUSTED  a key or value over its size limit, or a key count or
//                       byte total over its quota.
// Messages name the key and the numbers, but not the job or generation; the
// owner prefixes those.
//
// Thread safety: none. The owner's mutex guards every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mesh::coordinator {

struct KvLimits {
  size_t max_key_bytes = 1024;
  size_t max_value_bytes = 1 << 20;
  // Per job generation: the sum of key and value sizes, and the key count.
  int64_t max_total_bytes = int64_t{256} << 20;
  int64_t max_keys = 1'000'000;
};

// Possible errors: INVALID_ARGUMENT when a limit is not positive.
absl::Status ValidateKvLimits(const KvLimits& limits);

// Errors: INVALID_ARGUMENT for an empty key, RESOURCE_EXHAUSTED for one over
// `max_key_bytes`. Shared by every table whose keys follow the KV rules.
absl::Status CheckKvKey(const std::string& key, size_t max_key_bytes);

struct CompareSetResult {
  bool swapped = false;
  bool present = false;  // Whether the key exists after the call.
  std::string value;     // Its value after the call.
};

struct KvListResult {
  std::vector<std::string> keys;
  bool truncated = false;
};

struct KvStats {
  int64_t num_keys = 0;
  int64_t total_bytes = 0;
};

class KvTable {
 public:
  using Entries = std::vector<std::pair<std::string, std::string>>;

  // List page sizes: a request of 0 means kDefaultListLimit.
  static constexpr int kMaxListLimit = 10000;
  static constexpr int kDefaultListLimit = 1000;

  // `limits` must pass ValidateKvLimits (checked).
  explicit KvTable(KvLimits limits);

  KvTable(const KvTable&) = delete;
  KvTable& operator=(const KvTable&) = delete;

  const KvLimits& limits() const { return limits_; }

  // See CheckKvKey.
  absl::Status CheckKey(const std::string& key) const;

  // The value of `key`, or null. Valid until the next mutation.
  const std::string* Find(const std::string& key) const;

  // Values of `keys`, in order. Errors: CheckKey's; NOT_FOUND naming the
  // first absent key.
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys) const;

  // Stores every entry (a later entry for the same key wins), or none.
  absl::Status Set(Entries entries);
  absl::Status Set(const std::string& key, std::string value);

  // Adds `delta` to the decimal int64 under `key` (absent counts as 0) and
  // returns the new value.
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);

  // Stores `desired` if `key` holds `expected` (nullopt: if it is absent).
  // The key and `desired` are checked against the size limits whether or
  // not they match; the quotas only when a swap would happen.
  absl::StatusOr<CompareSetResult> CompareSet(const std::string& key,
                                              const std::optional<std::string>& expected,
                                              std::string desired);

  // Deletes `key`, or every key that starts with it; returns how many. An
  // empty prefix deletes every key.
  int64_t Delete(const std::string& key, bool prefix);

  // Keys with `prefix` that sort after `start_after`, in order; at most
  // `limit` (which must be >= 1; see ListLimit).
  KvListResult List(const std::string& prefix, const std::string& start_after, int limit) const;

  // The page size for a requested list limit. Errors: INVALID_ARGUMENT when
  // it is outside 0..kMaxListLimit.
  static absl::StatusOr<int> ListLimit(int requested);

  KvStats Stats() const;

 private:
  // Checks that storing `entries` keeps every limit.
  absl::Status CheckSet(const Entries& entries) const;
  void Store(const std::string& key, std::string value);

  const KvLimits limits_;
  // Ordered, for List and prefix deletes.
  std::map<std::string, std::string> data_;
  int64_t total_bytes_ = 0;
};

}  // namespace mesh::coordinator
