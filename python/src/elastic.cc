// meshrt._meshrt: ElasticMesh, the device mesh of a job's live ranks under
// in-place recovery (mesh/elastic_mesh.h, docs/elastic.md).
//
//   em = meshrt.ElasticMesh(rt, state=lambda: [weights, step])   # collective
//   while step < steps:
//       em.sync()                      # collective, once per step
//       if not em.is_member:
//           continue                   # its replica lost a rank
//       try:
//           em.mesh.get_group("dp").all_reduce(grads)
//       except meshrt.Error:
//           continue                   # not committed; sync() rebuilds
//
// `state` is the application's state (torchft's state_dict): a callable
// returning tensors (anything with __dlpack__: torch.Tensor, numpy.ndarray;
// a tensor that requires grad, such as a parameter, is taken detached, which
// shares its memory).
// At a rebuild that needs it, the lowest-ranked member holding the state
// broadcasts those tensors to every member, and a member's tensors are
// overwritten in place, through DLPack views of their memory, once all have
// arrived. So a replacement process, or members a half-failed step left a
// step apart, carry on from the same values. The callable runs on the thread
// that called sync(), with the GIL.
//
// Lifetimes: the ElasticMesh holds its meshrt.Runtime alive, and the state
// callable until it is destroyed. Groups of an older mesh stay
// usable objects but are aborted: their ops raise.
//
// `device` is where the small tensors of its protocol live: the CPU (the
// default) for Gloo; with NCCL it must be given, as "cuda:N".
//
// Errors: those of mesh::ElasticMesh::Create and Sync, mapped by code
// (bindings.h): JobFailedError once the job failed, TimeoutError for an
// AliveRanks round or a non-member's wait that timed out (call sync() again),
// InvalidArgumentError for a bad dim or shape, or a state that differs from
// the donor's; meshrt.Error (FAILED_PRECONDITION) for a job without in-place
// recovery, or `mesh` read on a non-member. An exception raised by `state`,
// or a value that is not a sequence of tensors, fails that sync() with
// InvalidArgumentError naming it.
//
// Thread safety: not thread-safe, as mesh::ElasticMesh: one thread drives
// it. sync() releases the GIL while it blocks.
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mesh/device.h"
#include "mesh/elastic_mesh.h"
#include "mesh/process_group.h"
#include "mesh/runtime.h"
#include "mesh/tensor.h"
#include "python/src/bindings.h"

namespace meshrt {
namespace {

// A Python callable that may be destroyed without the GIL (the ElasticMesh
// holds it in its options, and is destroyed with the GIL released).
using PyCallable = std::shared_ptr<py::object>;

PyCallable HoldCallable(py::object fn) {
  return PyCallable(new py::object(std::move(fn)), [](py::object* o) {
    // An interpreter that is shutting down may not be entered: leak the
    // reference, as the process is ending.
    if (!Py_IsInitialized() || PythonIsFinalizing()) return;
    py::gil_scoped_acquire gil;
    delete o;
  });
}

// The tensors `state()` returns, as views of their memory.
absl::StatusOr<std::vector<mesh::Tensor>> CallState(const PyCallable& state) {
  py::gil_scoped_acquire gil;
  try {
    py::object result = (*state)();
    if (!py::isinstance<py::sequence>(result) || py::isinstance<py::str>(result)) {
      return absl::InvalidArgumentError(
          absl::StrCat("meshrt.ElasticMesh: state() must return a list of tensors, not ",
                       Py_TYPE(result.ptr())->tp_name));
    }
    std::vector<mesh::Tensor> tensors;
    for (const py::handle item : result) {
      // torch refuses to export a tensor that requires grad (a parameter);
      // its detached view shares the memory a transfer overwrites.
      if (py::hasattr(item, "requires_grad") && py::bool_(item.attr("requires_grad"))) {
        tensors.push_back(ImportTensor(item.attr("detach")(), "state() tensor"));
      } else {
        tensors.push_back(ImportTensor(item, "state() tensor"));
      }
    }
    return tensors;
  } catch (py::error_already_set& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("meshrt.ElasticMesh: state() raised ", e.what()));
  } catch (const StatusError& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("meshrt.ElasticMesh: state() returned ", e.status.message()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("meshrt.ElasticMesh: state() returned ", e.what()));
  }
}

struct PyElasticMesh {
  // The meshrt.Runtime, kept alive so that its own destructor (which shuts
  // the mesh::Runtime down with the GIL released) runs after this one.
  py::object runtime_owner;
  std::shared_ptr<mesh::Runtime> runtime;  // Outlives `elastic`.
  std::unique_ptr<mesh::ElasticMesh> elastic;

