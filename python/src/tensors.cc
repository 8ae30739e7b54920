// meshrt._meshrt: tensors through DLPack, process groups and their Work,
// device meshes, placements and DTensor.
//
// Tensors cross without copies. A Python tensor is anything with __dlpack__
// (torch.Tensor, numpy.ndarray, ...): its capsule is consumed (renamed
// "used_dltensor", as the protocol requires) and imported with
// mesh::FromDLPack, whose keep-alive holds the producer's tensor until the
// last view of it dies. Results that libmesh allocates (DTensor
// redistribution, full_tensor) go back through mesh::ToDLPack and the
// input's own framework (torch.from_dlpack for torch, numpy.from_dlpack for
// numpy).
//
// Lifetimes: an op's tensors must stay alive until its Work completes. A
// synchronous op waits; an async op's meshrt.Work holds the views. A Work
// (or a synchronous op whose wait ended early, e.g. NCCL's host-non-blocking
// Wait) that is dropped while still pending hands its views to a graveyard,
// swept at the next op, so memory is never freed under a running op.
//
// Errors: an object without __dlpack__ is TypeError; one that cannot be
// exported (a meta tensor, a tensor needing grad) is ValueError; a tensor on
// a device the group cannot use is InvalidArgumentError (a ValueError). An
// op's error maps by its status code, as everywhere (bindings.h). An op of
// an aborted group fails with the abort's reason: ABORTED (JobFailedError)
// when the runtime aborted it because the job failed, DEADLINE_EXCEEDED
// (TimeoutError) when the group aborted itself after an op timed out, ...
// Once the runtime aborted the group with ABORTED, that reason (which names
// the culprit) is raised whatever the op's own error was.
//
// Thread safety: every blocking call releases the GIL. The graveyard is
// guarded by its own mutex.
#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "mesh/device_mesh.h"
#include "mesh/dlpack.h"
#include "mesh/dtensor.h"
#include "mesh/placement.h"
#include "mesh/process_group.h"
#include "mesh/tensor.h"
#include "mesh/work.h"
#include "python/src/bindings.h"

namespace meshrt {
namespace {

using Tensors = absl::InlinedVector<mesh::Tensor, 2>;
using GroupPtr = std::shared_ptr<mesh::ProcessGroup>;
using WorkPtr = std::shared_ptr<mesh::Work>;

// ---- DLPack import and export ----------------------------------------------

PyObject* DlpackName() {
  static PyObject* name = PyUnicode_InternFromString("__dlpack__");
  return name;
}

// Imports `obj` (the op's argument `what`) without copying.
mesh::Tensor Import(const py::handle& obj, const char* what) {
  PyObject* capsule = PyObject_CallMethodNoArgs(obj.ptr(), DlpackName());
  if (capsule == nullptr) {
    if (PyErr_ExceptionMatches(PyExc_AttributeError) &&
        !PyObject_HasAttr(obj.ptr(), DlpackName())) {
      PyErr_Clear();
      throw py::type_error(absl::StrCat("meshrt: ", what,
                                        " must be a tensor with __dlpack__ (torch.Tensor, "
                                        "numpy.ndarray, ...), not ",
                                        Py_TYPE(obj.ptr())->tp_name));
    }
    py::error_already_set cause;
    py::value_error error(
        absl::StrCat("meshrt: the ", what, " cannot be passed through DLPack: ", cause.what()));
    throw error;
  }
  py::object owner = py::reinterpret_steal<py::object>(capsule);
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed == nullptr) throw py::error_already_set();
  // The capsule no longer owns the tensor: FromDLPack calls its deleter.
  if (PyCapsule_SetName(capsule, "used_dltensor") != 0) throw py::error_already_set();
  absl::StatusOr<mesh::Tensor> tensor = mesh::FromDLPack(managed);
  if (!tensor.ok()) {
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat("meshrt: the ", what, " is not usable: ", tensor.status().message())));
  }
  return *std::move(tensor);
}

void CapsuleDestructor(PyObject* capsule) {
  // Still named "dltensor": nobody consumed it, so it owns the tensor.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  }
}

