#include "cli/job_spec_file.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/job_json.h"
#include "common/worker_env_policy.h"

namespace mesh::cli {
namespace {

using mesh::v1::JobSpec;

// Errors in a file carry the position of the offending value.
class FileErrors {
 public:
  explicit FileErrors(absl::string_view source) : source_(source) {}

  absl::Status At(const YAML::Mark& mark, absl::string_view key, absl::string_view message) const {
    std::string where(source_);
    if (!mark.is_null()) absl::StrAppend(&where, ":", mark.line + 1, ":", mark.column + 1);
    if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", message));
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", key, ": ", message));
  }

 private:
  std::string source_;
};

// What a node holds, for messages: `got a list`.
std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing (null)";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      return absl::StrCat("\"", node.Scalar(), "\"");
    default:
      return "an undefined value";
  }
}

absl::StatusOr<std::string> String(const FileErrors& errors, const std::string& key,
                                   const YAML::Node& node) {
  if (!node.IsScalar()) {
    return errors.At(node.Mark(), key, absl::StrCat("expected a string, got ", Describe(node)));
  }
  return node.Scalar();
}

template <typename Int>
absl::StatusOr<Int> Integer(const FileErrors& errors, const std::string& key,
                            const YAML::Node& node) {
  Int value = 0;
  if (!node.IsScalar() || !absl::SimpleAtoi(node.Scalar(), &value)) {
    return errors.At(node.Mark(), key, absl::StrCat("expected an integer, got ", Describe(node)));
  }
  return value;
}

absl::StatusOr<std::vector<std::string>> StringList(const FileErrors& errors,
                                                    const std::string& key,
                                                    const YAML::Node& node) {
  if (!node.IsSequence()) {
    return errors.At(node.Mark(), key,
                     absl::StrCat("expected a list of strings, got ", Describe(node)));
  }
  std::vector<std::string> items;
  for (size_t i = 0; i < node.size(); ++i) {
    auto item = String(errors, absl::StrCat(key, "[", i, "]"), node[i]);
    if (!item.ok()) return item.status();
    items.push_back(*std::move(item));
  }
  return items;
}

absl::Status StringMap(const FileErrors& errors, const std::string& key, const YAML::Node& node,
                       google::protobuf::Map<std::string, std::string>& out) {
  if (!node.IsMap()) {
    return errors.At(node.Mark(), key, absl::StrCat("expected a mapping, got ", Describe(node)));
  }
  for (const auto& entry : node) {
    if (!entry.first.IsScalar()) {
      return errors.At(entry.first.Mark(), key, "keys must be strings");
    }
    const std::string name = entry.first.Scalar();
    const std::string path = absl::StrCat(key, "[\"", name, "\"]");
    if (out.contains(name)) return errors.At(entry.first.Mark(), path, "duplicate key");
    // An empty value's own mark points past it; the key's is where to look.
    if (entry.second.IsNull()) {
      return errors.At(entry.first.Mark(), path, "expected a string, got nothing (null)");
    }
    auto value = String(errors, path, entry.second);
    if (!value.ok()) return value.status();
    out[name] = *std::move(value);
  }
  return absl::OkStatus();
}

