// Jobs, nodes and state events as JSON: THE stable schema of meshctl's
// `-o json` and `-o yaml` output (docs/cli.md documents every key). Tables
// are built from these values too, so what people read and what scripts
// parse never disagree.
//
// Conventions: enum values drop their prefix ("RUNNING", not
// "JOB_STATE_RUNNING"); times are RFC 3339 UTC strings with milliseconds
// ("2024-05-01T12:00:00.000Z"), null when the wire carries 0 (unknown); keys
// are never omitted, an absent value is null.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "mesh/v1/job.pb.h"

namespace mesh::cli {

// "RUNNING" for JOB_STATE_RUNNING; "UNSPECIFIED" for 0; the number for
// values this client does not know (a newer server).
std::string JobStateName(mesh::v1::JobState state);
// "READY" for NODE_STATE_READY, as JobStateName.
std::string NodeStateName(mesh::v1::NodeState state);
// Accepts "running", "RUNNING" or "JOB_STATE_RUNNING"; nullopt otherwise.
std::optional<mesh::v1::JobState> ParseJobState(absl::string_view text);

bool IsTerminal(mesh::v1::JobState state);

// "RESTART" for HANG_POLICY_RESTART; UNSPECIFIED (a server older than the
// field) reads as RESTART, what such a server does.
std::string HangPolicyName(mesh::v1::HangPolicy policy);
// Accepts "restart", "FAIL" or "HANG_POLICY_FAIL". Errors: INVALID_ARGUMENT
// (without a field name: the caller adds it).
absl::StatusOr<mesh::v1::HangPolicy> ParseHangPolicy(absl::string_view text);
// spec.grow as ParseGrow reads it: "never", "on_restart", "after 10m"
// (UNSPECIFIED, from a server older than the field, reads as never).
std::string GrowText(const mesh::v1::JobSpec& spec);
// A resize as JSON: time, generation, from_nodes, to_nodes, reason.
nlohmann::json ResizeToJson(const mesh::v1::JobResize& resize);
// spec.restart_policy as ParseRestartPolicy reads it: "group" or "in_place"
// (UNSPECIFIED, from a server older than the field, reads as group, what
// the coordinator makes of it); the number for a value this client does not
// know.
std::string RestartPolicyText(mesh::v1::RestartPolicy policy);
// "LOST" for KIND_LOST, "RETURNED" for KIND_RETURNED, as JobStateName.
std::string MembershipKindName(mesh::v1::MembershipChange::Kind kind);
// A membership change as JSON: epoch, time, rank, kind, incarnation (0 for
// LOST), reason ("" for RETURNED).
nlohmann::json MembershipChangeToJson(const mesh::v1::MembershipChange& change);
// The spec's hang timeout in seconds; 0 (unset, or a server older than the
// field) reads as the coordinator's default, 300.
int64_t HangTimeoutSeconds(const mesh::v1::JobSpec& spec);

// RFC 3339 UTC with milliseconds; null for 0.
nlohmann::json TimeToJson(int64_t unix_ms);

// "SIGKILL" for 9; "" for numbers this client has no name for.
std::string SignalName(int signal);

// One line naming the culprit: the server's RootCause.message when set,
// else composed, e.g. "rank 3 on node-b (10.0.0.7) killed by signal 9
// (SIGKILL) in generation 1", with ": killed by the kernel, out of memory"
// when oom_killed.
std::string RootCauseLine(const mesh::v1::RootCause& cause);

// The job object. `detail` adds "spec" (the full normalized spec) and
// "events" (describe); without it those keys are absent.
nlohmann::json JobToJson(const mesh::v1::Job& job, bool detail);
nlohmann::json JobSpecToJson(const mesh::v1::JobSpec& spec);
nlohmann::json EventToJson(const mesh::v1::JobStateEvent& event);
nlohmann::json RootCauseToJson(const mesh::v1::RootCause& cause);
nlohmann::json NodeToJson(const mesh::v1::Node& node);
// "8GiB", "512MiB", "1536KiB", "100B": the largest binary unit that divides
// `bytes`; what ParseByteSize reads back.
std::string FormatByteSize(int64_t bytes);
// A node's NodeIsolation as JSON (every field).
nlohmann::json IsolationToJson(const mesh::v1::NodeIsolation& isolation);
// The ISOLATION cell of `meshctl nodes`: "owner-uid,cgroup-v1" when workers
// run as their owners in a cgroup per job, "agent-uid,no-cgroup" when not,
// "-" for an agent that reports nothing.
std::string IsolationCell(const mesh::v1::NodeIsolation& isolation);

// "5s", "3m", "2h", "4d": how long ago `unix_ms` was at `now`; "-" for 0.
std::string Age(int64_t unix_ms, absl::Time now);

}  // namespace mesh::cli
