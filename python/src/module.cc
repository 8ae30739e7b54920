// meshrt._meshrt: the module, its exceptions, the worker runtime and the
// collective-progress handle; the coordinator's key-value store is in
// store.cc.
//
// Contract (docs/python.md has the user's view):
//   - meshrt.init(**options) wraps mesh::Runtime::Init; every keyword is a
//     RuntimeOptions field, timeouts are float seconds.
//   - Every call that may block (Init, the store, World, InitDeviceMesh,
//     ReportError, Shutdown) releases the GIL.
//   - on_failure is called from a libmesh runtime thread, with the GIL taken
//     there, and never during or after interpreter finalization: an atexit
//     hook first disarms every callback (under the GIL) and then shuts every
//     live Runtime down with the GIL released, so a runtime thread waiting
//     for the GIL can finish before Shutdown joins it.
//   - A Store of a Runtime whose job failed raises JobFailedError at once,
//     naming the job's error, rather than contacting the coordinator.
//
// Ownership: a Python Runtime owns its mesh::Runtime (shared with the Store
// wrapper only through a weak pointer, for health checks). The callback's
// Python object is only touched with the GIL held; it is dropped under the
// GIL before the Runtime is destroyed.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mesh/progress.h"
#include "mesh/runtime.h"
#include "mesh/store.h"
#include "python/src/bindings.h"
#include "python/src/store.h"

namespace meshrt {
namespace {

// ---- Exceptions ------------------------------------------------------------

struct ErrorClasses {
  PyObject* base = nullptr;
  PyObject* job_failed = nullptr;
  PyObject* timeout = nullptr;
  PyObject* not_found = nullptr;
  PyObject* invalid_argument = nullptr;
  PyObject* unavailable = nullptr;
};
// Created at import and never freed: the module lives as long as the process.
ErrorClasses g_errors;

PyObject* NewError(py::module_& m, const char* name, const char* doc, py::tuple bases) {
  py::dict dict;
  if (name == std::string("Error")) {
    dict["code"] = py::str("UNKNOWN");
    dict["message"] = py::str("");
  }
  PyObject* cls = PyErr_NewExceptionWithDoc(absl::StrCat("meshrt.", name).c_str(), doc, bases.ptr(),
                                            dict.ptr());
  if (cls == nullptr) throw py::error_already_set();
  m.attr(name) = py::handle(cls);
  return cls;
}

PyObject* ClassFor(const StatusError& error) {
  if (error.error_class == ErrorClass::kJobFailed) return g_errors.job_failed;
  switch (error.status.code()) {
    case absl::StatusCode::kAborted:
      return g_errors.job_failed;
    case absl::StatusCode::kDeadlineExceeded:
      return g_errors.timeout;
    case absl::StatusCode::kNotFound:
      return g_errors.not_found;
    case absl::StatusCode::kInvalidArgument:
      return g_errors.invalid_argument;
    case absl::StatusCode::kUnavailable:
      return g_errors.unavailable;
    default:
      return g_errors.base;
  }
}

// A new exception instance for `error`; null with a Python error set when
// even that fails.
PyObject* MakeException(const StatusError& error) {
  const std::string message(error.status.message());
  PyObject* text =
      PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "replace");
  if (text == nullptr) return nullptr;
  PyObject* exc = PyObject_CallOneArg(ClassFor(error), text);
  Py_DECREF(text);
  if (exc == nullptr) return nullptr;
  const std::string code = absl::StatusCodeToString(error.status.code());
  py::handle handle(exc);
  handle.attr("code") = py::str(code);
  handle.attr("message") = handle.attr("args")[py::int_(0)];
  return exc;
}

// ---- Failure callback ------------------------------------------------------

// The user's on_failure, shared between the Python Runtime and the
// std::function libmesh calls. `fn` is read and written only with the GIL.
struct FailureCallback {
  py::object fn;

