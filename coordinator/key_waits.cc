#include "coordinator/key_waits.h"

#include <utility>

namespace mesh::coordinator {

std::optional<std::vector<std::string>> KeyWaitIndex::Advance(uint64_t id, KeyWait& wait,
                                                              Lookup find) {
  Unpark(id, wait);
  auto park = [&] {
    parked_[wait.keys[wait.next]].insert(id);
    wait.parked = true;
    ++num_parked_;
    return std::nullopt;
  };
  while (wait.next < wait.keys.size() && find(wait.keys[wait.next]) != nullptr) ++wait.next;
  if (wait.next < wait.keys.size()) return park();
  // Every key was present when passed; re-read them all, since one may have
  // been deleted since.
  std::vector<std::string> values;
  values.reserve(wait.keys.size());
  for (size_t i = 0; i < wait.keys.size(); ++i) {
    const std::string* value = find(wait.keys[i]);
    if (value == nullptr) {
      wait.next = i;
      return park();
    }
    values.push_back(*value);
  }
  return values;
}

std::vector<uint64_t> KeyWaitIndex::Release(const std::string& key) {
  auto it = parked_.find(key);
  if (it == parked_.end()) return {};
  std::vector<uint64_t> ids(it->second.begin(), it->second.end());
  parked_.erase(it);
  num_parked_ -= ids.size();
  return ids;
}

void KeyWaitIndex::Unpark(uint64_t id, KeyWait& wait) {
  if (!wait.parked) return;
  wait.parked = false;
  auto it = parked_.find(wait.keys[wait.next]);
  // Absent after a Release of that key.
  if (it == parked_.end() || it->second.erase(id) == 0) return;
  --num_parked_;
  if (it->second.empty()) parked_.erase(it);
}

void KeyWaitIndex::Clear() {
  parked_.clear();
  num_parked_ = 0;
}

}  // namespace mesh::coordinator