// A libmesh tensor offered through __dlpack__ once; what torch.from_dlpack
// and numpy.from_dlpack consume.
class DLPackExport {
 public:
  explicit DLPackExport(const mesh::Tensor& tensor)
      : managed_(mesh::ToDLPack(tensor)), device_(tensor.device()) {}
  ~DLPackExport() {
    if (managed_ != nullptr && managed_->deleter != nullptr) managed_->deleter(managed_);
  }
  DLPackExport(const DLPackExport&) = delete;
  DLPackExport& operator=(const DLPackExport&) = delete;

  py::capsule Capsule() {
    if (managed_ == nullptr) {
      ThrowStatus(absl::FailedPreconditionError("__dlpack__ was already called on this export"));
    }
    PyObject* capsule = PyCapsule_New(managed_, "dltensor", &CapsuleDestructor);
    if (capsule == nullptr) throw py::error_already_set();
    managed_ = nullptr;
    return py::reinterpret_steal<py::capsule>(capsule);
  }
  py::tuple Device() const {
    return device_.is_cuda() ? py::make_tuple(static_cast<int>(kDLCUDA), device_.index())
                             : py::make_tuple(static_cast<int>(kDLCPU), 0);
  }

 private:
  DLManagedTensor* managed_;
  mesh::Device device_;
};

// The from_dlpack of `like`'s framework (torch, numpy), or None: then results
// are returned as DLPackExport objects.
py::object FromDlpackFor(const py::handle& like) {
  std::string module = py::str(py::type::handle_of(like).attr("__module__"));
  module = module.substr(0, module.find('.'));
  if (module != "torch" && module != "numpy") return py::none();
  py::module_ framework = py::module_::import(module.c_str());
  if (!py::hasattr(framework, "from_dlpack")) return py::none();
  return framework.attr("from_dlpack");
}

py::object Export(const mesh::Tensor& tensor, const py::object& from_dlpack) {
  py::object exported = py::cast(std::make_unique<DLPackExport>(tensor));
  if (from_dlpack.is_none()) return exported;
  return from_dlpack(exported);
}

// ---- Graveyard: views of ops still running that nobody waits for -----------

std::mutex g_grave_mu;
std::vector<std::pair<WorkPtr, Tensors>> g_grave;
std::atomic<size_t> g_grave_size{0};

void Bury(WorkPtr work, Tensors tensors) {
  std::lock_guard<std::mutex> lock(g_grave_mu);
  g_grave.emplace_back(std::move(work), std::move(tensors));
  g_grave_size.store(g_grave.size(), std::memory_order_relaxed);
}

void SweepGraveyard() {
  if (g_grave_size.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(g_grave_mu);
  std::erase_if(g_grave, [](const auto& entry) { return entry.first->IsCompleted(); });
  g_grave_size.store(g_grave.size(), std::memory_order_relaxed);
}

// ---- Process groups --------------------------------------------------------

// The error of an op of `group`, by code. A group the runtime aborted
// because the job failed (ABORTED) reports that, rather than, say, the
// connection reset that a peer's death caused first.
absl::Status GroupError(const mesh::ProcessGroup& group, absl::Status status) {
  absl::Status health = group.health();
  if (health.code() == absl::StatusCode::kAborted) return health;
  return status;
}

[[noreturn]] void ThrowGroupError(const mesh::ProcessGroup& group, absl::Status status) {
  ThrowStatus(GroupError(group, std::move(status)));
}

mesh::ReduceOp OpArg(const py::handle& op) {
  if (PyUnicode_Check(op.ptr())) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(op.ptr(), &size);
    if (data == nullptr) throw py::error_already_set();
    const absl::string_view name(data, static_cast<size_t>(size));
    if (name == "sum") return mesh::ReduceOp::kSum;
    if (name == "avg") return mesh::ReduceOp::kAvg;
    if (name == "max") return mesh::ReduceOp::kMax;
    if (name == "min") return mesh::ReduceOp::kMin;
    if (name == "prod" || name == "product") return mesh::ReduceOp::kProd;
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat("meshrt: unknown reduce op '", name, "'; use sum, avg, min, max or prod")));
  }
  return op.cast<mesh::ReduceOp>();
}

void CheckDevice(const mesh::ProcessGroup& group, const mesh::Tensor& tensor, const char* what) {
  const bool cuda_group = group.backend() == "nccl";
  if (tensor.device().is_cuda() == cuda_group) return;
  ThrowStatus(absl::InvalidArgumentError(absl::StrCat(
      "meshrt: process group '", group.name(), "' uses ", group.backend(), ", which takes ",
      cuda_group ? "CUDA" : "CPU", " tensors; the ", what, " is on ", tensor.device().ToString(),
      cuda_group ? "" : " (meshrt.init(backend=\"nccl\") runs CUDA tensors on NCCL)")));
}

