#include "libmesh/src/backends/gloo/gloo_store.h"

#include <utility>

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

GlooStore::GlooStore(std::shared_ptr<mesh::Store> store) : store_(std::move(store)) {
  MESH_CHECK(store_ != nullptr, "GlooStore needs a store");
}

GlooStore::~GlooStore() = default;

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  ThrowIfError(store_->Set(key, absl::string_view(data.data(), data.size())),
               absl::StrCat("set '", key, "'"));
}

std::vector<char> GlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> value = store_->Get(key);
  ThrowIfError(value.status(), absl::StrCat("get '", key, "'"));
  return std::vector<char>(value->begin(), value->end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  ThrowIfError(store_->Wait(keys), absl::StrCat("wait ", Quote(keys)));
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  // gloo's kNoTimeout is 0; a mesh store never waits forever, so "no
  // timeout" means the store's default.
  if (timeout <= std::chrono::milliseconds::zero()) return wait(keys);
  ThrowIfError(store_->Wait(keys, absl::FromChrono(timeout)), absl::StrCat("wait ", Quote(keys)));
}

}  // namespace mesh::gloo_backend
