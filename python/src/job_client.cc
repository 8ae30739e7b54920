// meshrt._meshrt: JobClient, meshctl's job commands from Python, over
// meshctl's own typed client (cli/job_client.h, cli/admin_client.h).
//
// Address: the argument, else MESH_COORDINATOR, else meshctl's default
// 127.0.0.1:7450. TLS and tokens come from the environment as for meshctl
// (MESH_TLS_CA, MESH_TLS_CERT, MESH_TLS_KEY, MESH_TLS_SERVER_NAME,
// MESH_TOKEN or MESH_TOKEN_FILE); without MESH_TLS_CA the channel is
// plaintext. The channel is lazy: the constructor does not connect.
//
// Errors: the coordinator's status, mapped as everywhere in meshrt
// (UNAVAILABLE -> UnavailableError, NOT_FOUND -> NotFoundError, ...); wait()
// raises meshrt.TimeoutError when its timeout passes first. submit's
// hang_timeout, on_hang, grow, restart_policy and in_place_dim are meshctl
// submit's --hang-timeout, --on-hang, --grow, --restart-policy and
// --in-place-dim (parsed as meshctl does); a Job shows them as in force.
//
// Thread safety: a JobClient may be shared by threads; every RPC releases
// the GIL. wait() checks for signals (Ctrl-C) at least once a second.
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/admin_client.h"
#include "cli/job_client.h"
#include "cli/job_json.h"
#include "cli/job_spec_file.h"
#include "common/coordinator_targets.h"
#include "common/security.h"
#include "mesh/v1/job.pb.h"
#include "python/src/bindings.h"

namespace meshrt {
namespace {

// A job as the coordinator last reported it (mesh.v1.Job, flattened).
struct PyJob {
  std::string id;
  std::string name;
  std::string state;  // "PENDING", "RUNNING", "SUCCEEDED", ...
  int64_t generation = 0;
  int restarts = 0;
  std::string pending_reason;
  std::vector<std::string> command;
  std::vector<std::string> nodes;
  int nproc_per_node = 0;
  double hang_timeout = 0;     // Seconds, as in force (300 when not given).
  std::string on_hang;         // "restart" or "fail".
  std::string grow;            // "never", "on_restart", "after 10m" (docs/elastic.md).
  py::list resizes;            // One dict per change of the node count.
  std::string restart_policy;  // "group" or "in_place" (docs/elastic.md).
  std::string in_place_dim;    // in_place: the dimension, e.g. "dp"; "" for group.
  py::list membership;         // in_place: one dict per rank lost or returned.
  double create_time = 0;      // Unix seconds.
  double update_time = 0;
  py::object root_cause;  // dict or None.

