// Shared pieces of the meshrt._meshrt extension: status -> exception
// conversion, GIL helpers and the registration entry points of each
// translation unit.
//
// The extension is a thin layer over libmesh (docs/python.md): it converts
// types, releases the GIL around every call that may block, and turns
// absl::Status errors into Python exceptions. Nothing here holds logic of its
// own beyond that.
//
// Errors: a non-OK absl::Status becomes meshrt.Error or one of its subclasses
// (ThrowStatus), with `.code` the status code's name ("ABORTED") and
// `.message` its message:
//
//   ABORTED            -> JobFailedError      (the job's generation failed or
//                                              this process was fenced off)
//   DEADLINE_EXCEEDED  -> TimeoutError        (also the builtin TimeoutError)
//   NOT_FOUND          -> NotFoundError
//   INVALID_ARGUMENT   -> InvalidArgumentError (also ValueError)
//   UNAVAILABLE        -> UnavailableError
//   anything else      -> Error
//
// A Python argument of the wrong type is a TypeError, also where a binding
// converts it itself (py::cast_error, by a translator local to the module).
//
// Thread safety: ThrowStatus and the translator run with the GIL held (they
// run where pybind11 converts C++ exceptions). The registration functions run
// once, at import.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mesh {
class Runtime;
class Store;
class Tensor;
}  // namespace mesh

namespace meshrt {

namespace py = pybind11;

// Thrown by the binding code for a non-OK status; the translator registered
// in module.cc turns it into the matching meshrt exception. `error_class`
// kJobFailed overrides the class chosen from the code: JobFailedError for
// the store and Runtime.health() once the job failed, whatever the code
// (e.g. UNAVAILABLE for a lost coordinator). Process groups map by code.
enum class ErrorClass { kByCode, kJobFailed };
struct StatusError {
  absl::Status status;
  ErrorClass error_class = ErrorClass::kByCode;
};

[[noreturn]] inline void ThrowStatus(absl::Status status,
                                     ErrorClass error_class = ErrorClass::kByCode) {
  throw StatusError{std::move(status), error_class};
}

inline void Check(absl::Status status) {
  if (!status.ok()) ThrowStatus(std::move(status));
}

template <typename T>
T Unwrap(absl::StatusOr<T> value) {
  if (!value.ok()) ThrowStatus(std::move(value).status());
  return *std::move(value);
}

// The exception ThrowStatus would raise, as an object (not raised).
py::object ExceptionObject(absl::Status status, ErrorClass error_class = ErrorClass::kByCode);

// Float seconds from Python (None -> `fallback`). Raises TypeError for a
// value that is not a number, InvalidArgumentError for one that is not
// positive and finite.
absl::Duration SecondsArg(const py::handle& seconds, absl::Duration fallback, const char* what);

// Whether the interpreter is shutting down: then no thread may take the GIL
// (module.cc).
bool PythonIsFinalizing();

// A Python tensor (anything with __dlpack__) as a libmesh tensor over the
// same memory (tensors.cc). Raises TypeError, ValueError or
// InvalidArgumentError as the ops do, naming `what`. Needs the GIL.
mesh::Tensor ImportTensor(const py::handle& obj, const char* what);

// Registration, one per translation unit (called from PYBIND11_MODULE).
void RegisterErrors(py::module_& m);     // module.cc
void RegisterTensors(py::module_& m);    // tensors.cc: groups, meshes, DTensor
void BindStore(py::module_& m);          // store.cc: meshrt.Store
void RegisterJobClient(py::module_& m);  // job_client.cc
// elastic.cc: meshrt.ElasticMesh. `runtime_of` returns the mesh::Runtime
// behind a meshrt.Runtime (whose wrapper class is private to module.cc), or
// raises FAILED_PRECONDITION once it was closed.
using RuntimeOf = std::shared_ptr<mesh::Runtime> (*)(py::handle runtime);
void RegisterElastic(py::module_& m, RuntimeOf runtime_of);

// Benchmark hooks, not API (bench_hooks.cc): the private submodule
// meshrt._meshrt._bench that bench/python_bench.py times the bindings
// against. `store_of` returns the mesh::Store behind a meshrt.Store (whose
// wrapper class, PyStore, is private to store.h).
using StoreOf = mesh::Store& (*)(py::handle store);
void RegisterBenchHooks(py::module_& m, StoreOf store_of);

}  // namespace meshrt