  void Call(const absl::Status& status) {
    if (!Py_IsInitialized() || PythonIsFinalizing()) return;
    py::gil_scoped_acquire gil;
    if (!fn) return;
    py::object callback = fn;
    PyObject* exc = MakeException(StatusError{status});
    if (exc == nullptr) {
      PyErr_WriteUnraisable(callback.ptr());
      return;
    }
    py::object error = py::reinterpret_steal<py::object>(exc);
    try {
      callback(error);
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("meshrt: the on_failure callback");
    }
  }
};

// ---- Runtime ---------------------------------------------------------------

// Owns the mesh::Runtime. Destroyed with the GIL held (by pybind11); the
// mesh::Runtime is destroyed with it released, since ~Runtime joins threads
// that may be waiting for the GIL.
struct PyRuntime {
  std::shared_ptr<mesh::Runtime> rt;
  std::shared_ptr<FailureCallback> callback;
  std::shared_ptr<PyStore> store;
  std::string backend;
  // Set once shutdown() (or finish(), the context manager's exit, the atexit
  // hook) shut the Runtime down: health() says so only while the job has
  // not failed.
  std::atomic<bool> shut_down{false};

  ~PyRuntime() {
    if (callback != nullptr) callback->fn = py::object();
    store.reset();
    py::gil_scoped_release release;
    rt.reset();
  }
};

// Every live Runtime, for the atexit hook.
std::mutex g_runtimes_mu;
std::vector<std::weak_ptr<PyRuntime>> g_runtimes;

void ShutdownAllAtExit() {
  std::vector<std::shared_ptr<PyRuntime>> live;
  {
    std::lock_guard<std::mutex> lock(g_runtimes_mu);
    for (const auto& weak : g_runtimes) {
      if (auto runtime = weak.lock()) live.push_back(std::move(runtime));
    }
    g_runtimes.clear();
  }
  for (const auto& runtime : live) {
    if (runtime->callback != nullptr) runtime->callback->fn = py::object();
  }
  py::gil_scoped_release release;
  for (const auto& runtime : live) {
    runtime->shut_down = true;
    if (runtime->rt != nullptr) (void)runtime->rt->Shutdown();
  }
}

// ---- meshrt.init -----------------------------------------------------------

// `value` as a T, for the argument `what` ("meshrt.init: rank"): TypeError
// naming it when the type is wrong, InvalidArgumentError for an int that
// does not fit.
template <typename T>
T Cast(const py::handle& value, const char* what) {
  try {
    return value.cast<T>();
  } catch (const py::cast_error&) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (PyLong_Check(value.ptr())) {
        ThrowStatus(absl::InvalidArgumentError(
            absl::StrCat(what, " is out of range: ", py::str(value).cast<std::string>())));
      }
    }
    const char* type = std::is_same_v<T, std::string> ? "str"
                       : std::is_same_v<T, bool>      ? "bool"
                                                      : "int";
    throw py::type_error(
        absl::StrCat(what, " must be ", type, ", not ", Py_TYPE(value.ptr())->tp_name));
  }
}

template <typename T>
std::optional<T> Opt(const py::handle& value, const std::string& key) {
  if (value.is_none()) return std::nullopt;
  return Cast<T>(value, absl::StrCat("meshrt.init: ", key).c_str());
}