absl::Status ParseField(const FileErrors& errors, const std::string& key, const YAML::Node& value,
                        JobSpec& spec) {
  auto assign_int32 = [&](void (JobSpec::*setter)(int32_t)) -> absl::Status {
    auto parsed = Integer<int32_t>(errors, key, value);
    if (!parsed.ok()) return parsed.status();
    (spec.*setter)(*parsed);
    return absl::OkStatus();
  };
  auto assign_string = [&](void (JobSpec::*setter)(const std::string&)) -> absl::Status {
    auto parsed = String(errors, key, value);
    if (!parsed.ok()) return parsed.status();
    (spec.*setter)(*parsed);
    return absl::OkStatus();
  };

  if (key == "name") return assign_string(&JobSpec::set_name);
  if (key == "working_dir") return assign_string(&JobSpec::set_working_dir);
  if (key == "idempotency_key") return assign_string(&JobSpec::set_idempotency_key);
  if (key == "nproc_per_node") return assign_int32(&JobSpec::set_nproc_per_node);
  if (key == "gpus_per_proc") return assign_int32(&JobSpec::set_gpus_per_proc);
  if (key == "max_restarts") return assign_int32(&JobSpec::set_max_restarts);
  if (key == "labels") return StringMap(errors, key, value, *spec.mutable_labels());
  if (key == "env") return StringMap(errors, key, value, *spec.mutable_env());
  if (key == "command") {
    if (value.IsScalar()) {
      return errors.At(value.Mark(), key,
                       "expected a list of strings (argv, run without a shell), e.g. "
                       "[python, train.py], got a string");
    }
    auto argv = StringList(errors, key, value);
    if (!argv.ok()) return argv.status();
    for (auto& arg : *argv) spec.add_command(std::move(arg));
    return absl::OkStatus();
  }
  if (key == "mesh_dim_names") {
    auto names = StringList(errors, key, value);
    if (!names.ok()) return names.status();
    for (auto& name : *names) spec.add_mesh_dim_names(std::move(name));
    return absl::OkStatus();
  }
  if (key == "mesh_shape") {
    if (!value.IsSequence()) {
      return errors.At(
          value.Mark(), key,
          absl::StrCat("expected a list of integers, e.g. [2, 2], got ", Describe(value)));
    }
    for (size_t i = 0; i < value.size(); ++i) {
      auto size = Integer<int64_t>(errors, absl::StrCat(key, "[", i, "]"), value[i]);
      if (!size.ok()) return size.status();
      spec.add_mesh_shape(*size);
    }
    return absl::OkStatus();
  }
  if (key == "nodes") {
    if (value.IsMap()) {
      for (const auto& entry : value) {
        const std::string sub = entry.first.IsScalar() ? entry.first.Scalar() : "";
        if (sub != "min" && sub != "max") {
          return errors.At(entry.first.Mark(), key,
                           absl::StrCat("unknown key \"", sub, "\"; expected min and max"));
        }
        auto count = Integer<int32_t>(errors, absl::StrCat(key, ".", sub), entry.second);
        if (!count.ok()) return count.status();
        if (sub == "min") spec.mutable_nodes()->set_min(*count);
        if (sub == "max") spec.mutable_nodes()->set_max(*count);
      }
      return absl::OkStatus();
    }
    if (!value.IsScalar()) {
      return errors.At(value.Mark(), key,
                       absl::StrCat("expected N or \"MIN:MAX\", got ", Describe(value)));
    }
    auto count = ParseNodeCount(value.Scalar());
    if (!count.ok()) return errors.At(value.Mark(), key, count.status().message());
    *spec.mutable_nodes() = *count;
    return absl::OkStatus();
  }
  if (key == "hang_timeout") {
    if (!value.IsScalar()) {
      return errors.At(
          value.Mark(), key,
          absl::StrCat("expected a duration such as \"5m\" or seconds, got ", Describe(value)));
    }
    auto seconds = ParseDurationSeconds(value.Scalar());
    if (!seconds.ok()) return errors.At(value.Mark(), key, seconds.status().message());
    if (*seconds == 0) return errors.At(value.Mark(), key, "must be positive, e.g. 5m");
    spec.set_hang_timeout_seconds(*seconds);
    return absl::OkStatus();
  }
  if (key == "memory_per_proc") {
    if (!value.IsScalar()) {
      return errors.At(value.Mark(), key,
                       absl::StrCat("expected a size such as \"8GiB\", got ", Describe(value)));
    }
    auto bytes = ParseByteSize(value.Scalar());
    if (!bytes.ok()) return errors.At(value.Mark(), key, bytes.status().message());
    spec.set_memory_per_proc_bytes(*bytes);
    return absl::OkStatus();
  }
  if (key == "max_pids") {
    int64_t count = 0;
    if (!value.IsScalar() || !absl::SimpleAtoi(value.Scalar(), &count)) {
      return errors.At(value.Mark(), key,
                       absl::StrCat("expected a number of processes, got ", Describe(value)));
    }
    spec.set_max_pids(count);
    return absl::OkStatus();
  }
  if (key == "grow") {
    // `grow: never`, `grow: on_restart`, or the map `grow: {after: 10m}`.
    if (value.IsMap() && value.size() == 1 && value.begin()->first.IsScalar() &&
        value.begin()->first.Scalar() == "after" && value.begin()->second.IsScalar()) {
      absl::Status parsed = ParseGrow(absl::StrCat("after ", value.begin()->second.Scalar()), spec);
      if (!parsed.ok()) return errors.At(value.Mark(), key, parsed.message());
      return absl::OkStatus();
    }
    if (!value.IsScalar()) {
      return errors.At(
          value.Mark(), key,
          absl::StrCat("expected never, on_restart or {after: 10m}, got ", Describe(value)));
    }
    absl::Status parsed = ParseGrow(value.Scalar(), spec);
    if (!parsed.ok()) return errors.At(value.Mark(), key, parsed.message());
    return absl::OkStatus();
  }
  if (key == "restart_policy") {
    auto text = String(errors, key, value);
    if (!text.ok()) return text.status();
    auto policy = ParseRestartPolicy(*text);
    if (!policy.ok()) return errors.At(value.Mark(), key, policy.status().message());
    spec.set_restart_policy(*policy);
    return absl::OkStatus();
  }
  if (key == "in_place_dim") {
    auto dim = String(errors, key, value);
    if (!dim.ok()) return dim.status();
    if (absl::Status checked = CheckInPlaceDim(*dim); !checked.ok()) {
      return errors.At(value.Mark(), key, checked.message());
    }
    spec.set_in_place_dim(*std::move(dim));
    return absl::OkStatus();
  }
  if (key == "on_hang") {
    auto text = String(errors, key, value);
    if (!text.ok()) return text.status();
    auto policy = ParseHangPolicy(*text);
    if (!policy.ok()) return errors.At(value.Mark(), key, policy.status().message());
    spec.set_on_hang(*policy);
    return absl::OkStatus();
  }
  if (key == "deadline") {
    if (!value.IsScalar()) {
      return errors.At(value.Mark(), key,
                       absl::StrCat("expected a duration such as \"90s\", \"10m\" or seconds, got ",
                                    Describe(value)));
    }
    auto seconds = ParseDurationSeconds(value.Scalar());
    if (!seconds.ok()) return errors.At(value.Mark(), key, seconds.status().message());
    spec.set_deadline_seconds(*seconds);
    return absl::OkStatus();
  }
  return absl::NotFoundError("unknown key");  // Caller reports it with the key's mark.
}

