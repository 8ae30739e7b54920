// Cluster queries for process-level tests: the small JobService /
// AdminService / WorkerService calls that tests against a real
// mesh-coordinator make again and again (get a job, count READY nodes, wait
// for a state, submit a shell job, create a bare job, join a rank), as free
// functions over a stub, so MeshCluster (tests/util/mesh_cluster.h), the
// fault-b FaultCluster and hand-rolled fixtures share one copy.
//
// Deadlines: every call has one; kRpcTimeout unless the function says
// otherwise, so a hung coordinator fails a test instead of hanging it.
//
// Errors: functions returning absl::Status / StatusOr pass the RPC's status
// through unchanged (common/grpc_status.h: same code and message), e.g.
// NOT_FOUND for an unknown job, UNAVAILABLE when the coordinator is down,
// DEADLINE_EXCEEDED when the deadline passed. The Wait* polls return bool
// and treat an RPC error as "not yet" (a restarting coordinator is a normal
// state in these tests); they give up after `timeout`. For a bounded poll of
// any condition, use WaitUntil (tests/util/proc.h).
//
// Thread safety: the functions are thread-safe as far as the stub is (gRPC
// stubs are); they keep no state.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/job.grpc.pb.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::testing {

// The deadline of a single query RPC.
inline constexpr absl::Duration kRpcTimeout = absl::Seconds(10);

// A client context whose deadline is `timeout` from now.
std::unique_ptr<grpc::ClientContext> ContextWithDeadline(absl::Duration timeout = kRpcTimeout);

// ---- Jobs -----------------------------------------------------------------

// GetJob. Errors: the RPC's (NOT_FOUND for an unknown id).
absl::StatusOr<mesh::v1::Job> GetJob(mesh::v1::JobService::Stub& jobs, const std::string& id);

// Every job, through every page of ListJobs (`page_size` per page). Errors:
// the failing page's; INTERNAL when the pages never end (bounded).
absl::StatusOr<std::vector<mesh::v1::Job>> ListAllJobs(mesh::v1::JobService::Stub& jobs,
                                                       int page_size = 37);

// SubmitJob; the job as acknowledged. Errors: the RPC's (INVALID_ARGUMENT
// for a bad spec).
absl::StatusOr<mesh::v1::Job> SubmitJob(mesh::v1::JobService::Stub& jobs,
                                        const mesh::v1::JobSpec& spec);

// Polls GetJob every 20 ms until the job is in `state` (true), or `timeout`
// has passed (false). RPC errors count as "not yet".
bool WaitForState(mesh::v1::JobService::Stub& jobs, const std::string& id, mesh::v1::JobState state,
                  absl::Duration timeout);

// WaitJob with a server-side `timeout` (and a client deadline 5 s later);
// the job in its terminal state. Errors: the RPC's (DEADLINE_EXCEEDED when
// the job was not terminal in time).
absl::StatusOr<mesh::v1::Job> WaitTerminal(mesh::v1::JobService::Stub& jobs, const std::string& id,
                                           absl::Duration timeout);

// A CPU job named "sh" that runs `script` with /bin/sh -c on at least
// `nodes` nodes x `nproc` ranks, with MARKER=<marker> in its environment (so
// that LiveProcessesWithEnv finds its workers) unless `marker` is empty.
mesh::v1::JobSpec ShellJobSpec(const std::string& script, int nodes, int nproc,
                               const std::string& marker);

// ---- Nodes ----------------------------------------------------------------

// ListNodes: every node, ordered by name. Errors: the RPC's.
absl::StatusOr<std::vector<mesh::v1::Node>> ListNodes(mesh::v1::JobService::Stub& jobs);

// How many listed nodes satisfy `predicate`. Errors: ListNodes'.
absl::StatusOr<int> CountNodes(mesh::v1::JobService::Stub& jobs,
                               const std::function<bool(const mesh::v1::Node&)>& predicate);

// Nodes in NODE_STATE_READY. Errors: ListNodes'. After a coordinator
// restart, recovered nodes count as READY before their agents are back:
// count nodes by last_seen_unix_ms for that.
absl::StatusOr<int> ReadyNodes(mesh::v1::JobService::Stub& jobs);

// The node called `name`. Errors: ListNodes'; NOT_FOUND when it is not
// listed.
absl::StatusOr<mesh::v1::Node> GetNode(mesh::v1::JobService::Stub& jobs, const std::string& name);

// Polls GetNode every 20 ms until the node is in `state` (true), or
// `timeout` has passed (false). RPC errors count as "not yet".
bool WaitForNodeState(mesh::v1::JobService::Stub& jobs, const std::string& name,
                      mesh::v1::NodeState state, absl::Duration timeout);

// ---- Ranks (AdminService / WorkerService) ---------------------------------

// AdminService.CreateJob: a bare job record `id` with `world_size` ranks,
// for tests whose ranks are RPC calls rather than workers. Errors: the
// RPC's (ALREADY_EXISTS for a live id).
absl::Status CreateBareJob(mesh::v1::AdminService::Stub& admin, const std::string& id,
                           int world_size);

// The RankContext of `rank` of `job`, with incarnation 100 + rank (unique
// per rank, stable across calls).
mesh::v1::RankContext RankOf(const std::string& job, int rank);

// WorkerService.Join from host "host-a" with a server-side `timeout` (and a
// client deadline 5 s later). Returns the RPC's status as is.
grpc::Status JoinRank(mesh::v1::WorkerService::Stub& workers, const mesh::v1::RankContext& rank,
                      absl::Duration timeout);

}  // namespace mesh::testing
