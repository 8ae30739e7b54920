// meshrt.Store (BindStore): the coordinator's key-value store of this
// rank's (job, generation), c10d.Store semantics over mesh::Store. Converts
// keys and values from Python, releases the GIL around every call, and
// reports a failed job's store as JobFailedError (PyStore, store.h).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "mesh/store.h"
#include "python/src/bindings.h"
#include "python/src/store.h"

namespace meshrt {
namespace {

std::string KeyArg(const py::handle& key, const char* method) {
  if (!PyUnicode_Check(key.ptr())) {
    throw py::type_error(absl::StrCat("meshrt.Store.", method, ": a key must be str, not ",
                                      Py_TYPE(key.ptr())->tp_name));
  }
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(key.ptr(), &size);
  if (data == nullptr) throw py::error_already_set();
  return std::string(data, static_cast<size_t>(size));
}

std::string ValueArg(const py::handle& value, const char* method) {
  PyObject* obj = value.ptr();
  if (PyBytes_Check(obj)) {
    return std::string(PyBytes_AS_STRING(obj), static_cast<size_t>(PyBytes_GET_SIZE(obj)));
  }
  if (PyByteArray_Check(obj)) {
    return std::string(PyByteArray_AS_STRING(obj), static_cast<size_t>(PyByteArray_GET_SIZE(obj)));
  }
  if (PyUnicode_Check(obj)) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(obj, &size);
    if (data == nullptr) throw py::error_already_set();
    return std::string(data, static_cast<size_t>(size));
  }
  throw py::type_error(absl::StrCat("meshrt.Store.", method,
                                    ": a value must be bytes or str (UTF-8 encoded), not ",
                                    Py_TYPE(obj)->tp_name));
}

std::vector<std::string> KeysArg(const py::handle& keys, const char* method) {
  if (PyUnicode_Check(keys.ptr()) || PyBytes_Check(keys.ptr()) || !PySequence_Check(keys.ptr())) {
    throw py::type_error(absl::StrCat("meshrt.Store.", method, ": keys must be a list of str, not ",
                                      Py_TYPE(keys.ptr())->tp_name));
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(keys);
  std::vector<std::string> out;
  out.reserve(seq.size());
  for (const py::handle& key : seq) out.push_back(KeyArg(key, method));
  return out;
}

py::bytes Bytes(const std::string& value) { return py::bytes(value.data(), value.size()); }

absl::Duration TimeoutArg(const py::handle& timeout, mesh::Store& store, const char* what) {
  return SecondsArg(timeout, store.timeout(), what);
}

}  // namespace

void BindStore(py::module_& m) {
  py::class_<PyStore, std::shared_ptr<PyStore>>(
      m, "Store",
      "The coordinator's key-value store of this rank's (job, generation): "
      "c10d.Store semantics with finite timeouts. Get it from Runtime.store.")
      .def(
          "set",
          [](PyStore& self, py::handle key, py::handle value) {
            std::string k = KeyArg(key, "set");
            std::string v = ValueArg(value, "set");
            self.CheckCall("set", self.Run("set", [&](mesh::Store& s) { return s.Set(k, v); }));
          },
          py::arg("key"), py::arg("value"))
      .def(
          "get",
          [](PyStore& self, py::handle key, py::handle timeout) {
            std::string k = KeyArg(key, "get");
            absl::Duration t = TimeoutArg(timeout, self.store(), "meshrt.Store.get: timeout");
            return Bytes(
                self.Value("get", self.Run("get", [&](mesh::Store& s) { return s.Get(k, t); })));
          },
          py::arg("key"), py::arg("timeout") = py::none())
      .def(
          "try_get",
          [](PyStore& self, py::handle key) -> py::object {
            std::string k = KeyArg(key, "try_get");
            absl::StatusOr<std::string> value =
                self.Run("try_get", [&](mesh::Store& s) { return s.TryGet(k); });
            if (absl::IsNotFound(value.status())) return py::none();
            return Bytes(self.Value("try_get", std::move(value)));
          },
          py::arg("key"))
      .def(
          "add",
          [](PyStore& self, py::handle key, int64_t delta) {
            std::string k = KeyArg(key, "add");
            return self.Value("add",
                              self.Run("add", [&](mesh::Store& s) { return s.Add(k, delta); }));
          },
          py::arg("key"), py::arg("delta"))
      .def(
          "compare_set",
          [](PyStore& self, py::handle key, py::handle expected, py::handle desired) {
            std::string k = KeyArg(key, "compare_set");
            std::string e = expected.is_none() ? std::string() : ValueArg(expected, "compare_set");
            std::string d = ValueArg(desired, "compare_set");
            mesh::CompareSetResult r = self.Value(
                "compare_set",
                self.Run("compare_set", [&](mesh::Store& s) { return s.CompareSet(k, e, d); }));
            // c10d's return value.
            return Bytes(r.swapped ? d : (r.present ? r.value : e));
          },
          py::arg("key"), py::arg("expected"), py::arg("desired"))
      .def(
          "wait",
          [](PyStore& self, py::handle keys, py::handle timeout) {
            std::vector<std::string> k = KeysArg(keys, "wait");
            absl::Duration t = TimeoutArg(timeout, self.store(), "meshrt.Store.wait: timeout");
            self.CheckCall("wait", self.Run("wait", [&](mesh::Store& s) { return s.Wait(k, t); }));
          },
          py::arg("keys"), py::arg("timeout") = py::none())
      .def(
          "delete_key",
          [](PyStore& self, py::handle key) {
            std::string k = KeyArg(key, "delete_key");
            return self.Value("delete_key", self.Run("delete_key", [&](mesh::Store& s) {
              return s.DeleteKey(k);
            }));
          },
          py::arg("key"))
      .def("num_keys",
           [](PyStore& self) {
             return self.Value("num_keys",
                               self.Run("num_keys", [](mesh::Store& s) { return s.NumKeys(); }));
           })
      .def(
          "multi_get",
          [](PyStore& self, py::handle keys, py::handle timeout) {
            std::vector<std::string> k = KeysArg(keys, "multi_get");
            absl::Duration t = TimeoutArg(timeout, self.store(), "meshrt.Store.multi_get: timeout");
            std::vector<std::string> values =
                self.Value("multi_get",
                           self.Run("multi_get", [&](mesh::Store& s) { return s.MultiGet(k, t); }));
            py::list out(values.size());
            for (size_t i = 0; i < values.size(); ++i) out[i] = Bytes(values[i]);
            return out;
          },
          py::arg("keys"), py::arg("timeout") = py::none())
      .def(
          "multi_set",
          [](PyStore& self, py::handle keys, py::handle values) {
            std::vector<std::string> k = KeysArg(keys, "multi_set");
            if (PyUnicode_Check(values.ptr()) || PyBytes_Check(values.ptr()) ||
                !PySequence_Check(values.ptr())) {
              throw py::type_error("meshrt.Store.multi_set: values must be a list of bytes or str");
            }
            std::vector<std::string> v;
            for (const py::handle& value : py::reinterpret_borrow<py::sequence>(values)) {
              v.push_back(ValueArg(value, "multi_set"));
            }
            self.CheckCall("multi_set",
                           self.Run("multi_set", [&](mesh::Store& s) { return s.MultiSet(k, v); }));
          },
          py::arg("keys"), py::arg("values"))
      .def_property(
          "timeout", [](PyStore& self) { return absl::ToDoubleSeconds(self.store().timeout()); },
          [](PyStore& self, py::handle seconds) {
            Check(self.store().SetTimeout(
                SecondsArg(seconds, self.store().timeout(), "meshrt.Store.timeout")));
          },
          "Default timeout of get, wait and multi_get, in seconds.");
}

}  // namespace meshrt