constexpr const char* kKnownKeys[] = {
    "name",
    "labels",
    "command",
    "env",
    "working_dir",
    "nodes",
    "nproc_per_node",
    "gpus_per_proc",
    "mesh_shape",
    "mesh_dim_names",
    "max_restarts",
    "deadline",
    "idempotency_key",
    "hang_timeout",
    "on_hang",
    "grow",
    "restart_policy",
    "in_place_dim",
    "memory_per_proc",
    "max_pids",
};

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view text, absl::string_view source) {
  const FileErrors errors(source);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return errors.At(e.mark, "", absl::StrCat("not valid YAML or JSON: ", e.msg));
  }
  if (!root.IsMap()) {
    return errors.At(root.Mark(), "",
                     absl::StrCat("expected a mapping of job fields (name, command, nodes, ...), "
                                  "got ",
                                  Describe(root)));
  }
  JobSpec spec;
  std::set<std::string> seen;
  try {
    for (const auto& entry : root) {
      if (!entry.first.IsScalar()) {
        return errors.At(entry.first.Mark(), "", "keys must be strings");
      }
      const std::string key = entry.first.Scalar();
      if (!seen.insert(key).second) return errors.At(entry.first.Mark(), key, "duplicate key");
      if (entry.second.IsNull()) {
        return errors.At(entry.first.Mark(), key, "no value given (null)");
      }
      absl::Status status = ParseField(errors, key, entry.second, spec);
      if (absl::IsNotFound(status)) {
        return errors.At(entry.first.Mark(), "",
                         absl::StrCat("unknown key \"", key,
                                      "\"; known keys: ", absl::StrJoin(kKnownKeys, ", ")));
      }
      if (!status.ok()) return status;
    }
  } catch (const YAML::Exception& e) {
    return errors.At(e.mark, "", e.msg);
  }
  return spec;
}

absl::StatusOr<JobSpec> ReadJobSpecFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("cannot read job spec file ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << file.rdbuf();
  return ParseJobSpec(text.str(), path);
}

absl::Status ParseGrow(absl::string_view text, mesh::v1::JobSpec& spec) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "never" || lower == "on_restart") {
    spec.set_grow(lower == "never" ? mesh::v1::GROW_POLICY_NEVER
                                   : mesh::v1::GROW_POLICY_ON_RESTART);
    spec.clear_grow_after_seconds();
    return absl::OkStatus();
  }
  absl::string_view delay = lower;
  if (absl::ConsumePrefix(&delay, "after")) {
    delay = absl::StripLeadingAsciiWhitespace(delay);
    if (!absl::ConsumePrefix(&delay, ":")) (void)absl::ConsumePrefix(&delay, "=");
    absl::StatusOr<int64_t> seconds = ParseDurationSeconds(absl::StripAsciiWhitespace(delay));
    if (!seconds.ok() || *seconds <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", text, "': after needs a positive delay, e.g. after:10m"));
    }
    spec.set_grow(mesh::v1::GROW_POLICY_AFTER);
    spec.set_grow_after_seconds(*seconds);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not a grow policy: never, on_restart or after:DURATION"));
}

absl::StatusOr<mesh::v1::RestartPolicy> ParseRestartPolicy(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "group") return mesh::v1::RESTART_POLICY_GROUP;
  if (lower == "in_place" || lower == "in-place") return mesh::v1::RESTART_POLICY_IN_PLACE;
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not a restart policy: group or in_place"));
}

