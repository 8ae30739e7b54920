// meshrt._meshrt._bench: BENCHMARK HOOKS, not API. bench/python_bench.py
// (docs/performance.md, "Python: store and collectives through meshrt")
// times the Python bindings against these C++ loops in the same process, on
// the very objects the Python API uses, so that the difference is what the
// bindings add:
//
//   store_set_get(store, key, value, n) -> ns per Set + Get pair
//       the mesh::Store behind a meshrt.Store (rt.store), called from C++
//       with the GIL released for the whole loop;
//   all_reduce(group, tensor, n) -> ns per all_reduce (sum) + Wait
//       the mesh::ProcessGroup behind a meshrt.ProcessGroup, on the tensor's
//       buffer imported once through DLPack (no copy: the Python path imports
//       the same buffer on every call), GIL released for the whole loop.
//
// They are left out of the public stubs (_meshrt.pyi) and of meshrt's
// __all__: nothing but the benchmark should call them.
//
// Errors: a failed call raises as the Python API would (bindings.h);
// n < 1 is InvalidArgumentError; a value read back that differs from the one
// set is an Error (INTERNAL).
#include <dlpack/dlpack.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "mesh/dlpack.h"
#include "mesh/process_group.h"
#include "mesh/store.h"
#include "mesh/tensor.h"
#include "mesh/work.h"
#include "python/src/bindings.h"

namespace meshrt {
namespace {

using Clock = std::chrono::steady_clock;

double NsPer(Clock::time_point start, int64_t n) {
  return static_cast<double>(
             std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count()) /
         static_cast<double>(n);
}

void CheckCount(int64_t n) {
  if (n < 1) ThrowStatus(absl::InvalidArgumentError("meshrt._bench: n must be at least 1"));
}

// `obj` through __dlpack__, once (the benchmark's setup, not timed).
mesh::Tensor ImportOnce(const py::handle& obj) {
  py::object capsule = obj.attr("__dlpack__")();
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (managed == nullptr) throw py::error_already_set();
  if (PyCapsule_SetName(capsule.ptr(), "used_dltensor") != 0) throw py::error_already_set();
  return Unwrap(mesh::FromDLPack(managed));
}

}  // namespace

void RegisterBenchHooks(py::module_& m, StoreOf store_of) {
  py::module_ bench = m.def_submodule(
      "_bench",
      "Benchmark hooks (bench/python_bench.py): C++ loops over the objects the Python "
      "API uses. Not API.");
  bench.def(
      "store_set_get",
      [store_of](py::handle store, const std::string& key, const std::string& value, int64_t n) {
        CheckCount(n);
        mesh::Store& s = store_of(store);
        absl::Status status;
        double ns = 0;
        {
          py::gil_scoped_release release;
          const Clock::time_point start = Clock::now();
          absl::StatusOr<std::string> got;
          for (int64_t i = 0; i < n && status.ok(); ++i) {
            status = s.Set(key, value);
            if (!status.ok()) break;
            got = s.Get(key);
            status = got.status();
          }
          ns = NsPer(start, n);
          if (status.ok() && *got != value) {
            status = absl::InternalError(
                absl::StrCat("meshrt._bench: read back a different value of '", key, "'"));
          }
        }
        Check(status);
        return ns;
      },
      py::arg("store"), py::arg("key"), py::arg("value"), py::arg("n"),
      "ns per Set + Get pair of the mesh::Store behind `store`, GIL released.");
  bench.def(
      "all_reduce",
      [](const std::shared_ptr<mesh::ProcessGroup>& group, py::handle tensor, int64_t n) {
        CheckCount(n);
        const mesh::Tensor t = ImportOnce(tensor);
        absl::Status status;
        double ns = 0;
        {
          py::gil_scoped_release release;
          const Clock::time_point start = Clock::now();
          for (int64_t i = 0; i < n && status.ok(); ++i) {
            absl::StatusOr<mesh::ProcessGroup::WorkPtr> work =
                group->AllReduce(t, mesh::ReduceOp::kSum);
            status = work.ok() ? (*work)->Wait() : work.status();
          }
          ns = NsPer(start, n);
        }
        Check(status);
        return ns;
      },
      py::arg("group"), py::arg("tensor"), py::arg("n"),
      "ns per all_reduce (sum) + Wait of `group` on `tensor`'s buffer, GIL released.");
}

}  // namespace meshrt
