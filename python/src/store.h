// meshrt.Store's wrapper (PyStore), private to the extension: store.cc
// binds it, and module.cc hands it out (Runtime.store) and reaches through
// it for the benchmark hooks.
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "mesh/runtime.h"
#include "mesh/store.h"
#include "python/src/bindings.h"

namespace meshrt {

// meshrt.Store: the coordinator's store of this rank's (job, generation).
// Thread-safe; every call releases the GIL.
class PyStore {
 public:
  PyStore(std::shared_ptr<mesh::Store> store, std::weak_ptr<mesh::Runtime> runtime)
      : store_(std::move(store)), runtime_(std::move(runtime)) {}

  // Runs `op` (a store call) without the GIL, after checking that the job
  // is still healthy; converts its error.
  template <typename Op>
  auto Run(const char* method, Op op) -> decltype(op(std::declval<mesh::Store&>())) {
    using Result = decltype(op(std::declval<mesh::Store&>()));
    std::optional<Result> result;
    absl::Status health;
    {
      py::gil_scoped_release release;
      health = Health();
      if (health.ok()) result.emplace(op(*store_));
    }
    if (!health.ok()) ThrowUnhealthy(method, health);
    return *std::move(result);
  }

  template <typename T>
  T Value(const char* method, absl::StatusOr<T> result) {
    if (result.ok()) return *std::move(result);
    CheckCall(method, result.status());
    return T();  // Unreachable: CheckCall throws.
  }

  void CheckCall(const char* method, const absl::Status& status) {
    if (status.ok()) return;
    // A call that failed because the job failed meanwhile says so.
    absl::Status health = Health();
    if (!health.ok()) ThrowUnhealthy(method, health);
    ThrowStatus(status);
  }

  mesh::Store& store() { return *store_; }

 private:
  absl::Status Health() const {
    std::shared_ptr<mesh::Runtime> runtime = runtime_.lock();
    if (runtime == nullptr) {
      return absl::FailedPreconditionError("its Runtime was destroyed");
    }
    return runtime->health();
  }

  [[noreturn]] static void ThrowUnhealthy(const char* method, const absl::Status& health) {
    const bool failed = health.code() != absl::StatusCode::kFailedPrecondition;
    absl::Status status(health.code(),
                        absl::StrCat("meshrt.Store.", method, ": ",
                                     failed ? "the job has failed, so its store is gone: "
                                            : "the store is closed: ",
                                     health.message()));
    ThrowStatus(std::move(status), failed ? ErrorClass::kJobFailed : ErrorClass::kByCode);
  }

  std::shared_ptr<mesh::Store> store_;
  std::weak_ptr<mesh::Runtime> runtime_;
};

}  // namespace meshrt
