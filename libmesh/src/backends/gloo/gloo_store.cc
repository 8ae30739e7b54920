#include "libmesh/src/backends/gloo/gloo_store.h"

#include <optional>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/check.h"

namespace mesh::gloo_backend {
namespace {

// True for codes that say the call, or the caller's state, is wrong rather
// than that the store failed to deliver.
bool IsCallerError(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return true;
    default:
      return false;
  }
}

std::string Quote(const std::vector<std::string>& keys) {
  return absl::StrCat("'", absl::StrJoin(keys, "', '"), "'");
}

}  // namespace

void ThrowIfError(const absl::Status& status, const std::string& operation) {
  if (status.ok()) return;
  const std::string what = absl::StrCat("mesh store: ", operation, ": ", status.ToString());
  if (IsCallerError(status.code())) throw StoreEnforceNotMet(__FILE__, __LINE__, what, status);
  throw StoreIoException(what, status);
}

GlooStore::GlooStore(std::shared_ptr<mesh::Store> store, int group_size)
    : store_(std::move(store)), group_size_(group_size) {
  MESH_CHECK(store_ != nullptr, "GlooStore needs a store");
}

namespace {

// gloo 0.5's connectFullMesh keys: "<rank>" holds a member's transport
// addresses and "rank_<rank>" its host name (read to compute local ranks).
// Returns the family ("" or "rank_") of a key naming a member, or nullopt.
std::optional<std::string> MemberKeyFamily(const std::string& key, int group_size) {
  for (const char* family : {"", "rank_"}) {
    if (!absl::StartsWith(key, family)) continue;
    const std::string number = key.substr(std::string(family).size());
    int rank = -1;
    if (absl::SimpleAtoi(number, &rank) && rank >= 0 && rank < group_size &&
        absl::StrCat(rank) == number) {
      return std::string(family);
    }
  }
  return std::nullopt;
}

}  // namespace

bool GlooStore::ServeFromCache(const std::vector<std::string>& keys, absl::Duration timeout) {
  if (group_size_ <= 0 || keys.empty()) return false;
  std::vector<std::string> families;
  for (const std::string& key : keys) {
    std::optional<std::string> family = MemberKeyFamily(key, group_size_);
    if (!family.has_value()) return false;
    if (!absl::c_linear_search(families, *family)) families.push_back(*std::move(family));
  }
  absl::MutexLock lock(&mu_);
  for (const std::string& family : families) {
    if (fetched_.contains(family)) continue;
    // Every member sets its keys of a family before reading its peers', so
    // waiting for the whole family cannot deadlock.
    std::vector<std::string> members;
    members.reserve(group_size_);
    for (int r = 0; r < group_size_; ++r) members.push_back(absl::StrCat(family, r));
    absl::StatusOr<std::vector<std::string>> values = store_->MultiGet(members, timeout);
    ThrowIfError(values.status(), absl::StrCat("wait ", Quote(keys)));
    for (int r = 0; r < group_size_; ++r) cache_[members[r]] = std::move((*values)[r]);
    fetched_.insert(family);
  }
  return true;
}

GlooStore::~GlooStore() = default;

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  ThrowIfError(store_->Set(key, absl::string_view(data.data(), data.size())),
               absl::StrCat("set '", key, "'"));
}

std::vector<char> GlooStore::get(const std::string& key) {
  if (ServeFromCache({key}, store_->timeout())) {
    absl::MutexLock lock(&mu_);
    const std::string& value = cache_.at(key);
    return std::vector<char>(value.begin(), value.end());
  }
  absl::StatusOr<std::string> value = store_->Get(key);
  ThrowIfError(value.status(), absl::StrCat("get '", key, "'"));
  return std::vector<char>(value->begin(), value->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  if (ServeFromCache(keys, store_->timeout())) return;
  ThrowIfError(store_->Wait(keys), absl::StrCat("wait ", Quote(keys)));
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  // gloo's kNoTimeout is 0; a mesh store never waits forever, so "no
  // timeout" means the store's default.
  if (timeout <= std::chrono::milliseconds::zero()) return wait(keys);
  if (ServeFromCache(keys, absl::FromChrono(timeout))) return;
  ThrowIfError(store_->Wait(keys, absl::FromChrono(timeout)), absl::StrCat("wait ", Quote(keys)));
}

}  // namespace mesh::gloo_backend
