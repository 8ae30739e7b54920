#include "coordinator/job_spec.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/check.h"
#include "common/worker_env_policy.h"

namespace mesh::coordinator {
namespace {

using ::mesh::v1::JobSpec;

// Longest job name and label key/value (bytes).
constexpr size_t kMaxNameBytes = 128;
constexpr size_t kMaxLabelKeyBytes = 63;
constexpr size_t kMaxLabelValueBytes = 256;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// `s` quoted and escaped for a message, so NUL and control bytes show.
std::string Quote(absl::string_view s) { return absl::StrCat("\"", absl::CHexEscape(s), "\""); }

// `field["key"]`.
std::string KeyPath(absl::string_view field, absl::string_view key) {
  return absl::StrCat(field, "[", Quote(key), "]");
}

bool HasNul(absl::string_view s) { return s.find('\0') != absl::string_view::npos; }

bool AllOf(absl::string_view s, absl::string_view extra) {
  return std::all_of(s.begin(), s.end(), [extra](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
           extra.find(c) != absl::string_view::npos;
  });
}

// Map entries in byte order of their keys, so the reported error does not
// depend on the map's iteration order.
std::vector<std::pair<std::string, std::string>> Sorted(
    const google::protobuf::Map<std::string, std::string>& map) {
  std::vector<std::pair<std::string, std::string>> entries(map.begin(), map.end());
  std::sort(entries.begin(), entries.end());
  return entries;
}

int MaxNodes(const JobSpec& spec) {
  return spec.nodes().max() == 0 ? spec.nodes().min() : spec.nodes().max();
}

absl::Status ValidateName(const JobSpec& spec) {
  const std::string& name = spec.name();
  if (name.empty()) return absl::OkStatus();
  if (name.size() > kMaxNameBytes || !AllOf(name, "._-")) {
    return Invalid("spec.name", absl::StrCat(Quote(name), " is not 1..", kMaxNameBytes,
                                             " characters of [A-Za-z0-9._-]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateLabels(const JobSpec& spec, const JobSpecLimits& limits) {
  if (spec.labels_size() > limits.max_labels) {
    return Invalid("spec.labels", absl::StrCat(spec.labels_size(), " labels, over the limit of ",
                                               limits.max_labels));
  }
  for (const auto& [key, value] : Sorted(spec.labels())) {
    if (key.empty() || key.size() > kMaxLabelKeyBytes || !AllOf(key, "._/-")) {
      return Invalid(
          KeyPath("spec.labels", key),
          absl::StrCat("a label key is 1..", kMaxLabelKeyBytes, " characters of [A-Za-z0-9._/-]"));
    }
    if (value.size() > kMaxLabelValueBytes) {
      return Invalid(KeyPath("spec.labels", key),
                     absl::StrCat("value of ", value.size(), " bytes, over the limit of ",
                                  kMaxLabelValueBytes));
    }
    if (HasNul(value)) return Invalid(KeyPath("spec.labels", key), "value contains a NUL byte");
  }
  return absl::OkStatus();
}

absl::Status ValidateCommand(const JobSpec& spec, const JobSpecLimits& limits) {
  if (spec.command().empty()) {
    return Invalid("spec.command", "is empty; give the program and its arguments");
  }
  if (spec.command_size() > limits.max_argv_count) {
    return Invalid(
        "spec.command",
        absl::StrCat(spec.command_size(), " arguments, over the limit of ", limits.max_argv_count));
  }
  int64_t bytes = 0;
  for (int i = 0; i < spec.command_size(); ++i) {
    const std::string& arg = spec.command(i);
    const std::string path = absl::StrCat("spec.command[", i, "]");
    if (HasNul(arg)) return Invalid(path, "contains a NUL byte");
    bytes += static_cast<int64_t>(arg.size());
  }
  if (spec.command(0).empty()) return Invalid("spec.command[0]", "the program is empty");
  if (bytes > limits.max_argv_bytes) {
    return Invalid("spec.command", absl::StrCat(bytes, " bytes of arguments, over the limit of ",
                                                limits.max_argv_bytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateEnv(const JobSpec& spec, const JobSpecLimits& limits) {
  if (spec.env_size() > limits.max_env_count) {
    return Invalid("spec.env", absl::StrCat(spec.env_size(), " variables, over the limit of ",
                                            limits.max_env_count));
  }
  int64_t bytes = 0;
  for (const auto& [name, value] : Sorted(spec.env())) {
    if (std::string problem = EnvNameProblem(name, limits.allowed_job_env); !problem.empty()) {
      return Invalid(KeyPath("spec.env", name), problem);
    }
    if (HasNul(value)) return Invalid(KeyPath("spec.env", name), "value contains a NUL byte");
    bytes += static_cast<int64_t>(name.size() + value.size());
  }
  if (bytes > limits.max_env_bytes) {
    return Invalid("spec.env", absl::StrCat(bytes, " bytes of names and values, over the limit of ",
                                            limits.max_env_bytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateWorkingDir(const JobSpec& spec, const JobSpecLimits& limits) {
  const std::string& dir = spec.working_dir();
  if (dir.empty()) return absl::OkStatus();
  if (HasNul(dir)) return Invalid("spec.working_dir", "contains a NUL byte");
  absl::StatusOr<std::string> normal = NormalizeAbsolutePath(dir);
  if (!normal.ok()) {
    return Invalid("spec.working_dir", absl::StrCat(Quote(dir),
                                                    " is relative; give an absolute "
                                                    "path"));
  }
  absl::StatusOr<std::string> root_or = NormalizeAbsolutePath(limits.working_dir_root);
  MESH_CHECK(root_or.ok(), "JobSpecLimits::working_dir_root is not absolute");
  const std::string& root = *root_or;
  const bool inside =
      root == "/" || *normal == root || absl::StartsWith(*normal, absl::StrCat(root, "/"));
  if (!inside) {
    return Invalid("spec.working_dir", absl::StrCat(Quote(dir), " (", Quote(*normal),
                                                    ") is outside the allowed root ", Quote(root)));
  }
  return absl::OkStatus();
}

absl::Status ValidateSize(const JobSpec& spec, const JobSpecLimits& limits) {
  const int min = spec.nodes().min();
  const int max = MaxNodes(spec);
  if (min < 1) return Invalid("spec.nodes.min", absl::StrCat(min, " is less than 1"));
  if (max < min) {
    return Invalid("spec.nodes", absl::StrCat("min ", min, " is greater than max ", max));
  }
  if (spec.nproc_per_node() < 1) {
    return Invalid("spec.nproc_per_node", absl::StrCat(spec.nproc_per_node(), " is less than 1"));
  }
  const int64_t world = int64_t{max} * spec.nproc_per_node();
  if (world > limits.max_world_size) {
    return Invalid(
        "spec.nproc_per_node",
        absl::StrCat(spec.nproc_per_node(), " processes on up to ", max, " nodes make a world of ",
                     world, " ranks, over the limit of ", limits.max_world_size));
  }
  if (spec.gpus_per_proc() < 0) {
    return Invalid("spec.gpus_per_proc", absl::StrCat(spec.gpus_per_proc(), " is negative"));
  }
  return absl::OkStatus();
}

// See NormalizeJobSpec and docs/jobs.md, "Mesh shape".
absl::Status ValidateMesh(const JobSpec& spec) {
  const int min = spec.nodes().min();
  const int max = MaxNodes(spec);
  const int64_t nproc = spec.nproc_per_node();
  const size_t ndims = spec.mesh_shape().empty() ? 1 : spec.mesh_shape_size();
  int wildcard = -1;
  int64_t fixed = 1;  // Product of the dims other than -1; <= max world.
  for (int i = 0; i < spec.mesh_shape_size(); ++i) {
    const int64_t dim = spec.mesh_shape(i);
    const std::string path = absl::StrCat("spec.mesh_shape[", i, "]");
    if (dim == -1) {
      if (wildcard >= 0) {
        return Invalid(path, absl::StrCat("-1 again (also at ", wildcard,
                                          "); at most one dimension may be -1"));
      }
      wildcard = i;
      continue;
    }
    if (dim < 1) return Invalid(path, absl::StrCat(dim, " is neither -1 nor >= 1"));
    // Dividing rather than multiplying first keeps `fixed` <= the largest
    // world, so it cannot overflow however large `dim` is.
    if (dim > max * nproc / fixed) {
      return Invalid("spec.mesh_shape",
                     absl::StrCat("[", absl::StrJoin(spec.mesh_shape(), ", "),
                                  "] has more ranks than the largest world, ", max * nproc));
    }
    fixed *= dim;
  }
  const std::string shape = absl::StrCat("[", absl::StrJoin(spec.mesh_shape(), ", "), "]");
  if (spec.mesh_shape().empty()) {
    // [-1]: always fits.
  } else if (wildcard < 0) {
    if (min != max) {
      return Invalid("spec.mesh_shape", absl::StrCat(shape, " is fixed, but the job may get ", min,
                                                     " to ", max, " nodes; make one dimension -1"));
    }
    if (fixed != min * nproc) {
      return Invalid("spec.mesh_shape",
                     absl::StrCat(shape, " has ", fixed, " ranks, but ", min, " nodes × ", nproc,
                                  " processes make ", min * nproc));
    }
  } else {
    // Every node count in [min, max] must give a whole -1 dimension: for a
    // fixed count, `fixed` divides the world; for a range, it divides
    // nproc_per_node (two consecutive counts share no factor).
    const int64_t must_divide = min == max ? min * nproc : nproc;
    if (must_divide % fixed != 0) {
      return Invalid("spec.mesh_shape",
                     min == max
                         ? absl::StrCat(shape, ": the other dimensions make ", fixed,
                                        " ranks, which does not divide the world of ", must_divide)
                         : absl::StrCat(shape, ": the other dimensions make ", fixed,
                                        ", which must divide nproc_per_node ", nproc,
                                        " so that every node count in ", min, ":", max, " fits"));
    }
  }
  if (!spec.mesh_dim_names().empty()) {
    if (static_cast<size_t>(spec.mesh_dim_names_size()) != ndims) {
      return Invalid("spec.mesh_dim_names",
                     absl::StrCat(spec.mesh_dim_names_size(), " names for a ", ndims, "-d mesh"));
    }
    absl::flat_hash_set<absl::string_view> seen;
    for (int i = 0; i < spec.mesh_dim_names_size(); ++i) {
      const std::string& name = spec.mesh_dim_names(i);
      const std::string path = absl::StrCat("spec.mesh_dim_names[", i, "]");
      if (name.empty()) return Invalid(path, "is empty");
      if (HasNul(name)) return Invalid(path, "contains a NUL byte");
      if (!seen.insert(name).second) {
        return Invalid(path, absl::StrCat(Quote(name), " appears twice; names must be unique"));
      }
    }
  }
  return absl::OkStatus();
}

// spec.grow and spec.grow_after_seconds (docs/elastic.md).
absl::Status ValidateGrow(const JobSpec& spec) {
  const mesh::v1::GrowPolicy grow = spec.grow();
  if (!mesh::v1::GrowPolicy_IsValid(grow)) {
    return Invalid("spec.grow", absl::StrCat(static_cast<int>(grow),
                                             " is not a GrowPolicy (NEVER, ON_RESTART or AFTER)"));
  }
  const bool grows =
      grow == mesh::v1::GROW_POLICY_ON_RESTART || grow == mesh::v1::GROW_POLICY_AFTER;
  const int min = spec.nodes().min();
  const int max = MaxNodes(spec);
  if (grows && min == max) {
    return Invalid("spec.grow", absl::StrCat(GrowPolicyName(grow),
                                             " needs nodes MIN:MAX with MIN < MAX, but "
                                             "the job's size is fixed at ",
                                             min, min == 1 ? " node" : " nodes"));
  }
  const int64_t after = spec.grow_after_seconds();
  if (grow != mesh::v1::GROW_POLICY_AFTER) {
    if (after != 0) {
      return Invalid("spec.grow_after_seconds",
                     absl::StrCat(after, " is set, but spec.grow is ", GrowPolicyName(grow),
                                  "; only AFTER takes a delay"));
    }
  } else if (after < 1 || after > kMaxGrowAfterSeconds) {
    return Invalid("spec.grow_after_seconds",
                   absl::StrCat(after, " is outside 1..", kMaxGrowAfterSeconds,
                                " (grow AFTER needs a delay)"));
  }
  return absl::OkStatus();
}

// spec.restart_policy and spec.in_place_dim (docs/elastic.md).
absl::Status ValidateRestartPolicy(const JobSpec& spec) {
  const mesh::v1::RestartPolicy policy = spec.restart_policy();
  if (!mesh::v1::RestartPolicy_IsValid(policy)) {
    return Invalid(
        "spec.restart_policy",
        absl::StrCat(static_cast<int>(policy), " is not a RestartPolicy (GROUP or IN_PLACE)"));
  }
  if (policy != mesh::v1::RESTART_POLICY_IN_PLACE) {
    if (!spec.in_place_dim().empty()) {
      return Invalid(
          "spec.in_place_dim",
          absl::StrCat(Quote(spec.in_place_dim()), " is set, but spec.restart_policy is ",
                       RestartPolicyName(policy), "; only IN_PLACE takes a dimension"));
    }
    return absl::OkStatus();
  }
  const std::string dim = spec.in_place_dim().empty() ? "dp" : spec.in_place_dim();
  // The dimension names as NormalizeJobSpec fills them in.
  std::vector<std::string> names(spec.mesh_dim_names().begin(), spec.mesh_dim_names().end());
  const int ndims = spec.mesh_shape().empty() ? 1 : spec.mesh_shape_size();
  if (names.empty()) {
    if (ndims == 1) {
      names.push_back("world");
    } else {
      for (int i = 0; i < ndims; ++i) names.push_back(absl::StrCat("dim", i));
    }
  }
  const auto it = std::find(names.begin(), names.end(), dim);
  if (it == names.end()) {
    return Invalid(
        spec.in_place_dim().empty() ? "spec.restart_policy" : "spec.in_place_dim",
        absl::StrCat("IN_PLACE drops the failed replica along mesh dimension ", Quote(dim),
                     ", but the mesh has no such dimension (its dimensions: ",
                     absl::StrJoin(names, ", "), "); name one with in_place_dim"));
  }
  // Its size with the most nodes the job may get: a -1 dimension takes what
  // the others leave (ValidateMesh made that whole).
  const int index = static_cast<int>(it - names.begin());
  const int64_t world = int64_t{MaxNodes(spec)} * spec.nproc_per_node();
  int64_t size = world;
  if (!spec.mesh_shape().empty()) {
    size = spec.mesh_shape(index);
    if (size == -1) {
      int64_t others = 1;
      for (int i = 0; i < spec.mesh_shape_size(); ++i) {
        if (i != index) others *= spec.mesh_shape(i);
      }
      size = world / others;
    }
  }
  if (size < 2) {
    return Invalid(
        spec.in_place_dim().empty() ? "spec.restart_policy" : "spec.in_place_dim",
        absl::StrCat("mesh dimension ", Quote(dim), " has size ", size, " with ", MaxNodes(spec),
                     MaxNodes(spec) == 1 ? " node" : " nodes", ": it has no replica to drop"));
  }
  return absl::OkStatus();
}

// Fields 11.. in field-number order.
absl::Status ValidateRest(const JobSpec& spec, const JobSpecLimits& limits) {
  if (spec.max_restarts() < 0) {
    return Invalid("spec.max_restarts", absl::StrCat(spec.max_restarts(), " is negative"));
  }
  if (spec.deadline_seconds() < 0) {
    return Invalid("spec.deadline_seconds", absl::StrCat(spec.deadline_seconds(), " is negative"));
  }
  const std::string& key = spec.idempotency_key();
  if (key.size() > static_cast<size_t>(limits.max_idempotency_key_bytes)) {
    return Invalid("spec.idempotency_key", absl::StrCat(key.size(), " bytes, over the limit of ",
                                                        limits.max_idempotency_key_bytes));
  }
  for (char c : key) {
    if (c < 0x20 || c > 0x7e) {
      return Invalid("spec.idempotency_key", "contains a byte that is not printable ASCII");
    }
  }
  if (spec.hang_timeout_seconds() < 0 || spec.hang_timeout_seconds() > kMaxHangTimeoutSeconds) {
    return Invalid(
        "spec.hang_timeout_seconds",
        absl::StrCat(spec.hang_timeout_seconds(), " is outside 0..", kMaxHangTimeoutSeconds,
                     " (0: the default, ", kDefaultHangTimeoutSeconds, ")"));
  }
  if (!mesh::v1::HangPolicy_IsValid(spec.on_hang())) {
    return Invalid("spec.on_hang", absl::StrCat(static_cast<int>(spec.on_hang()),
                                                " is not a HangPolicy (RESTART or FAIL)"));
  }
  const int64_t memory = spec.memory_per_proc_bytes();
  if (memory != 0 && (memory < kMinMemoryPerProcBytes || memory > kMaxMemoryPerProcBytes)) {
    return Invalid("spec.memory_per_proc_bytes",
                   absl::StrCat(memory, " is outside 1 MiB (", kMinMemoryPerProcBytes,
                                ") .. 16 TiB (", kMaxMemoryPerProcBytes, "); 0: no limit"));
  }
  if (spec.max_pids() < 0 || spec.max_pids() > kMaxPidsLimit) {
    return Invalid("spec.max_pids", absl::StrCat(spec.max_pids(), " is outside 0..", kMaxPidsLimit,
                                                 " (0: no limit)"));
  }
  if (absl::Status status = ValidateGrow(spec); !status.ok()) return status;
  return ValidateRestartPolicy(spec);
}

}  // namespace

absl::Status ValidateJobSpecLimits(const JobSpecLimits& limits) {
  auto positive = [](absl::string_view field, int64_t value) {
    return value >= 1 ? absl::OkStatus() : Invalid(field, absl::StrCat(value, " is less than 1"));
  };
  for (absl::Status status :
       {positive("max_world_size", limits.max_world_size),
        positive("max_env_count", limits.max_env_count),
        positive("max_env_bytes", limits.max_env_bytes),
        positive("max_argv_count", limits.max_argv_count),
        positive("max_argv_bytes", limits.max_argv_bytes),
        limits.max_labels >= 0
            ? absl::OkStatus()
            : Invalid("max_labels", absl::StrCat(limits.max_labels, " is negative")),
        limits.max_idempotency_key_bytes >= 0
            ? absl::OkStatus()
            : Invalid("max_idempotency_key_bytes",
                      absl::StrCat(limits.max_idempotency_key_bytes, " is negative"))}) {
    if (!status.ok()) return status;
  }
  if (absl::Status s = CheckAllowedJobEnv(limits.allowed_job_env); !s.ok()) {
    return Invalid("allowed_job_env", s.message());
  }
  if (HasNul(limits.working_dir_root) || !NormalizeAbsolutePath(limits.working_dir_root).ok()) {
    return Invalid("working_dir_root",
                   absl::StrCat(Quote(limits.working_dir_root), " is not an absolute path"));
  }
  return absl::OkStatus();
}

absl::Status ValidateJobSpec(const JobSpec& spec, const JobSpecLimits& limits) {
  // In field-number order, so the first bad field is reported.
  for (absl::Status status :
       {ValidateName(spec), ValidateLabels(spec, limits), ValidateCommand(spec, limits),
        ValidateEnv(spec, limits), ValidateWorkingDir(spec, limits), ValidateSize(spec, limits)}) {
    if (!status.ok()) return status;
  }
  // The mesh rules divide by the sizes, so they run only once those hold.
  if (absl::Status status = ValidateMesh(spec); !status.ok()) return status;
  return ValidateRest(spec, limits);
}

void NormalizeJobSpec(const JobSpecLimits& limits, JobSpec& spec) {
  const absl::Status valid = ValidateJobSpec(spec, limits);
  MESH_CHECK(valid.ok(), "NormalizeJobSpec of a spec that ValidateJobSpec rejects");
  if (spec.nodes().max() == 0) spec.mutable_nodes()->set_max(spec.nodes().min());
  if (spec.mesh_shape().empty()) spec.add_mesh_shape(-1);
  if (spec.mesh_dim_names().empty()) {
    if (spec.mesh_shape_size() == 1) {
      spec.add_mesh_dim_names("world");
    } else {
      for (int i = 0; i < spec.mesh_shape_size(); ++i) {
        spec.add_mesh_dim_names(absl::StrCat("dim", i));
      }
    }
  }
  if (!spec.working_dir().empty()) {
    spec.set_working_dir(NormalizeAbsolutePath(spec.working_dir()).value());
  }
  if (spec.hang_timeout_seconds() == 0) spec.set_hang_timeout_seconds(kDefaultHangTimeoutSeconds);
  if (spec.on_hang() == mesh::v1::HANG_POLICY_UNSPECIFIED) {
    spec.set_on_hang(mesh::v1::HANG_POLICY_RESTART);
  }
  if (spec.grow() == mesh::v1::GROW_POLICY_UNSPECIFIED) spec.set_grow(mesh::v1::GROW_POLICY_NEVER);
  if (spec.restart_policy() == mesh::v1::RESTART_POLICY_UNSPECIFIED) {
    spec.set_restart_policy(mesh::v1::RESTART_POLICY_GROUP);
  }
  if (spec.restart_policy() == mesh::v1::RESTART_POLICY_IN_PLACE && spec.in_place_dim().empty()) {
    spec.set_in_place_dim("dp");
  }
}

std::string RestartPolicyName(mesh::v1::RestartPolicy policy) {
  switch (policy) {
    case mesh::v1::RESTART_POLICY_UNSPECIFIED:
    case mesh::v1::RESTART_POLICY_GROUP:
      return "GROUP";
    case mesh::v1::RESTART_POLICY_IN_PLACE:
      return "IN_PLACE";
    default:
      return absl::StrCat("UNKNOWN(", static_cast<int>(policy), ")");
  }
}

std::string GrowPolicyName(mesh::v1::GrowPolicy policy) {
  switch (policy) {
    case mesh::v1::GROW_POLICY_UNSPECIFIED:
    case mesh::v1::GROW_POLICY_NEVER:
      return "NEVER";
    case mesh::v1::GROW_POLICY_ON_RESTART:
      return "ON_RESTART";
    case mesh::v1::GROW_POLICY_AFTER:
      return "AFTER";
    default:
      return absl::StrCat("UNKNOWN(", static_cast<int>(policy), ")");
  }
}

absl::Duration HangTimeout(const JobSpec& spec) {
  return absl::Seconds(spec.hang_timeout_seconds() > 0 ? spec.hang_timeout_seconds()
                                                       : kDefaultHangTimeoutSeconds);
}

absl::StatusOr<std::vector<int64_t>> ResolveMeshShape(const JobSpec& spec, int num_nodes) {
  const int min = spec.nodes().min();
  const int max = MaxNodes(spec);
  if (num_nodes < min || num_nodes > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("job needs ", min, "..", max, " nodes, not ", num_nodes));
  }
  const int64_t world = int64_t{num_nodes} * spec.nproc_per_node();
  std::vector<int64_t> shape(spec.mesh_shape().begin(), spec.mesh_shape().end());
  if (shape.empty()) shape.push_back(-1);
  int64_t fixed = 1;
  for (int64_t dim : shape) {
    if (dim != -1) fixed *= dim;
  }
  for (int64_t& dim : shape) {
    if (dim == -1) dim = fixed > 0 ? world / fixed : 0;
  }
  const int64_t product =
      std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
  if (product != world) {
    return absl::InvalidArgumentError(absl::StrCat("mesh_shape [",
                                                   absl::StrJoin(spec.mesh_shape(), ", "),
                                                   "] does not fit a world of ", world));
  }
  return shape;
}

absl::StatusOr<std::string> NormalizeAbsolutePath(absl::string_view path) {
  if (!absl::StartsWith(path, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(Quote(path), " is not absolute"));
  }
  std::vector<absl::string_view> parts;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  return absl::StrCat("/", absl::StrJoin(parts, "/"));
}

std::string EnvNameProblem(absl::string_view name, const std::set<std::string>& allowed) {
  return WorkerEnvNameProblem(name, allowed);
}

}  // namespace mesh::coordinator
