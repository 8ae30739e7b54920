// PrefixStore: a namespace inside another Store.
//
// Every key is stored in the base store as "<prefix>/<key>", so process
// groups, Gloo contexts or tests that share one store (and one coordinator
// generation) cannot see each other's keys. Prefix stores nest:
// PrefixStore("b", PrefixStore("a", s)) stores "a/b/<key>".
//
// Semantics are the base store's, key by key: blocking, atomicity, limits
// and errors all come from the base, and error messages name the full
// (prefixed) key. Two differences:
//
//   * NumKeys() forwards to the base store and so counts every key of the
//     base, not only the keys under this prefix. This is what c10d's
//     PrefixStore does; no Store operation can count a prefix atomically.
//   * The default timeout is this store's own. It starts as the base's
//     timeout at construction; SetTimeout on either store does not change
//     the other.
//
// Ownership: the base store is shared (std::shared_ptr), so a PrefixStore
// handed to a long-lived user (a Gloo context, a process group) keeps its
// base alive. Shutting the base down (InMemoryStore::Shutdown, a coordinator
// going away) fails this store's calls as it fails the base's.
//
// Thread safety: thread-safe (the base store is).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mesh/store.h"

namespace mesh {

class PrefixStore final : public Store {
 public:
  // `base` must not be null (checked). `prefix` may be any string; "" gives
  // keys of the form "/<key>".
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string Prefixed(absl::string_view key) const;
  std::vector<std::string> Prefixed(absl::Span<const std::string> keys) const;

  absl::Status DoSet(const std::string& key, absl::string_view value) override;
  absl::StatusOr<std::string> DoGet(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<std::string> DoTryGet(const std::string& key) override;
  absl::Status DoWait(absl::Span<const std::string> keys, absl::Duration timeout) override;
  absl::StatusOr<int64_t> DoAdd(const std::string& key, int64_t delta) override;
  absl::StatusOr<CompareSetResult> DoCompareSet(const std::string& key, absl::string_view expected,
                                                absl::string_view desired) override;
  absl::StatusOr<bool> DoDeleteKey(const std::string& key) override;
  absl::StatusOr<int64_t> DoNumKeys() override;
  absl::StatusOr<std::vector<std::string>> DoMultiGet(absl::Span<const std::string> keys,
                                                      absl::Duration timeout) override;
  absl::Status DoMultiSet(absl::Span<const std::string> keys,
                          absl::Span<const std::string> values) override;

  const std::string prefix_;
  const std::shared_ptr<Store> base_;
};

}  // namespace mesh