mesh::Tensor Arg(const mesh::ProcessGroup& group, const py::handle& obj, const char* what) {
  mesh::Tensor tensor = Import(obj, what);
  CheckDevice(group, tensor, what);
  return tensor;
}

// meshrt.Work: an async op's handle; holds the op's tensors until it ends.
class PyWork {
 public:
  PyWork(WorkPtr work, Tensors tensors, GroupPtr group)
      : work_(std::move(work)), tensors_(std::move(tensors)), group_(std::move(group)) {}
  ~PyWork() {
    if (!work_->IsCompleted()) Bury(std::move(work_), std::move(tensors_));
  }
  PyWork(const PyWork&) = delete;
  PyWork& operator=(const PyWork&) = delete;

  bool Wait(const py::handle& timeout) {
    absl::Status status;
    if (timeout.is_none()) {
      py::gil_scoped_release release;
      status = work_->Wait();
    } else {
      absl::Duration t = SecondsArg(timeout, absl::ZeroDuration(), "meshrt.Work.wait: timeout");
      py::gil_scoped_release release;
      status = work_->Wait(t);
    }
    if (!status.ok()) ThrowGroupError(*group_, std::move(status));
    return true;
  }
  bool IsCompleted() const { return work_->IsCompleted(); }
  py::object Exception() const {
    if (!work_->IsCompleted()) return py::none();
    absl::Status status = work_->status();
    if (status.ok()) return py::none();
    return ExceptionObject(GroupError(*group_, std::move(status)));
  }

 private:
  WorkPtr work_;
  Tensors tensors_;
  GroupPtr group_;
};

// Issues an op without the GIL and either waits for it or returns a Work.
template <typename Issue>
py::object Run(const GroupPtr& group, bool async_op, Tensors tensors, Issue issue) {
  SweepGraveyard();
  absl::StatusOr<WorkPtr> work;
  absl::Status status;
  {
    py::gil_scoped_release release;
    work = issue();
    if (work.ok() && !async_op) status = (*work)->Wait();
  }
  if (!work.ok()) ThrowGroupError(*group, std::move(work).status());
  if (async_op)
    return py::cast(std::make_unique<PyWork>(*std::move(work), std::move(tensors), group));
  if (!(*work)->IsCompleted()) Bury(*work, std::move(tensors));
  if (!status.ok()) ThrowGroupError(*group, std::move(status));
  return py::none();
}

std::vector<int64_t> SplitsArg(const py::handle& splits, const char* what) {
  if (splits.is_none()) return {};
  try {
    return splits.cast<std::vector<int64_t>>();
  } catch (const py::cast_error&) {
    throw py::type_error(absl::StrCat("meshrt: ", what, " must be a list of int or None, not ",
                                      Py_TYPE(splits.ptr())->tp_name));
  }
}