absl::Status CheckInPlaceDim(absl::string_view dim) {
  if (absl::StripAsciiWhitespace(dim).empty()) {
    return absl::InvalidArgumentError(
        "expected the name of a mesh dimension, e.g. dp, got an empty string");
  }
  return absl::OkStatus();
}

absl::StatusOr<mesh::v1::NodeCount> ParseNodeCount(absl::string_view text) {
  const std::string trimmed(absl::StripAsciiWhitespace(text));
  std::vector<std::string> parts = absl::StrSplit(trimmed, ':');
  mesh::v1::NodeCount count;
  int32_t min = 0, max = 0;
  if (parts.size() == 1 && absl::SimpleAtoi(parts[0], &min)) {
    count.set_min(min);
    count.set_max(min);
    return count;
  }
  if (parts.size() == 2 && absl::SimpleAtoi(parts[0], &min) && absl::SimpleAtoi(parts[1], &max)) {
    count.set_min(min);
    count.set_max(max);
    return count;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected N or \"MIN:MAX\" (e.g. 2 or 1:4), got \"", text, "\""));
}

absl::StatusOr<absl::Duration> ParseWaitDuration(absl::string_view text) {
  const std::string trimmed(absl::StripAsciiWhitespace(text));
  absl::Duration duration;
  double seconds = 0;
  if (absl::SimpleAtod(trimmed, &seconds) && std::isfinite(seconds)) {
    duration = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(trimmed, &duration) || duration == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a duration such as \"90s\", \"10m\", \"1h30m\" or seconds, got \"", text, "\""));
  }
  if (duration < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("must not be negative, got \"", text, "\""));
  }
  return duration;
}

absl::StatusOr<int64_t> ParseDurationSeconds(absl::string_view text) {
  auto duration = ParseWaitDuration(text);
  if (!duration.ok()) return duration.status();
  return absl::ToInt64Seconds(absl::Ceil(*duration, absl::Seconds(1)));
}

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < trimmed.size() &&
         absl::ascii_isdigit(static_cast<unsigned char>(trimmed[digits]))) {
    ++digits;
  }
  // "8 GiB" as well as "8GiB".
  const std::string unit =
      absl::AsciiStrToLower(absl::StripLeadingAsciiWhitespace(trimmed.substr(digits)));
  int shift = -1;
  if (unit.empty() || unit == "b") shift = 0;
  if (unit == "k" || unit == "kib") shift = 10;
  if (unit == "m" || unit == "mib") shift = 20;
  if (unit == "g" || unit == "gib") shift = 30;
  if (unit == "t" || unit == "tib") shift = 40;
  int64_t count = 0;
  if (digits > 0 && shift >= 0 && absl::SimpleAtoi(trimmed.substr(0, digits), &count) &&
      count <= (std::numeric_limits<int64_t>::max() >> shift)) {
    return count << shift;
  }
  std::string hint;
  if (unit == "kb" || unit == "mb" || unit == "gb" || unit == "tb") {
    // 8GB means 8×10⁹ to some and 8×2³⁰ to others: refuse to guess.
    hint = absl::StrCat(" (", trimmed.substr(digits), " is ambiguous: write ",
                        absl::AsciiStrToUpper(unit.substr(0, 1)), "iB for binary units)");
  } else if (digits > 0 && !unit.empty() && unit[0] == '.') {
    hint = " (whole numbers only: 1536MiB, not 1.5GiB)";
  } else if (digits > 0 && shift >= 0) {
    hint = " (too large)";
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "expected a size such as 512MiB, 8GiB or a number of bytes (units B, KiB, MiB, GiB, TiB "
      "or K, M, G, T; binary), got \"",
      text, "\"", hint));
}

absl::StatusOr<std::vector<int64_t>> ParseMeshShape(absl::string_view text) {
  std::vector<int64_t> shape;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t size = 0;
    if (!absl::SimpleAtoi(part, &size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected comma-separated integers such as 2,2 or 2,-1, got \"", text, "\""));
    }
    shape.push_back(size);
  }
  return shape;
}

absl::StatusOr<std::pair<std::string, std::string>> ParseKeyValue(absl::string_view text) {
  const size_t eq = text.find('=');
  if (eq == absl::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat("expected KEY=VALUE, got \"", text, "\""));
  }
  return std::make_pair(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
}

absl::Status CheckEnvNames(const JobSpec& spec) {
  // Byte order, as the coordinator reports the first bad key.
  std::map<std::string, std::string> sorted(spec.env().begin(), spec.env().end());
  for (const auto& [name, value] : sorted) {
    // Denied names go to the coordinator, whose operator may allow them.
    if (IsDeniedEnvName(name)) continue;
    const std::string problem = WorkerEnvNameProblem(name);
    if (!problem.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("env[\"", name, "\"]: ", problem));
    }
  }
  return absl::OkStatus();
}

}  // namespace mesh::cli
