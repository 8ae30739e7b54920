#include "mesh/prefix_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace mesh {
namespace {

// Runs before the Store base is constructed, which needs the base's timeout.
absl::Duration BaseTimeout(const std::shared_ptr<Store>& base) {
  MESH_CHECK(base != nullptr, "PrefixStore needs a base store");
  return base->timeout();
}

}  // namespace

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : Store(BaseTimeout(base)), prefix_(std::move(prefix)), base_(std::move(base)) {}

std::string PrefixStore::Prefixed(absl::string_view key) const {
  return absl::StrCat(prefix_, "/", key);
}

std::vector<std::string> PrefixStore::Prefixed(absl::Span<const std::string> keys) const {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& key : keys) prefixed.push_back(Prefixed(key));
  return prefixed;
}

absl::Status PrefixStore::DoSet(const std::string& key, absl::string_view value) {
  return base_->Set(Prefixed(key), value);
}

absl::StatusOr<std::string> PrefixStore::DoGet(const std::string& key, absl::Duration timeout) {
  return base_->Get(Prefixed(key), timeout);
}

absl::StatusOr<std::string> PrefixStore::DoTryGet(const std::string& key) {
  return base_->TryGet(Prefixed(key));
}

absl::Status PrefixStore::DoWait(absl::Span<const std::string> keys, absl::Duration timeout) {
  return base_->Wait(Prefixed(keys), timeout);
}

absl::StatusOr<int64_t> PrefixStore::DoAdd(const std::string& key, int64_t delta) {
  return base_->Add(Prefixed(key), delta);
}

absl::StatusOr<CompareSetResult> PrefixStore::DoCompareSet(const std::string& key,
                                                           absl::string_view expected,
                                                           absl::string_view desired) {
  return base_->CompareSet(Prefixed(key), expected, desired);
}

absl::StatusOr<bool> PrefixStore::DoDeleteKey(const std::string& key) {
  return base_->DeleteKey(Prefixed(key));
}

absl::StatusOr<int64_t> PrefixStore::DoNumKeys() { return base_->NumKeys(); }

absl::StatusOr<std::vector<std::string>> PrefixStore::DoMultiGet(absl::Span<const std::string> keys,
                                                                 absl::Duration timeout) {
  return base_->MultiGet(Prefixed(keys), timeout);
}

absl::Status PrefixStore::DoMultiSet(absl::Span<const std::string> keys,
                                     absl::Span<const std::string> values) {
  return base_->MultiSet(Prefixed(keys), values);
}

}  // namespace mesh