void BindGroups(py::module_& m) {
  py::enum_<mesh::ReduceOp>(m, "ReduceOp")
      .value("SUM", mesh::ReduceOp::kSum)
      .value("AVG", mesh::ReduceOp::kAvg)
      .value("MIN", mesh::ReduceOp::kMin)
      .value("MAX", mesh::ReduceOp::kMax)
      .value("PRODUCT", mesh::ReduceOp::kProd);

  py::class_<PyWork>(m, "Work", "Handle of an async op (async_op=True); holds its tensors.")
      .def("wait", &PyWork::Wait, py::arg("timeout") = py::none(),
           "Waits for the op (the group's timeout by default); raises its error. True.")
      .def("is_completed", &PyWork::IsCompleted)
      .def("exception", &PyWork::Exception,
           "The op's error as an exception object once it failed, else None.");

  py::class_<DLPackExport>(m, "DLPackTensor",
                           "A libmesh-allocated tensor offered once through __dlpack__.")
      .def(
          "__dlpack__", [](DLPackExport& self, py::handle) { return self.Capsule(); },
          py::arg("stream") = py::none())
      .def("__dlpack_device__", &DLPackExport::Device);

  py::class_<mesh::ProcessGroup, GroupPtr>(
      m, "ProcessGroup",
      "Collectives among a fixed set of ranks (mesh::ProcessGroup) on DLPack tensors. "
      "Ranks (src, dst) are group ranks.")
      .def_property_readonly("rank", &mesh::ProcessGroup::rank)
      .def_property_readonly("size", &mesh::ProcessGroup::size)
      .def_property_readonly("name", &mesh::ProcessGroup::name)
      .def_property_readonly("ranks", &mesh::ProcessGroup::global_ranks)
      .def_property_readonly("backend",
                             [](const mesh::ProcessGroup& g) { return std::string(g.backend()); })
      .def("health",
           [](const mesh::ProcessGroup& g) {
             Check(g.health());  // By code: ABORTED is JobFailedError.
           })
      .def(
          "all_reduce",
          [](const GroupPtr& g, py::handle tensor, py::handle op, bool async_op) {
            mesh::ReduceOp reduce = OpArg(op);
            mesh::Tensor t = Arg(*g, tensor, "tensor");
            return Run(g, async_op, {t}, [&] { return g->AllReduce(t, reduce); });
          },
          py::arg("tensor"), py::arg("op") = "sum", py::arg("async_op") = false)
      .def(
          "broadcast",
          [](const GroupPtr& g, py::handle tensor, int src, bool async_op) {
            mesh::Tensor t = Arg(*g, tensor, "tensor");
            return Run(g, async_op, {t}, [&] { return g->Broadcast(t, src); });
          },
          py::arg("tensor"), py::arg("src") = 0, py::arg("async_op") = false)
      .def(
          "reduce",
          [](const GroupPtr& g, py::handle tensor, int dst, py::handle op, bool async_op) {
            mesh::ReduceOp reduce = OpArg(op);
            mesh::Tensor t = Arg(*g, tensor, "tensor");
            return Run(g, async_op, {t}, [&] { return g->Reduce(t, dst, reduce); });
          },
          py::arg("tensor"), py::arg("dst") = 0, py::arg("op") = "sum", py::arg("async_op") = false)
      .def(
          "all_gather",
          [](const GroupPtr& g, py::handle output, py::handle input, bool async_op) {
            mesh::Tensor out = Arg(*g, output, "output");
            mesh::Tensor in = Arg(*g, input, "input");
            return Run(g, async_op, {out, in}, [&] { return g->AllGather(in, out); });
          },
          py::arg("output"), py::arg("input"), py::arg("async_op") = false,
          "all_gather_into_tensor: output (size x input's numel) gets every input in "
          "group-rank order.")
      .def(
          "reduce_scatter",
          [](const GroupPtr& g, py::handle output, py::handle input, py::handle op, bool async_op) {
            mesh::ReduceOp reduce = OpArg(op);
            mesh::Tensor out = Arg(*g, output, "output");
            mesh::Tensor in = Arg(*g, input, "input");
            return Run(g, async_op, {out, in}, [&] { return g->ReduceScatter(in, out, reduce); });
          },
          py::arg("output"), py::arg("input"), py::arg("op") = "sum", py::arg("async_op") = false)
      .def(
          "all_to_all_single",
          [](const GroupPtr& g, py::handle output, py::handle input, py::handle output_splits,
             py::handle input_splits, bool async_op) {
            std::vector<int64_t> out_splits = SplitsArg(output_splits, "output_split_sizes");
            std::vector<int64_t> in_splits = SplitsArg(input_splits, "input_split_sizes");
            mesh::Tensor out = Arg(*g, output, "output");
            mesh::Tensor in = Arg(*g, input, "input");
            return Run(g, async_op, {out, in}, [&] {
              return g->AllToAll(in, out, std::move(in_splits), std::move(out_splits));
            });
          },
          py::arg("output"), py::arg("input"), py::arg("output_split_sizes") = py::none(),
          py::arg("input_split_sizes") = py::none(), py::arg("async_op") = false)
      .def(
          "send",
          [](const GroupPtr& g, py::handle tensor, int dst, int tag, bool async_op) {
            mesh::Tensor t = Arg(*g, tensor, "tensor");
            return Run(g, async_op, {t}, [&] { return g->Send(t, dst, tag); });
          },
          py::arg("tensor"), py::arg("dst"), py::arg("tag") = 0, py::arg("async_op") = false)
      .def(
          "recv",
          [](const GroupPtr& g, py::handle tensor, int src, int tag, bool async_op) {
            mesh::Tensor t = Arg(*g, tensor, "tensor");
            return Run(g, async_op, {t}, [&] { return g->Recv(t, src, tag); });
          },
          py::arg("tensor"), py::arg("src"), py::arg("tag") = 0, py::arg("async_op") = false)
      .def(
          "barrier",
          [](const GroupPtr& g, bool async_op) {
            return Run(g, async_op, {}, [&] { return g->Barrier(); });
          },
          py::arg("async_op") = false)
      .def("__repr__", [](const mesh::ProcessGroup& g) {
        return absl::StrCat("ProcessGroup(name='", g.name(), "', backend='", g.backend(),
                            "', rank=", g.rank(), ", size=", g.size(), ")");
      });
}