  bool terminal() const {
    return state == "SUCCEEDED" || state == "FAILED" || state == "CANCELLED";
  }
};

std::string StateName(mesh::v1::JobState state) {
  std::string name = mesh::v1::JobState_Name(state);
  constexpr std::string_view kPrefix = "JOB_STATE_";
  if (name.rfind(kPrefix, 0) == 0) name = name.substr(kPrefix.size());
  return name;
}

PyJob ToPy(const mesh::v1::Job& job) {
  PyJob out;
  out.id = job.id();
  out.name = job.spec().name();
  out.state = StateName(job.state());
  out.generation = job.generation();
  out.restarts = job.restarts();
  out.pending_reason = job.pending_reason();
  out.command.assign(job.spec().command().begin(), job.spec().command().end());
  out.nodes.assign(job.nodes().begin(), job.nodes().end());
  out.nproc_per_node = job.spec().nproc_per_node();
  out.hang_timeout = static_cast<double>(mesh::cli::HangTimeoutSeconds(job.spec()));
  out.on_hang = absl::AsciiStrToLower(mesh::cli::HangPolicyName(job.spec().on_hang()));
  out.grow = mesh::cli::GrowText(job.spec());
  for (const mesh::v1::JobResize& resize : job.resizes()) {
    py::dict r;
    r["time"] = static_cast<double>(resize.time_unix_ms()) / 1000.0;
    r["generation"] = resize.generation();
    r["from_nodes"] = resize.from_nodes();
    r["to_nodes"] = resize.to_nodes();
    r["reason"] = resize.reason();
    out.resizes.append(std::move(r));
  }
  out.restart_policy = mesh::cli::RestartPolicyText(job.spec().restart_policy());
  out.in_place_dim = job.spec().in_place_dim();
  for (const mesh::v1::MembershipChange& change : job.membership()) {
    py::dict m;
    m["epoch"] = change.epoch();
    m["time"] = static_cast<double>(change.time_unix_ms()) / 1000.0;
    m["rank"] = change.rank();
    m["kind"] = mesh::cli::MembershipKindName(change.kind());
    m["incarnation"] = change.incarnation();
    m["reason"] = change.reason();
    out.membership.append(std::move(m));
  }
  out.create_time = static_cast<double>(job.create_time_unix_ms()) / 1000.0;
  out.update_time = static_cast<double>(job.update_time_unix_ms()) / 1000.0;
  if (job.has_root_cause()) {
    const mesh::v1::RootCause& cause = job.root_cause();
    py::dict rc;
    rc["rank"] = cause.rank();
    rc["node"] = cause.node();
    rc["host"] = cause.host();
    rc["generation"] = cause.generation();
    rc["exit_code"] = cause.has_exit_code() ? py::object(py::int_(cause.exit_code())) : py::none();
    rc["signal"] = cause.has_signal() ? py::object(py::int_(cause.signal())) : py::none();
    rc["message"] = cause.message();
    rc["hang"] = cause.hang();
    out.root_cause = std::move(rc);
  } else {
    out.root_cause = py::none();
  }
  return out;
}

// Whole seconds for a proto's int64 seconds field: a fraction rounds up.
int64_t WholeSeconds(absl::Duration d) {
  return absl::ToInt64Seconds(absl::Ceil(d, absl::Seconds(1)));
}

std::string DefaultAddress() {
  const char* env = std::getenv("MESH_COORDINATOR");
  return env != nullptr && *env != '\0' ? std::string(env)
                                        : std::string(mesh::cli::kDefaultCoordinator);
}

class PyJobClient {
 public:
  PyJobClient(std::optional<std::string> address, const py::handle& timeout)
      : address_(address.value_or(DefaultAddress())),
        timeout_(SecondsArg(timeout, absl::Seconds(10), "JobClient: timeout")) {
    absl::StatusOr<mesh::security::ClientSecurity> security =
        mesh::security::ClientSecurityFromEnv();
    if (!security.ok()) ThrowStatus(security.status());
    // Several replicas (docs/ha.md): the one that leads. Looked for once,
    // with the GIL released, within the client's timeout.
    std::string leader;
    {
      py::gil_scoped_release release;
      absl::StatusOr<std::string> found = mesh::FindLeader(
          mesh::SplitCoordinatorTargets(address_),
          [&](const std::string& target) { return mesh::cli::MakeChannel(target, *security); },
          absl::Now() + timeout_);
      leader = found.ok() ? *found : "";
      if (!found.ok()) security = found.status();
    }
    if (!security.ok()) ThrowStatus(security.status());
    channel_ = Unwrap(mesh::cli::MakeChannel(leader, *security));
    jobs_ = std::make_unique<mesh::cli::JobClient>(channel_);
  }

  const std::string& address() const { return address_; }