std::shared_ptr<PyRuntime> Init(const py::kwargs& kwargs) {
  mesh::RuntimeOptions options;
  std::string backend = "gloo";
  mesh::GlooOptions gloo;
  mesh::NcclBackendOptions nccl;
  auto callback = std::make_shared<FailureCallback>();
  for (const auto& [key_handle, value] : kwargs) {
    const std::string key = key_handle.cast<std::string>();
    if (key == "coordinator") {
      options.coordinator = Opt<std::string>(value, key);
    } else if (key == "job_id") {
      options.job_id = Opt<std::string>(value, key);
    } else if (key == "generation") {
      options.generation = Opt<int64_t>(value, key);
    } else if (key == "rank") {
      options.rank = Opt<int>(value, key);
    } else if (key == "world_size") {
      options.world_size = Opt<int>(value, key);
    } else if (key == "local_rank") {
      options.local_rank = Opt<int>(value, key);
    } else if (key == "local_world_size") {
      options.local_world_size = Opt<int>(value, key);
    } else if (key == "node_rank") {
      options.node_rank = Opt<int>(value, key);
    } else if (key == "auth_token") {
      options.auth_token = Opt<std::string>(value, key);
    } else if (key == "tls_ca") {
      options.tls_ca = Opt<std::string>(value, key);
    } else if (key == "tls_cert") {
      options.tls_cert = Opt<std::string>(value, key);
    } else if (key == "tls_key") {
      options.tls_key = Opt<std::string>(value, key);
    } else if (key == "tls_server_name") {
      options.tls_server_name = Opt<std::string>(value, key);
    } else if (key == "metrics_port") {
      options.metrics_port = Opt<int>(value, key);
    } else if (key == "read_env") {
      if (!Cast<bool>(value, "meshrt.init: read_env")) options.env = nullptr;
    } else if (key == "host") {
      options.host = Opt<std::string>(value, key).value_or("");
    } else if (key == "device_index") {
      nccl.device_index = Opt<int>(value, key);
    } else if (key == "join_timeout") {
      options.join_timeout = SecondsArg(value, options.join_timeout, "meshrt.init: join_timeout");
    } else if (key == "rpc_timeout") {
      options.rpc_timeout = SecondsArg(value, options.rpc_timeout, "meshrt.init: rpc_timeout");
    } else if (key == "store_timeout") {
      options.store_timeout =
          SecondsArg(value, options.store_timeout, "meshrt.init: store_timeout");
    } else if (key == "timeout") {
      options.group_options.timeout =
          SecondsArg(value, options.group_options.timeout, "meshrt.init: timeout");
    } else if (key == "backend") {
      backend = Cast<std::string>(value, "meshrt.init: backend");
    } else if (key == "hostname") {
      gloo.hostname = Opt<std::string>(value, key).value_or("");
    } else if (key == "iface") {
      gloo.iface = Opt<std::string>(value, key).value_or("");
    } else if (key == "on_failure") {
      if (!value.is_none() && !PyCallable_Check(value.ptr())) {
        throw py::type_error("meshrt.init: on_failure must be callable");
      }
      callback->fn = py::reinterpret_borrow<py::object>(value);
    } else {
      throw py::type_error(
          absl::StrCat("meshrt.init() got an unexpected keyword argument '", key, "'"));
    }
  }
  if (backend == "gloo") {
    options.backend = mesh::GlooBackend(gloo);
  } else if (backend == "nccl") {
    options.backend = mesh::NcclBackend(nccl);
    options.device_kind = "cuda";
    if (nccl.device_index.has_value()) options.device_index = *nccl.device_index;
  } else {
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat("meshrt.init: backend must be \"gloo\" or \"nccl\", not \"", backend, "\"")));
  }
  if (callback->fn) {
    options.on_failure = [callback](const absl::Status& status) { callback->Call(status); };
  }
  absl::StatusOr<std::unique_ptr<mesh::Runtime>> rt;
  {
    py::gil_scoped_release release;
    rt = mesh::Runtime::Init(std::move(options));
  }
  if (!rt.ok()) {
    callback->fn = py::object();
    ThrowStatus(rt.status());
  }
  auto runtime = std::make_shared<PyRuntime>();
  runtime->rt = std::shared_ptr<mesh::Runtime>(*std::move(rt));
  runtime->callback = std::move(callback);
  runtime->backend = backend;
  runtime->store = std::make_shared<PyStore>(runtime->rt->store(), runtime->rt);
  std::lock_guard<std::mutex> lock(g_runtimes_mu);
  std::erase_if(g_runtimes, [](const std::weak_ptr<PyRuntime>& w) { return w.expired(); });
  g_runtimes.push_back(runtime);
  return runtime;
}

mesh::Runtime& Rt(PyRuntime& self) {
  if (self.rt == nullptr) ThrowStatus(absl::FailedPreconditionError("the Runtime is closed"));
  return *self.rt;
}

py::tuple Tuple(const std::vector<int64_t>& values) { return py::cast(values); }