// ---- Device meshes ---------------------------------------------------------

// A dim given by name; TypeError for anything but str (ints are checked
// first by the callers).
std::string DimName(const py::handle& dim) {
  if (!PyUnicode_Check(dim.ptr())) {
    throw py::type_error(
        absl::StrCat("meshrt.DeviceMesh: a dim is a name (str) or index (int), not ",
                     Py_TYPE(dim.ptr())->tp_name));
  }
  return dim.cast<std::string>();
}

absl::StatusOr<int> ResolveDim(const mesh::DeviceMesh& mesh, const py::handle& dim) {
  if (PyLong_Check(dim.ptr())) return dim.cast<int>();
  const std::string name = DimName(dim);
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (mesh.dim_names()[i] == name) return i;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("mesh has no dim '", name, "' (", mesh.DebugString(), ")"));
}

GroupPtr GetGroup(const mesh::DeviceMesh& mesh, const py::handle& dim) {
  if (dim.is_none()) return Unwrap(mesh.GetGroup());
  if (PyLong_Check(dim.ptr())) return Unwrap(mesh.GetGroup(dim.cast<int>()));
  return Unwrap(mesh.GetGroup(DimName(dim)));
}

void BindDeviceMesh(py::module_& m) {
  py::class_<mesh::DeviceMesh>(m, "DeviceMesh",
                               "An N-d mesh of ranks with one process group per dim. "
                               "Made by Runtime.init_device_mesh.")
      .def_property_readonly(
          "shape", [](const mesh::DeviceMesh& d) { return py::tuple(py::cast(d.shape())); })
      .def_property_readonly(
          "dim_names", [](const mesh::DeviceMesh& d) { return py::tuple(py::cast(d.dim_names())); })
      .def_property_readonly("ndim", &mesh::DeviceMesh::ndim)
      .def_property_readonly("rank", &mesh::DeviceMesh::rank)
      .def(
          "size",
          [](const mesh::DeviceMesh& d, py::handle dim) -> int64_t {
            if (dim.is_none()) return d.size();
            return d.Size(Unwrap(ResolveDim(d, dim)));
          },
          py::arg("dim") = py::none())
      .def("get_group", &GetGroup, py::arg("dim") = py::none())
      .def("get_all_groups", &mesh::DeviceMesh::GetAllGroups)
      .def(
          "get_local_rank",
          [](const mesh::DeviceMesh& d, py::handle dim) {
            if (dim.is_none()) {
              if (d.ndim() != 1) {
                ThrowStatus(
                    absl::InvalidArgumentError("get_local_rank() without a dim needs a 1-D mesh"));
              }
              return Unwrap(d.GetLocalRank(0));
            }
            return Unwrap(d.GetLocalRank(Unwrap(ResolveDim(d, dim))));
          },
          py::arg("dim") = py::none())
      .def("get_coordinate",
           [](const mesh::DeviceMesh& d) { return py::tuple(py::cast(d.GetCoordinate())); })
      .def("__getitem__",
           [](const mesh::DeviceMesh& d, py::handle dims) {
             if (PyUnicode_Check(dims.ptr())) return Unwrap(d[dims.cast<std::string>()]);
             std::vector<std::string> names = dims.cast<std::vector<std::string>>();
             return Unwrap(d.Slice(names));
           })
      .def(
          "flatten",
          [](const mesh::DeviceMesh& d, const std::string& name) {
            absl::StatusOr<mesh::DeviceMesh> flat;
            {
              py::gil_scoped_release release;
              flat = d.Flatten(name);
            }
            return Unwrap(std::move(flat));
          },
          py::arg("name") = "")
      .def("__repr__", &mesh::DeviceMesh::DebugString);
}

