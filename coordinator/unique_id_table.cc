#include "coordinator/unique_id_table.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "coordinator/kv_table.h"

namespace mesh::coordinator {

absl::Status UniqueIdTable::CheckKey(const std::string& key) const {
  return CheckKvKey(key, max_key_bytes_);
}

const std::string* UniqueIdTable::Find(const std::string& key) const {
  auto it = ids_.find(key);
  return it == ids_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::vector<std::string>> UniqueIdTable::Publish(Ids ids) {
  // Validate everything first: all or nothing. `given` catches a key passed
  // twice in one call with different bytes.
  absl::flat_hash_map<std::string, const std::string*> given;
  for (const auto& [key, id] : ids) {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
    if (id.size() != kUniqueIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unique ID '", key, "' has ", id.size(), " bytes; an ncclUniqueId has ", kUniqueIdBytes));
    }
    const std::string* old = Find(key);
    if (old == nullptr) {
      auto [it, inserted] = given.try_emplace(key, &id);
      old = inserted ? nullptr : it->second;
    }
    if (old != nullptr && *old != id) {
      return absl::AlreadyExistsError(
          absl::StrCat("unique ID '", key, "' was already published with different bytes"));
    }
  }
  // `given` holds exactly the keys that are new to the table.
  if (static_cast<int64_t>(ids_.size() + given.size()) > max_ids_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(given.size(), " new unique IDs would make ", ids_.size() + given.size(),
                     ", over the limit of ", max_ids_, " per generation"));
  }
  std::vector<std::string> added;
  for (auto& [key, id] : ids) {
    if (ids_.try_emplace(key, std::move(id)).second) added.push_back(key);
  }
  return added;
}

}  // namespace mesh::coordinator