void BindRuntime(py::module_& m) {
  // The class first, so that init's signature names its return type.
  py::class_<PyRuntime, std::shared_ptr<PyRuntime>>(
      m, "Runtime", "A worker's connection to its job (mesh::Runtime). Made by meshrt.init().")
      .def_property_readonly("rank", [](PyRuntime& s) { return Rt(s).info().rank; })
      .def_property_readonly("world_size", [](PyRuntime& s) { return Rt(s).info().world_size; })
      .def_property_readonly("local_rank", [](PyRuntime& s) { return Rt(s).info().local_rank; })
      .def_property_readonly("local_world_size",
                             [](PyRuntime& s) { return Rt(s).info().local_world_size; })
      .def_property_readonly("node_rank", [](PyRuntime& s) { return Rt(s).info().node_rank; })
      .def_property_readonly("num_nodes", [](PyRuntime& s) { return Rt(s).info().num_nodes; })
      .def_property_readonly("job_id", [](PyRuntime& s) { return Rt(s).info().job_id; })
      .def_property_readonly("generation", [](PyRuntime& s) { return Rt(s).info().generation; })
      .def_property_readonly("host", [](PyRuntime& s) { return Rt(s).info().host; })
      .def_property_readonly("membership_epoch",
                             [](PyRuntime& s) { return Rt(s).membership_epoch(); })
      .def_property_readonly("mesh_shape",
                             [](PyRuntime& s) { return Tuple(Rt(s).info().mesh_shape); })
      .def_property_readonly(
          "mesh_dim_names",
          [](PyRuntime& s) { return py::tuple(py::cast(Rt(s).info().mesh_dim_names)); })
      .def_property_readonly("backend", [](PyRuntime& s) { return s.backend; })
      .def_property_readonly("metrics_port", [](PyRuntime& s) { return Rt(s).metrics_port(); })
      .def_property_readonly("store",
                             [](PyRuntime& s) {
                               Rt(s);
                               return s.store;
                             })
      .def("health",
           [](PyRuntime& s) {
             mesh::Runtime& rt = Rt(s);
             absl::Status health = rt.health();
             if (!health.ok()) {
               ThrowStatus(health, health.code() == absl::StatusCode::kFailedPrecondition
                                       ? ErrorClass::kByCode
                                       : ErrorClass::kJobFailed);
             }
           })
      .def(
          "alive_ranks",
          [](PyRuntime& s, const py::handle& timeout) {
            mesh::Runtime& rt = Rt(s);
            const absl::Duration wait =
                SecondsArg(timeout, absl::Minutes(5), "meshrt.Runtime.alive_ranks: timeout");
            absl::StatusOr<mesh::AliveRanksResult> result;
            {
              py::gil_scoped_release release;
              result = rt.AliveRanks(wait);
            }
            Check(result.status());
            py::list ranks;
            for (const auto& r : result->ranks) ranks.append(py::make_tuple(r.rank, r.incarnation));
            return py::make_tuple(result->round, result->membership_epoch, ranks);
          },
          py::arg("timeout") = py::none(),
          "Collective among the live ranks: (round, membership_epoch, [(rank, incarnation)]), "
          "the same for every caller (docs/elastic.md).")
      .def(
          "report_error",
          [](PyRuntime& s, const std::string& reason) {
            mesh::Runtime& rt = Rt(s);
            absl::Status status;
            {
              py::gil_scoped_release release;
              status = rt.ReportError(reason);
            }
            Check(status);
          },
          py::arg("reason"))
      .def(
          "finish",
          [](PyRuntime& s, std::optional<std::string> error) {
            mesh::Runtime& rt = Rt(s);
            absl::Status status;
            {
              py::gil_scoped_release release;
              status = rt.Finish(error.has_value() ? absl::UnknownError(*error) : absl::OkStatus());
            }
            if (!error.has_value()) {
              s.shut_down = true;
              Check(status);
            }
          },
          py::arg("error") = py::none())
      .def("shutdown",
           [](PyRuntime& s) {
             mesh::Runtime& rt = Rt(s);
             absl::Status status;
             {
               py::gil_scoped_release release;
               status = rt.Shutdown();
             }
             s.shut_down = true;
             if (s.callback != nullptr) s.callback->fn = py::object();
             Check(status);
           })
      .def("world",
           [](PyRuntime& s) {
             mesh::Runtime& rt = Rt(s);
             absl::StatusOr<std::shared_ptr<mesh::ProcessGroup>> group;
             {
               py::gil_scoped_release release;
               group = rt.World();
             }
             return Unwrap(std::move(group));
           })
      .def(
          "init_device_mesh",
          [](PyRuntime& s, std::optional<std::vector<int64_t>> shape,
             std::optional<std::vector<std::string>> dim_names) {
            mesh::Runtime& rt = Rt(s);
            if (!shape.has_value() && dim_names.has_value()) {
              ThrowStatus(absl::InvalidArgumentError(
                  "init_device_mesh: dim_names without a shape; give both, or neither for "
                  "the job's own mesh"));
            }
            absl::StatusOr<mesh::DeviceMesh> device_mesh;
            {
              py::gil_scoped_release release;
              device_mesh =
                  shape.has_value()
                      ? rt.InitDeviceMesh(*shape, dim_names.value_or(std::vector<std::string>{}))
                      : rt.InitDeviceMesh();
            }
            return Unwrap(std::move(device_mesh));
          },
          py::arg("shape") = py::none(), py::arg("dim_names") = py::none())
      .def(
          "track_group",
          [](PyRuntime& s, std::string name, std::vector<int> members) {
            mesh::Runtime& rt = Rt(s);
            // A shut-down Runtime reports nothing any more: say so rather
            // than hand out a GroupProgress nobody reads (meshrt.torch's
            // hook turns itself off on this error).
            absl::Status health = rt.health();
            if (s.shut_down || health.code() == absl::StatusCode::kFailedPrecondition) {
              ThrowStatus(absl::FailedPreconditionError(
                  absl::StrCat("track_group('", name, "'): the Runtime of rank ", rt.info().rank,
                               " has shut down")));
            }
            return rt.progress()->Add(std::move(name), std::move(members));
          },
          py::arg("name"), py::arg("members"))
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyRuntime& s, py::handle type, py::handle value, py::handle) {
        if (s.rt == nullptr) return false;
        // The worker's own error, as `finish` reports it: "ValueError: bad batch".
        std::string error;
        if (!type.is_none()) {
          error = absl::StrCat(py::str(type.attr("__name__")).cast<std::string>(), ": ",
                               py::str(value).cast<std::string>());
        }
        absl::Status status;
        {
          py::gil_scoped_release release;
          status = type.is_none() ? s.rt->Shutdown() : s.rt->Finish(absl::UnknownError(error));
        }
        if (type.is_none()) {
          s.shut_down = true;
          Check(status);
        }
        return false;
      });

  m.def("init", &Init,
        "Joins the job from the MESH_* environment (keywords override it) and "
        "returns the Runtime. See docs/python.md for the keywords.");
}

