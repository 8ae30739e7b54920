// UniqueIdTable: the NCCL unique IDs one job generation has published, by
// group key. Each key is published once: publishing the same bytes again is
// a no-op (a retried RPC, or several ranks publishing for one group), and
// different bytes are an error, because ranks that already read the first ID
// would build a different communicator than ranks reading the second.
//
// A plain data structure: waiting for IDs, fencing and error context (job,
// generation) belong to the owner (Coordination).
//
// Thread safety: none. The owner's mutex guards every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mesh::coordinator {

// sizeof(ncclUniqueId); NCCL fixes it at 128 bytes (NCCL_UNIQUE_ID_BYTES).
inline constexpr size_t kUniqueIdBytes = 128;

class UniqueIdTable {
 public:
  using Ids = std::vector<std::pair<std::string, std::string>>;

  // Keys follow the KV key rules (CheckKvKey) with this size limit; the
  // table holds at most `max_ids` IDs (a generation needs one per
  // communicator, so a cap stops a runaway loop, not a real job).
  explicit UniqueIdTable(size_t max_key_bytes, int64_t max_ids = int64_t{1} << 62)
      : max_key_bytes_(max_key_bytes), max_ids_(max_ids) {}

  UniqueIdTable(const UniqueIdTable&) = delete;
  UniqueIdTable& operator=(const UniqueIdTable&) = delete;

  // Errors: INVALID_ARGUMENT (empty key), RESOURCE_EXHAUSTED (key too long).
  absl::Status CheckKey(const std::string& key) const;

  // The ID under `key`, or null. Valid until the next Publish.
  const std::string* Find(const std::string& key) const;

  // Publishes every ID or none. Returns the keys that were not published
  // before, in the order given, once each. Errors (nothing published):
  // CheckKey's; INVALID_ARGUMENT for an ID that is not kUniqueIdBytes long;
  // ALREADY_EXISTS for a key that holds, or is given in the same call with,
  // different bytes; RESOURCE_EXHAUSTED when the new keys would take the
  // table over `max_ids`. Messages name the key, not the job.
  absl::StatusOr<std::vector<std::string>> Publish(Ids ids);

  size_t size() const { return ids_.size(); }

 private:
  const size_t max_key_bytes_;
  const int64_t max_ids_;
  std::map<std::string, std::string> ids_;
};

}  // namespace mesh::coordinator