  ~PyElasticMesh() {
    // Aborting groups may block on their connections, and ~Runtime (if this
    // holds the last reference) joins threads that may wait for the GIL.
    py::gil_scoped_release release;
    elastic.reset();
    runtime.reset();
  }
};

mesh::ElasticMesh& Em(PyElasticMesh& self) { return *self.elastic; }

std::unique_ptr<PyElasticMesh> Create(RuntimeOf runtime_of, py::handle rt,
                                      std::optional<std::string> dim,
                                      std::optional<std::vector<int64_t>> shape,
                                      std::optional<std::vector<std::string>> dim_names,
                                      py::object state, std::optional<std::string> device,
                                      py::handle timeout) {
  auto self = std::make_unique<PyElasticMesh>();
  self->runtime = runtime_of(rt);
  self->runtime_owner = py::reinterpret_borrow<py::object>(rt);
  mesh::ElasticMeshOptions options;
  options.dim = dim.value_or("");
  if (shape.has_value() != dim_names.has_value()) {
    ThrowStatus(absl::InvalidArgumentError(
        "meshrt.ElasticMesh: give shape and dim_names together, or neither for the job's mesh"));
  }
  options.shape = shape.value_or(std::vector<int64_t>{});
  options.dim_names = dim_names.value_or(std::vector<std::string>{});
  if (!state.is_none()) {
    if (!PyCallable_Check(state.ptr())) {
      throw py::type_error(absl::StrCat("meshrt.ElasticMesh: state must be callable, not ",
                                        Py_TYPE(state.ptr())->tp_name));
    }
    options.state = [fn = HoldCallable(std::move(state))] { return CallState(fn); };
  }
  if (device.has_value()) {
    options.device = Unwrap(mesh::Device::Parse(*device));
  } else if (rt.attr("backend").cast<std::string>() != "gloo") {
    ThrowStatus(absl::InvalidArgumentError(
        "meshrt.ElasticMesh: with the nccl backend, give device=\"cuda:N\", the device of "
        "this rank's tensors"));
  }
  options.timeout = SecondsArg(timeout, options.timeout, "meshrt.ElasticMesh: timeout");
  absl::StatusOr<std::unique_ptr<mesh::ElasticMesh>> elastic;
  {
    py::gil_scoped_release release;
    elastic = mesh::ElasticMesh::Create(*self->runtime, std::move(options));
  }
  self->elastic = Unwrap(std::move(elastic));
  return self;
}

}  // namespace

void RegisterElastic(py::module_& m, RuntimeOf runtime_of) {
  py::class_<PyElasticMesh>(
      m, "ElasticMesh",
      "The device mesh of a job's live ranks under in-place recovery (docs/elastic.md).")
      .def(
          py::init([runtime_of](py::handle rt, std::optional<std::string> dim,
                                std::optional<std::vector<int64_t>> shape,
                                std::optional<std::vector<std::string>> dim_names, py::object state,
                                std::optional<std::string> device, py::handle timeout) {
            return Create(runtime_of, rt, std::move(dim), std::move(shape), std::move(dim_names),
                          std::move(state), std::move(device), timeout);
          }),
          py::arg("runtime"), py::kw_only(), py::arg("dim") = py::none(),
          py::arg("shape") = py::none(), py::arg("dim_names") = py::none(),
          py::arg("state") = py::none(), py::arg("device") = py::none(),
          py::arg("timeout") = py::none(),
          "Collective among the live ranks: checks the options and builds the first mesh.")
      .def(
          "sync",
          [](PyElasticMesh& self) {
            absl::StatusOr<bool> changed;
            {
              py::gil_scoped_release release;
              changed = Em(self).Sync();
            }
            return Unwrap(std::move(changed));
          },
          "Collective among the live ranks, once per step: True when the mesh was rebuilt.")
      .def_property_readonly("is_member", [](PyElasticMesh& s) { return Em(s).is_member(); })
      .def_property_readonly("mesh",
                             [](PyElasticMesh& s) -> mesh::DeviceMesh {
                               if (!Em(s).is_member()) {
                                 ThrowStatus(absl::FailedPreconditionError(absl::StrCat(
                                     "meshrt.ElasticMesh.mesh: this rank is not a member of "
                                     "the mesh of round ",
                                     Em(s).round(), " (its replica lost a rank)")));
                               }
                               return Em(s).mesh();
                             })
      .def_property_readonly("members_group",
                             [](PyElasticMesh& s) { return Em(s).members_group(); })
      .def_property_readonly("members",
                             [](PyElasticMesh& s) { return py::tuple(py::cast(Em(s).members())); })
      .def_property_readonly("replicas", [](PyElasticMesh& s) { return Em(s).replicas(); })
      .def_property_readonly("dim", [](PyElasticMesh& s) { return Em(s).dim(); })
      .def_property_readonly("membership_epoch",
                             [](PyElasticMesh& s) { return Em(s).membership_epoch(); })
      .def_property_readonly("round", [](PyElasticMesh& s) { return Em(s).round(); })
      .def_property_readonly("has_state", [](PyElasticMesh& s) { return Em(s).has_state(); })
      .def_property_readonly("last_donor", [](PyElasticMesh& s) { return Em(s).last_donor(); })
      .def_property_readonly("membership_derived",
                             [](PyElasticMesh& s) { return Em(s).membership_derived(); })
      .def("__repr__", [](PyElasticMesh& s) {
        mesh::ElasticMesh& em = Em(s);
        return absl::StrCat("ElasticMesh(dim='", em.dim(), "', replicas=", em.replicas(),
                            ", members=", em.members().size(), ", epoch=", em.membership_epoch(),
                            ", round=", em.round(), em.is_member() ? "" : ", not a member", ")");
      });
}

}  // namespace meshrt
