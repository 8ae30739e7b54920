// Fuzz target: the job-spec parsers and validator.
//
// Every input is tried two ways:
//   (a) as the text of a job spec file (YAML or JSON), through
//       cli::ParseJobSpec, and each line through the flag-value parsers
//       (ParseNodeCount, ParseDurationSeconds, ParseMeshShape, ...);
//   (b) as a serialized mesh.v1.JobSpec, through ValidateJobSpec.
// A spec that either way yields is then validated; one that validates must
// normalize, validate again, normalize to itself (idempotence), and resolve
// a mesh shape whose product is the world for every node count it allows.
//
// Invariants: no crash or sanitizer report; the above.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <string>

#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/util/message_differencer.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "cli/job_spec_file.h"
#include "coordinator/job_spec.h"
#include "mesh/v1/job.pb.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using mesh::coordinator::JobSpecLimits;
using mesh::v1::JobSpec;

// Small caps so that inputs of a few hundred bytes reach every limit.
const JobSpecLimits& Limits() {
  static const JobSpecLimits* limits = [] {
    auto* l = new JobSpecLimits;
    l->max_world_size = 64;
    l->max_env_count = 4;
    l->max_env_bytes = 64;
    l->max_argv_count = 4;
    l->max_argv_bytes = 64;
    l->max_labels = 4;
    l->max_idempotency_key_bytes = 16;
    l->working_dir_root = "/data";
    FUZZ_CHECK(mesh::coordinator::ValidateJobSpecLimits(*l).ok(), "bad test limits");
    return l;
  }();
  return *limits;
}

void CheckSpec(const JobSpec& spec) {
  const absl::Status valid = mesh::coordinator::ValidateJobSpec(spec, Limits());
  if (!valid.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(valid), valid.ToString());
    FUZZ_CHECK(absl::StartsWith(valid.message(), "spec."), valid.ToString());
    return;
  }
  JobSpec normalized = spec;
  mesh::coordinator::NormalizeJobSpec(Limits(), normalized);
  const absl::Status again = mesh::coordinator::ValidateJobSpec(normalized, Limits());
  FUZZ_CHECK(again.ok(), absl::StrCat("normalized spec fails validation: ", again.ToString(), "\n",
                                      normalized.ShortDebugString()));
  JobSpec twice = normalized;
  mesh::coordinator::NormalizeJobSpec(Limits(), twice);
  FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(normalized, twice),
             absl::StrCat("NormalizeJobSpec is not idempotent:\n", normalized.ShortDebugString(),
                          "\n", twice.ShortDebugString()));

  // Every node count the spec allows resolves to a mesh over the whole world
  // (or is refused with INVALID_ARGUMENT); one outside the range is refused.
  const int min = normalized.nodes().min();
  const int max = normalized.nodes().max();
  FUZZ_CHECK(min >= 1 && max >= min, normalized.ShortDebugString());
  for (int nodes = min; nodes <= max && nodes < min + 8; ++nodes) {
    auto shape = mesh::coordinator::ResolveMeshShape(normalized, nodes);
    if (!shape.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(shape.status()), shape.status().ToString());
      continue;
    }
    FUZZ_CHECK(shape->size() == static_cast<size_t>(normalized.mesh_dim_names_size()),
               "mesh shape and names differ in length");
    int64_t product = 1;
    for (int64_t dim : *shape) {
      FUZZ_CHECK(dim >= 1, absl::StrCat("resolved mesh dim ", dim));
      product *= dim;
    }
    FUZZ_CHECK(product == int64_t{nodes} * normalized.nproc_per_node(),
               absl::StrCat("mesh product ", product, " for ", nodes, " nodes"));
  }
  FUZZ_CHECK(!mesh::coordinator::ResolveMeshShape(normalized, min - 1).ok(), "below min");
  if (max < std::numeric_limits<int>::max()) {
    FUZZ_CHECK(!mesh::coordinator::ResolveMeshShape(normalized, max + 1).ok(), "above max");
  }
}

void CheckFlagParsers(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, absl::MaxSplits('\n', 8))) {
    (void)mesh::cli::ParseNodeCount(line);
    auto seconds = mesh::cli::ParseDurationSeconds(line);
    if (seconds.ok()) FUZZ_CHECK(*seconds >= 0, absl::StrCat("negative duration ", *seconds));
    (void)mesh::cli::ParseWaitDuration(line);
    (void)mesh::cli::ParseMeshShape(line);
    auto kv = mesh::cli::ParseKeyValue(line);
    if (kv.ok()) FUZZ_CHECK(!kv->first.empty(), "empty key accepted");
    (void)mesh::coordinator::EnvNameProblem(line);
    auto path = mesh::coordinator::NormalizeAbsolutePath(line);
    if (path.ok()) {
      FUZZ_CHECK(absl::StartsWith(*path, "/"), *path);
      auto again = mesh::coordinator::NormalizeAbsolutePath(*path);
      FUZZ_CHECK(again.ok() && *again == *path, "NormalizeAbsolutePath is not idempotent");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Beyond a few KiB nothing new is reached, only time spent.
  if (size > 8192) return 0;
  // Protobuf logs every string field that is not UTF-8; that is expected here.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);

  // (a) A spec file.
  auto parsed = mesh::cli::ParseJobSpec(text, "fuzz.yaml");
  if (parsed.ok()) {
    (void)mesh::cli::CheckEnvNames(*parsed);
    CheckSpec(*parsed);
  } else {
    FUZZ_CHECK(absl::StartsWith(parsed.status().message(), "fuzz.yaml:"),
               parsed.status().ToString());
  }
  CheckFlagParsers(text);

  // (b) A spec off the wire.
  JobSpec spec;
  if (spec.ParseFromArray(data, static_cast<int>(size))) CheckSpec(spec);
  return 0;
}
