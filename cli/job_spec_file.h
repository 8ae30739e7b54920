// Job spec files for `meshctl submit -f job.yaml` (YAML or JSON; JSON is
// read by the same YAML 1.2 parser), and the value syntaxes shared with
// submit's flags (--nodes 1:4, --deadline 10m, --mesh-shape 2,-1).
//
// A file is one mapping; its keys (docs/cli.md):
//   name, labels {k: v}, command [argv...], env {K: V}, working_dir,
//   nodes (N | "MIN:MAX" | {min, max}), nproc_per_node, gpus_per_proc,
//   mesh_shape [..], mesh_dim_names [..], max_restarts,
//   deadline ("90s" | "10m" | seconds), idempotency_key,
//   hang_timeout (a duration, > 0), on_hang (restart | fail),
//   memory_per_proc (a size: "8GiB", ParseByteSize), max_pids (N),
//   grow (never | on_restart | {after: 10m}),
//   restart_policy (group | in_place), in_place_dim (a dimension name).
// Unknown keys are errors (a typo must not silently drop a setting). Only
// types and syntax are checked here; the coordinator's ValidateJobSpec stays
// the one authority on values, except env names, which are checked early
// with the same rule (common/worker_env_policy.h).
//
// Errors: INVALID_ARGUMENT whose message starts with "FILE:LINE:COLUMN: KEY:"
// (1-based), e.g. `job.yaml:4:7: nodes: expected N or "MIN:MAX", got "x"`;
// NOT_FOUND / PERMISSION_DENIED when the file cannot be read.
//
// Thread safety: pure functions (ReadJobSpecFile reads the file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "mesh/v1/job.pb.h"

namespace mesh::cli {

// Parses `text` (the contents of a file named `source`, used in messages).
absl::StatusOr<mesh::v1::JobSpec> ParseJobSpec(absl::string_view text, absl::string_view source);

// Reads and parses `path`.
absl::StatusOr<mesh::v1::JobSpec> ReadJobSpecFile(const std::string& path);

// "2" -> {2, 2}; "1:4" -> {1, 4}. Errors: INVALID_ARGUMENT (message without
// a field name: the caller adds it).
absl::StatusOr<mesh::v1::NodeCount> ParseNodeCount(absl::string_view text);

// "90s", "10m", "1h30m" (absl::ParseDuration units) or plain seconds "90",
// "2.5"; "0" is zero. Whole seconds, rounded up, >= 0.
// Errors: INVALID_ARGUMENT.
absl::StatusOr<int64_t> ParseDurationSeconds(absl::string_view text);

// spec.grow and spec.grow_after_seconds from "never", "on_restart",
// "after:10m" or "after 10m" (case-insensitive; docs/elastic.md).
// Errors: INVALID_ARGUMENT (without a field name: the caller adds it).
absl::Status ParseGrow(absl::string_view text, mesh::v1::JobSpec& spec);

// "group" or "in_place" (case-insensitive; "in-place" too) -> the
// RestartPolicy (docs/elastic.md). Errors: INVALID_ARGUMENT (without a
// field name: the caller adds it).
absl::StatusOr<mesh::v1::RestartPolicy> ParseRestartPolicy(absl::string_view text);

// An in_place_dim as given: any non-empty name (whether the mesh has it is
// the coordinator's to judge). Errors: INVALID_ARGUMENT for an empty one
// (without a field name: the caller adds it).
absl::Status CheckInPlaceDim(absl::string_view dim);

// "8GiB", "512MiB", "64M", "8 GiB", "1073741824": a whole number of bytes,
// with an optional binary unit B, KiB/K, MiB/M, GiB/G or TiB/T
// (case-insensitive; 1K = 1024). No fractions, no sign. KB/MB/GB/TB are
// refused as ambiguous (decimal or binary?).
// Errors: INVALID_ARGUMENT, naming the units and what was wrong.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

// The same syntax as a duration (wait --timeout).
absl::StatusOr<absl::Duration> ParseWaitDuration(absl::string_view text);

// "2,2" or "2,-1" -> {2, 2}. Errors: INVALID_ARGUMENT for a non-integer.
absl::StatusOr<std::vector<int64_t>> ParseMeshShape(absl::string_view text);

// "KEY=VALUE" -> {KEY, VALUE} (VALUE may contain '=' and be empty).
// Errors: INVALID_ARGUMENT without '=' or with an empty key.
absl::StatusOr<std::pair<std::string, std::string>> ParseKeyValue(absl::string_view text);

// Checks env names with the workers' rule (common/worker_env_policy.h), so
// a bad name fails before any RPC. Errors: INVALID_ARGUMENT
// `env["LD_PRELOAD"]: denied: ...`.
absl::Status CheckEnvNames(const mesh::v1::JobSpec& spec);

}  // namespace mesh::cli