// ---- Placements and DTensor ------------------------------------------------

struct PyShard : mesh::Placement {
  explicit PyShard(int dim) : mesh::Placement(mesh::Placement::Shard(dim)) {}
};
struct PyReplicate : mesh::Placement {
  PyReplicate() : mesh::Placement(mesh::Placement::Replicate()) {}
};
struct PyPartial : mesh::Placement {
  explicit PyPartial(mesh::ReduceOp op) : mesh::Placement(mesh::Placement::Partial(op)) {}
};

py::object PlacementToPy(const mesh::Placement& p) {
  switch (p.kind()) {
    case mesh::Placement::Kind::kShard:
      return py::cast(PyShard(p.dim()));
    case mesh::Placement::Kind::kPartial:
      return py::cast(PyPartial(p.op()));
    case mesh::Placement::Kind::kReplicate:
      break;
  }
  return py::cast(PyReplicate());
}

py::tuple PlacementsToPy(const mesh::Placements& placements) {
  py::tuple out(placements.size());
  for (size_t i = 0; i < placements.size(); ++i) out[i] = PlacementToPy(placements[i]);
  return out;
}

std::string PlacementRepr(const mesh::Placement& p) {
  switch (p.kind()) {
    case mesh::Placement::Kind::kShard:
      return absl::StrCat("Shard(dim=", p.dim(), ")");
    case mesh::Placement::Kind::kPartial:
      return absl::StrCat("Partial(reduce_op='", mesh::ReduceOpName(p.op()), "')");
    case mesh::Placement::Kind::kReplicate:
      break;
  }
  return "Replicate()";
}

// meshrt.DTensor: a mesh::DTensor plus the framework its local tensors come
// back in, and the caller's own local object when it was wrapped as is.
struct PyDTensor {
  mesh::DTensor dt;
  py::object from_dlpack;
  py::object local;  // None unless from_local without a copy.
};

std::vector<int64_t> ShapeOf(absl::Span<const int64_t> shape) {
  return std::vector<int64_t>(shape.begin(), shape.end());
}

