// JobSpec validation: the rules a submitted job must meet before anything is
// stored, and the defaults filled in afterwards. See docs/jobs.md.
//
// Every error is INVALID_ARGUMENT and starts with the path of the offending
// field, e.g.
//   spec.env["LD_PRELOAD"]: denied: makes the dynamic loader run code ...
//   spec.command[2]: contains a NUL byte
//   spec.nodes: min 4 is greater than max 2
// Caps (JobSpecLimits) give INVALID_ARGUMENT too, not RESOURCE_EXHAUSTED: a
// spec over a cap can never be accepted as it is, so retrying cannot help,
// whereas RESOURCE_EXHAUSTED in Mesh means a quota that depends on state
// (the KV store's bytes per generation) and may free up. The message names
// the cap and its value.
//
// Pure functions of their arguments: no filesystem access, no clock. The
// working directory is checked lexically only; the agent still resolves
// symlinks when it launches (a symlink under the root may point outside it).
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "mesh/v1/job.pb.h"

namespace mesh::coordinator {

// Caps on one spec. Flags of mesh-coordinator; each is inclusive: a spec at
// the limit passes, one over it fails.
struct JobSpecLimits {
  // max nodes × nproc_per_node.
  int64_t max_world_size = 1 << 20;
  // Entries in spec.env, and bytes of all names and values together.
  int max_env_count = 256;
  int64_t max_env_bytes = 64 << 10;
  // Elements of spec.command, and bytes of all of them together.
  int max_argv_count = 4096;
  int64_t max_argv_bytes = 256 << 10;
  // Entries in spec.labels.
  int max_labels = 64;
  // Bytes of spec.idempotency_key.
  int max_idempotency_key_bytes = 128;
  // spec.working_dir must be this directory or below it, after lexical
  // normalization. Absolute; "/" allows any absolute path.
  std::string working_dir_root = "/";
  // Names of spec.env that the operator lets jobs set although Mesh refuses
  // them by default (--allow-job-env; common/worker_env_policy.h). Only
  // denied names may be listed.
  std::set<std::string> allowed_job_env;
};

// Possible errors: INVALID_ARGUMENT naming the bad field of `limits`.
absl::Status ValidateJobSpecLimits(const JobSpecLimits& limits);

// Checks every rule of docs/jobs.md. A spec that passes can be normalized
// and scheduled. `spec` is not modified. Precondition:
// ValidateJobSpecLimits(limits) is OK (checked).
// Possible errors: INVALID_ARGUMENT, the message starting with the field's
// path. When several fields are bad, the first in field-number order is
// reported; within a map, the first key in byte order.
absl::Status ValidateJobSpec(const mesh::v1::JobSpec& spec, const JobSpecLimits& limits);

// Fills in the defaults of a valid spec, idempotently: nodes.max = nodes.min
// when 0; mesh_shape [-1] when empty; mesh_dim_names ["world"] for a 1-D
// mesh or ["dim0", "dim1", ...] when empty; working_dir in lexical normal
// form; grow NEVER when UNSPECIFIED. Precondition: ValidateJobSpec(spec, limits) is OK (programmer
// error otherwise; checked).
void NormalizeJobSpec(const JobSpecLimits& limits, mesh::v1::JobSpec& spec);

// JobSpec.hang_timeout_seconds: 0 means this default; at most the maximum.
inline constexpr int64_t kDefaultHangTimeoutSeconds = 300;
inline constexpr int64_t kMaxHangTimeoutSeconds = 7 * 24 * 3600;
// JobSpec.memory_per_proc_bytes: 0 (no limit) or 1 MiB .. 16 TiB.
inline constexpr int64_t kMinMemoryPerProcBytes = int64_t{1} << 20;
inline constexpr int64_t kMaxMemoryPerProcBytes = int64_t{16} << 40;
// JobSpec.max_pids: 0 (no limit) or 1 .. this, the kernel's ceiling for
// pid_max on 64-bit systems.
inline constexpr int64_t kMaxPidsLimit = 4194304;
// JobSpec.grow_after_seconds with GROW_POLICY_AFTER: 1 .. this (a week).
inline constexpr int64_t kMaxGrowAfterSeconds = 7 * 24 * 3600;
// "NEVER", "ON_RESTART", "AFTER" (UNSPECIFIED reads as NEVER, which it
// normalizes to); "UNKNOWN(n)" otherwise.
std::string GrowPolicyName(mesh::v1::GrowPolicy policy);

// "GROUP", "IN_PLACE" (UNSPECIFIED reads as GROUP, its default).
std::string RestartPolicyName(mesh::v1::RestartPolicy policy);
// The hang timeout in force for `spec` (the default for 0, which a spec
// stored before the field existed has).
absl::Duration HangTimeout(const mesh::v1::JobSpec& spec);

// The concrete mesh shape of a valid spec placed on `num_nodes` nodes: the
// -1 dimension, if any, becomes world / (product of the others).
// Possible errors: INVALID_ARGUMENT when num_nodes is outside
// [nodes.min, nodes.max] (nodes.max 0 meaning nodes.min).
absl::StatusOr<std::vector<int64_t>> ResolveMeshShape(const mesh::v1::JobSpec& spec, int num_nodes);

// `path` in lexical normal form: absolute, no "." or ".." components, no
// repeated or trailing '/'. ".." at the root stays at the root, as the
// kernel does. Errors: INVALID_ARGUMENT when `path` is not absolute.
absl::StatusOr<std::string> NormalizeAbsolutePath(absl::string_view path);

// Whether `name` may not appear in spec.env, and why ("" when it may):
// common/worker_env_policy.h's rule, which the agent applies again at launch.
// Exposed so meshctl can reject flags early with the same words.
std::string EnvNameProblem(absl::string_view name, const std::set<std::string>& allowed = {});

}  // namespace mesh::coordinator