py::dict SnapshotDict(mesh::GroupProgress& progress) {
  mesh::GroupProgressSnapshot snap = progress.Snapshot();
  py::dict out;
  out["entered"] = snap.entered;
  out["completed"] = snap.completed;
  out["pending_kind"] = std::string(mesh::CollectiveKindName(snap.pending_kind));
  out["completed_kind"] = std::string(mesh::CollectiveKindName(snap.completed_kind));
  out["waiting"] = absl::ToDoubleSeconds(snap.waiting);
  out["since_completed"] = absl::ToDoubleSeconds(snap.since_completed);
  return out;
}

void BindProgress(py::module_& m) {
  py::class_<mesh::GroupProgress, std::shared_ptr<mesh::GroupProgress>>(
      m, "GroupProgress",
      "One group's collective progress, reported with the heartbeats for hang "
      "diagnosis. Made by Runtime.track_group; reported while Python holds it.")
      .def_property_readonly("name", &mesh::GroupProgress::name)
      .def_property_readonly("members", &mesh::GroupProgress::members)
      .def(
          "enter",
          [](mesh::GroupProgress& self, const std::string& kind) {
            return self.Enter(mesh::CollectiveKindFromName(kind));
          },
          py::arg("kind"))
      .def(
          "complete", [](mesh::GroupProgress& self, uint64_t seq) { self.Complete(seq); },
          py::arg("seq"))
      .def("snapshot", &SnapshotDict);
}

}  // namespace