  std::string Submit(const py::handle& command, const py::handle& nodes, int nproc_per_node,
                     std::optional<std::map<std::string, std::string>> env,
                     std::optional<std::vector<int64_t>> mesh_shape,
                     std::optional<std::vector<std::string>> mesh_dim_names, int max_restarts,
                     const std::string& name, int gpus_per_proc, const std::string& working_dir,
                     std::optional<std::map<std::string, std::string>> labels,
                     const py::handle& hang_timeout, const py::handle& on_hang,
                     std::optional<std::string> grow, std::optional<std::string> restart_policy,
                     std::optional<std::string> in_place_dim) {
    if (PyUnicode_Check(command.ptr()) || !PySequence_Check(command.ptr())) {
      throw py::type_error(
          "JobClient.submit: command must be a list of str (argv; no shell is involved), "
          "e.g. shlex.split(\"python3 train.py\")");
    }
    mesh::v1::JobSpec spec;
    py::sequence argv = py::reinterpret_borrow<py::sequence>(command);
    for (size_t i = 0; i < argv.size(); ++i) {
      py::object arg = argv[i];
      if (!PyUnicode_Check(arg.ptr())) {
        throw py::type_error(
            absl::StrCat("JobClient.submit: command must be a list of str; command[", i, "] is ",
                         Py_TYPE(arg.ptr())->tp_name));
      }
      spec.add_command(arg.cast<std::string>());
    }
    try {
      if (PyLong_Check(nodes.ptr())) {
        const int n = nodes.cast<int>();
        spec.mutable_nodes()->set_min(n);
        spec.mutable_nodes()->set_max(n);
      } else {
        auto [lo, hi] = nodes.cast<std::pair<int, int>>();
        spec.mutable_nodes()->set_min(lo);
        spec.mutable_nodes()->set_max(hi);
      }
    } catch (const py::cast_error&) {
      throw py::type_error(
          absl::StrCat("JobClient.submit: nodes must be an int or a (min, max) "
                       "pair of int, not ",
                       Py_TYPE(nodes.ptr())->tp_name));
    }
    if (!hang_timeout.is_none()) {
      spec.set_hang_timeout_seconds(WholeSeconds(
          SecondsArg(hang_timeout, absl::ZeroDuration(), "JobClient.submit: hang_timeout")));
    }
    if (!on_hang.is_none()) {
      if (!PyUnicode_Check(on_hang.ptr())) {
        throw py::type_error(
            absl::StrCat("JobClient.submit: on_hang must be \"restart\" or "
                         "\"fail\", not ",
                         Py_TYPE(on_hang.ptr())->tp_name));
      }
      absl::StatusOr<mesh::v1::HangPolicy> policy =
          mesh::cli::ParseHangPolicy(on_hang.cast<std::string>());
      if (!policy.ok()) {
        ThrowStatus(absl::InvalidArgumentError(
            absl::StrCat("JobClient.submit: on_hang: ", policy.status().message())));
      }
      spec.set_on_hang(*policy);
    }
    if (grow.has_value()) {
      if (absl::Status parsed = mesh::cli::ParseGrow(*grow, spec); !parsed.ok()) {
        ThrowStatus(
            absl::InvalidArgumentError(absl::StrCat("JobClient.submit: grow: ", parsed.message())));
      }
    }
    if (restart_policy.has_value()) {
      absl::StatusOr<mesh::v1::RestartPolicy> policy =
          mesh::cli::ParseRestartPolicy(*restart_policy);
      if (!policy.ok()) {
        ThrowStatus(absl::InvalidArgumentError(
            absl::StrCat("JobClient.submit: restart_policy: ", policy.status().message())));
      }
      spec.set_restart_policy(*policy);
    }
    if (in_place_dim.has_value()) {
      if (absl::Status checked = mesh::cli::CheckInPlaceDim(*in_place_dim); !checked.ok()) {
        ThrowStatus(absl::InvalidArgumentError(
            absl::StrCat("JobClient.submit: in_place_dim: ", checked.message())));
      }
      spec.set_in_place_dim(*in_place_dim);
    }
    spec.set_nproc_per_node(nproc_per_node);
    spec.set_gpus_per_proc(gpus_per_proc);
    spec.set_max_restarts(max_restarts);
    spec.set_name(name);
    spec.set_working_dir(working_dir);
    if (env.has_value()) spec.mutable_env()->insert(env->begin(), env->end());
    if (labels.has_value()) spec.mutable_labels()->insert(labels->begin(), labels->end());
    if (mesh_shape.has_value()) {
      for (int64_t size : *mesh_shape) spec.add_mesh_shape(size);
    }
    if (mesh_dim_names.has_value()) {
      for (const std::string& dim : *mesh_dim_names) spec.add_mesh_dim_names(dim);
    }
    absl::StatusOr<mesh::v1::SubmitJobResponse> response;
    {
      py::gil_scoped_release release;
      response = jobs_->SubmitJob(spec, timeout_);
    }
    return Unwrap(std::move(response)).job().id();
  }

  PyJob Get(const std::string& job_id) {
    absl::StatusOr<mesh::v1::Job> job;
    {
      py::gil_scoped_release release;
      job = jobs_->GetJob(job_id, timeout_);
    }
    return ToPy(Unwrap(std::move(job)));
  }