void BindDTensor(py::module_& m) {
  py::class_<mesh::Placement>(m, "Placement", "How a tensor is laid out along one mesh dim.")
      .def(
          "is_shard",
          [](const mesh::Placement& p, std::optional<int> dim) {
            return dim.has_value() ? p.is_shard(*dim) : p.is_shard();
          },
          py::arg("dim") = py::none())
      .def("is_replicate", &mesh::Placement::is_replicate)
      .def("is_partial", &mesh::Placement::is_partial)
      .def("__eq__",
           [](const mesh::Placement& a, py::handle b) {
             return py::isinstance<mesh::Placement>(b) && a == b.cast<const mesh::Placement&>();
           })
      .def("__hash__", [](const mesh::Placement& p) { return py::hash(py::str(PlacementRepr(p))); })
      .def("__repr__", &PlacementRepr);
  py::class_<PyShard, mesh::Placement>(m, "Shard",
                                       "Shard(dim): split tensor dim `dim`, torch.chunk-style.")
      .def(py::init<int>(), py::arg("dim"))
      .def_property_readonly("dim", [](const PyShard& p) { return p.dim(); });
  py::class_<PyReplicate, mesh::Placement>(m, "Replicate", "Every rank holds the same values.")
      .def(py::init<>());
  py::class_<PyPartial, mesh::Placement>(m, "Partial", "Partial(reduce_op): pending reduction.")
      .def(py::init([](py::handle op) { return PyPartial(OpArg(op)); }),
           py::arg("reduce_op") = "sum")
      .def_property_readonly(
          "reduce_op", [](const PyPartial& p) { return std::string(mesh::ReduceOpName(p.op())); });

  m.def(
      "compute_local_shape_and_offset",
      [](std::vector<int64_t> global_shape, const mesh::DeviceMesh& mesh,
         const mesh::Placements& placements, std::optional<std::vector<int64_t>> coordinate) {
        mesh::LocalLayout layout = Unwrap(mesh::ComputeLocalLayout(
            global_shape, mesh.shape(), placements, coordinate.value_or(mesh.GetCoordinate())));
        return py::make_tuple(py::tuple(py::cast(ShapeOf(layout.shape))),
                              py::tuple(py::cast(ShapeOf(layout.offset))));
      },
      py::arg("global_shape"), py::arg("mesh"), py::arg("placements"),
      py::arg("coordinate") = py::none(),
      "(local shape, global offset) of the shard at `coordinate` (default: this rank's).");

  py::class_<PyDTensor>(m, "DTensor",
                        "A tensor sharded over a DeviceMesh (torch DTensor semantics).")
      .def_static(
          "from_local",
          [](py::handle local, const mesh::DeviceMesh& mesh, mesh::Placements placements,
             std::optional<std::vector<int64_t>> global_shape, bool verify, bool copy) {
            mesh::Tensor t = Import(local, "local tensor");
            mesh::FromLocalOptions options;
            options.global_shape = global_shape.value_or(std::vector<int64_t>{});
            options.verify = verify;
            options.copy = copy;
            absl::StatusOr<mesh::DTensor> dt;
            {
              py::gil_scoped_release release;
              dt = mesh::DTensor::FromLocal(t, mesh, std::move(placements), std::move(options));
            }
            return PyDTensor{Unwrap(std::move(dt)), FromDlpackFor(local),
                             copy ? py::none() : py::reinterpret_borrow<py::object>(local)};
          },
          py::arg("local"), py::arg("mesh"), py::arg("placements"),
          py::arg("global_shape") = py::none(), py::arg("verify") = false, py::arg("copy") = false)
      .def_property_readonly(
          "shape", [](const PyDTensor& d) { return py::tuple(py::cast(ShapeOf(d.dt.shape()))); })
      .def_property_readonly("placements",
                             [](const PyDTensor& d) { return PlacementsToPy(d.dt.placements()); })
      .def_property_readonly("device_mesh", [](const PyDTensor& d) { return d.dt.mesh(); })
      .def_property_readonly(
          "dtype", [](const PyDTensor& d) { return std::string(mesh::DTypeName(d.dt.dtype())); })
      .def_property_readonly("local_shape",
                             [](const PyDTensor& d) {
                               return py::tuple(py::cast(ShapeOf(d.dt.local_layout().shape)));
                             })
      .def_property_readonly("local_offset",
                             [](const PyDTensor& d) {
                               return py::tuple(py::cast(ShapeOf(d.dt.local_layout().offset)));
                             })
      .def("to_local",
           [](const PyDTensor& d) {
             if (!d.local.is_none()) return d.local;
             return Export(d.dt.local(), d.from_dlpack);
           })
      .def(
          "redistribute",
          [](const PyDTensor& d, mesh::Placements placements) {
            absl::StatusOr<mesh::DTensor> out;
            {
              py::gil_scoped_release release;
              out = mesh::Redistribute(d.dt, std::move(placements));
            }
            return PyDTensor{Unwrap(std::move(out)), d.from_dlpack, py::none()};
          },
          py::arg("placements"))
      .def("full_tensor",
           [](const PyDTensor& d) {
             absl::StatusOr<mesh::Tensor> full;
             {
               py::gil_scoped_release release;
               full = d.dt.FullTensor();
             }
             return Export(Unwrap(std::move(full)), d.from_dlpack);
           })
      .def("__repr__", [](const PyDTensor& d) { return d.dt.DebugString(); });

  m.def(
      "distribute_tensor",
      [](py::handle tensor, const mesh::DeviceMesh& mesh, mesh::Placements placements,
         int src_rank) {
        mesh::Tensor t = Import(tensor, "tensor");
        mesh::DistributeOptions options;
        options.src_rank = src_rank;
        absl::StatusOr<mesh::DTensor> dt;
        {
          py::gil_scoped_release release;
          dt = mesh::DistributeTensor(t, mesh, std::move(placements), options);
        }
        return PyDTensor{Unwrap(std::move(dt)), FromDlpackFor(tensor), py::none()};
      },
      py::arg("tensor"), py::arg("mesh"), py::arg("placements"), py::arg("src_rank") = -1,
      "Collective: `tensor` laid out over `mesh` (src_rank -1: every rank passes it).");
}

}  // namespace

mesh::Tensor ImportTensor(const py::handle& obj, const char* what) { return Import(obj, what); }

void RegisterTensors(py::module_& m) {
  BindGroups(m);
  BindDeviceMesh(m);
  BindDTensor(m);
}

}  // namespace meshrt