absl::Duration SecondsArg(const py::handle& seconds, absl::Duration fallback, const char* what) {
  if (seconds.is_none()) return fallback;
  double value = 0;
  try {
    value = seconds.cast<double>();
  } catch (const py::cast_error&) {
    throw py::type_error(
        absl::StrCat(what, " must be a number of seconds, not ", Py_TYPE(seconds.ptr())->tp_name));
  }
  if (!std::isfinite(value) || value <= 0) {
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat(what, " must be a positive, finite number of seconds, not ", value)));
  }
  return absl::Seconds(value);
}

py::object ExceptionObject(absl::Status status, ErrorClass error_class) {
  PyObject* exc = MakeException(StatusError{std::move(status), error_class});
  if (exc == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(exc);
}

void RegisterErrors(py::module_& m) {
  py::handle builtins = py::module_::import("builtins");
  g_errors.base = NewError(
      m, "Error", "Base of meshrt's errors; .code is the status code name, .message the text.",
      py::make_tuple(builtins.attr("Exception")));
  py::handle base(g_errors.base);
  g_errors.job_failed =
      NewError(m, "JobFailedError",
               "The job's generation failed (a peer died, hung or reported an error) or this "
               "process was fenced off; the message names the culprit.",
               py::make_tuple(base));
  g_errors.timeout = NewError(m, "TimeoutError", "A deadline passed (DEADLINE_EXCEEDED).",
                              py::make_tuple(base, builtins.attr("TimeoutError")));
  g_errors.not_found = NewError(m, "NotFoundError", "NOT_FOUND.", py::make_tuple(base));
  g_errors.invalid_argument = NewError(m, "InvalidArgumentError", "INVALID_ARGUMENT: bad input.",
                                       py::make_tuple(base, builtins.attr("ValueError")));
  g_errors.unavailable =
      NewError(m, "UnavailableError", "UNAVAILABLE: the coordinator or a peer cannot be reached.",
               py::make_tuple(base));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& error) {
      PyObject* exc = MakeException(error);
      if (exc == nullptr) return;  // The Python error of the failed construction stays set.
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
      Py_DECREF(exc);
    }
  });
  // An argument of the wrong type that a binding converts itself
  // (value.cast<T>()) is a TypeError, as when pybind11 converts the
  // signature's arguments, not pybind11's default RuntimeError. Local: other
  // pybind11 modules (torch's) keep their own behaviour.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const py::cast_error& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    }
  });
}

bool PythonIsFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

}  // namespace meshrt

PYBIND11_MODULE(_meshrt, m) {
  m.doc() = "libmesh bindings: runtime, store, process groups, device meshes, DTensor, jobs";
  meshrt::RegisterErrors(m);
  meshrt::RegisterTensors(m);
  meshrt::BindStore(m);
  meshrt::BindProgress(m);
  meshrt::BindRuntime(m);
  meshrt::RegisterJobClient(m);
  meshrt::RegisterElastic(m, [](pybind11::handle rt) -> std::shared_ptr<mesh::Runtime> {
    meshrt::PyRuntime& self = rt.cast<meshrt::PyRuntime&>();
    meshrt::Rt(self);  // FAILED_PRECONDITION once closed.
    return self.rt;
  });
  meshrt::RegisterBenchHooks(
      m, [](pybind11::handle s) -> mesh::Store& { return s.cast<meshrt::PyStore&>().store(); });
  pybind11::module_::import("atexit").attr("register")(
      pybind11::cpp_function([] { meshrt::ShutdownAllAtExit(); }));
}