  std::vector<PyJob> List(std::optional<std::vector<std::string>> states) {
    mesh::v1::ListJobsRequest request;
    if (states.has_value()) {
      for (const std::string& state : *states) {
        mesh::v1::JobState value;
        if (!mesh::v1::JobState_Parse(absl::StrCat("JOB_STATE_", state), &value)) {
          ThrowStatus(absl::InvalidArgumentError(
              absl::StrCat("JobClient.list: unknown state '", state, "'")));
        }
        request.add_states(value);
      }
    }
    std::vector<PyJob> out;
    while (true) {
      absl::StatusOr<mesh::v1::ListJobsResponse> page;
      {
        py::gil_scoped_release release;
        page = jobs_->ListJobs(request, timeout_);
      }
      Check(page.status());
      for (const mesh::v1::Job& job : page->jobs()) out.push_back(ToPy(job));
      if (page->next_page_token().empty()) break;
      request.set_page_token(page->next_page_token());
    }
    return out;
  }

  PyJob Wait(const std::string& job_id, const py::handle& timeout) {
    const std::optional<absl::Time> deadline =
        timeout.is_none()
            ? std::nullopt
            : std::optional<absl::Time>(absl::Now() + SecondsArg(timeout, absl::ZeroDuration(),
                                                                 "JobClient.wait: timeout"));
    while (true) {
      absl::Duration wait = absl::Seconds(1);
      if (deadline.has_value()) wait = std::min(wait, *deadline - absl::Now());
      if (wait <= absl::ZeroDuration()) {
        PyJob job = Get(job_id);
        if (job.terminal()) return job;
        ThrowStatus(absl::DeadlineExceededError(
            absl::StrCat("job ", job_id, " is still ", job.state, " after ",
                         absl::FormatDuration(SecondsArg(timeout, absl::ZeroDuration(),
                                                         "JobClient.wait: timeout")))));
      }
      absl::StatusOr<mesh::v1::Job> job;
      {
        py::gil_scoped_release release;
        job = jobs_->WaitJob(job_id, wait, absl::Seconds(5));
      }
      if (job.ok()) {
        PyJob out = ToPy(*job);
        if (out.terminal()) return out;
      } else if (!absl::IsDeadlineExceeded(job.status())) {
        ThrowStatus(job.status());
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  std::string Logs(const std::string& job_id, std::optional<int> rank, int tail) {
    mesh::v1::GetLogsRequest request;
    request.set_job_id(job_id);
    request.set_generation(-1);
    request.set_tail(tail);
    if (rank.has_value()) request.add_ranks(*rank);
    std::map<int, std::string> text;
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = jobs_->GetLogs(
          request,
          [&](const mesh::v1::LogChunk& chunk) {
            text[chunk.rank()] += chunk.data();
            return true;
          },
          nullptr);
    }
    Check(status);
    if (rank.has_value()) return text[*rank];
    // Every rank: each line prefixed with its rank, ranks in order.
    std::string out;
    for (const auto& [r, data] : text) {
      for (absl::string_view line : absl::StrSplit(data, '\n', absl::SkipEmpty())) {
        absl::StrAppend(&out, "[", r, "] ", line, "\n");
      }
    }
    return out;
  }

  PyJob Cancel(const std::string& job_id, const std::string& reason) {
    absl::StatusOr<mesh::v1::Job> job;
    {
      py::gil_scoped_release release;
      job = jobs_->CancelJob(job_id, reason, timeout_);
    }
    return ToPy(Unwrap(std::move(job)));
  }

  py::tuple CreateJob(int world_size, const std::string& job_id,
                      std::optional<std::vector<int64_t>> mesh_shape,
                      std::optional<std::vector<std::string>> mesh_dim_names,
                      const py::handle& hang_timeout, bool in_place) {
    mesh::v1::CreateJobRequest request;
    request.set_job_id(job_id);
    request.set_world_size(world_size);
    request.set_in_place(in_place);
    if (!hang_timeout.is_none()) {
      request.set_hang_timeout_seconds(WholeSeconds(
          SecondsArg(hang_timeout, absl::ZeroDuration(), "JobClient.create_job: hang_timeout")));
    }
    if (mesh_shape.has_value()) {
      for (int64_t size : *mesh_shape) request.add_mesh_shape(size);
    }
    if (mesh_dim_names.has_value()) {
      for (const std::string& dim : *mesh_dim_names) request.add_mesh_dim_names(dim);
    }
    absl::StatusOr<mesh::v1::CreateJobResponse> response;
    {
      py::gil_scoped_release release;
      response = mesh::cli::AdminClient(channel_).CreateJob(request, timeout_);
    }
    Check(response.status());
    return py::make_tuple(response->job_id(), response->generation());
  }

 private:
  std::string address_;
  absl::Duration timeout_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<mesh::cli::JobClient> jobs_;
};

}  // namespace

void RegisterJobClient(py::module_& m) {
  py::class_<PyJob>(m, "Job", "A job as the coordinator reported it (mesh.v1.Job).")
      .def_readonly("id", &PyJob::id)
      .def_readonly("name", &PyJob::name)
      .def_readonly("state", &PyJob::state)
      .def_readonly("generation", &PyJob::generation)
      .def_readonly("restarts", &PyJob::restarts)
      .def_readonly("pending_reason", &PyJob::pending_reason)
      .def_readonly("command", &PyJob::command)
      .def_readonly("nodes", &PyJob::nodes)
      .def_readonly("nproc_per_node", &PyJob::nproc_per_node)
      .def_readonly("hang_timeout", &PyJob::hang_timeout)
      .def_readonly("on_hang", &PyJob::on_hang)
      .def_readonly("grow", &PyJob::grow)
      .def_readonly("resizes", &PyJob::resizes)
      .def_readonly("restart_policy", &PyJob::restart_policy)
      .def_readonly("in_place_dim", &PyJob::in_place_dim)
      .def_readonly("membership", &PyJob::membership)
      .def_readonly("create_time", &PyJob::create_time)
      .def_readonly("update_time", &PyJob::update_time)
      .def_readonly("root_cause", &PyJob::root_cause)
      .def_property_readonly("terminal", &PyJob::terminal)
      .def("__repr__", [](const PyJob& job) {
        return absl::StrCat("Job(id='", job.id, "', state='", job.state,
                            "', generation=", job.generation, ", restarts=", job.restarts, ")");
      });

  py::class_<PyJobClient>(m, "JobClient",
                          "meshctl's job commands: submit, get, list, wait, logs, cancel.")
      .def(py::init<std::optional<std::string>, py::handle>(), py::arg("address") = py::none(),
           py::arg("timeout") = py::none())
      .def_property_readonly("address", &PyJobClient::address)
      .def("submit", &PyJobClient::Submit, py::arg("command"), py::kw_only(), py::arg("nodes") = 1,
           py::arg("nproc_per_node") = 1, py::arg("env") = py::none(),
           py::arg("mesh_shape") = py::none(), py::arg("mesh_dim_names") = py::none(),
           py::arg("max_restarts") = 0, py::arg("name") = "", py::arg("gpus_per_proc") = 0,
           py::arg("working_dir") = "", py::arg("labels") = py::none(),
           py::arg("hang_timeout") = py::none(), py::arg("on_hang") = py::none(),
           py::arg("grow") = py::none(), py::arg("restart_policy") = py::none(),
           py::arg("in_place_dim") = py::none(),
           "Submits a job; returns its id. nodes=(min, max) with grow=\"on_restart\" or "
           "\"after:10m\" makes an elastic job; restart_policy=\"in_place\" relaunches a "
           "failed rank alone while the others run on (docs/elastic.md).")
      .def("get", &PyJobClient::Get, py::arg("job_id"))
      .def("list", &PyJobClient::List, py::arg("states") = py::none())
      .def("wait", &PyJobClient::Wait, py::arg("job_id"), py::arg("timeout") = py::none(),
           "Waits until the job is SUCCEEDED, FAILED or CANCELLED and returns it.")
      .def("logs", &PyJobClient::Logs, py::arg("job_id"), py::arg("rank") = py::none(),
           py::arg("tail") = 0)
      .def("cancel", &PyJobClient::Cancel, py::arg("job_id"), py::arg("reason") = "")
      .def("create_job", &PyJobClient::CreateJob, py::arg("world_size"), py::kw_only(),
           py::arg("job_id") = "", py::arg("mesh_shape") = py::none(),
           py::arg("mesh_dim_names") = py::none(), py::arg("hang_timeout") = py::none(),
           py::arg("in_place") = false,
           "A bare job record for workers started by hand (AdminService.CreateJob, as "
           "`meshctl create-job`); in_place: a rank that dies once the world has formed is "
           "lost, not the job (docs/elastic.md). Returns (job_id, generation).");
}

}  // namespace meshrt
