// RankRelay: the agent's WorkerService for the ranks it launched, on a Unix
// domain socket (MESH_AGENT_SOCKET), in front of the coordinator's.
//
// Why. A rank's rendezvous calls (Join, barriers, the unique-ID fetch) and
// its liveness calls (Heartbeat, WatchJob) cost the coordinator one call, or
// one open stream, per rank. Through the relay they cost it one per node:
//
//   Join          the node's Joins of one (job, generation) go up as one
//                 JoinBatch; each rank gets its own reply.
//   Barrier       the node's arrivals at one barrier go up as one
//                 BarrierBatch.
//   GetUniqueIds  one fetch per (job, generation, keys); IDs are immutable
//                 once published, so later callers are answered from the
//                 node's copy.
//   Heartbeat     answered at once from the node's latest view; the latest
//                 heartbeat of each process (with its collective progress)
//                 goes up in one HeartbeatBatch per flush.
//   WatchJob      one upstream watch per (job, generation), whose events
//                 of the generation every local watcher gets.
//   the rest      (KV, DescribeRanks, PublishUniqueIds, ReportError, Leave,
//                 AliveRanks) forwarded one to one.
//
// Batching. Join and barrier arrivals wait at most `batch_window` for the
// node's other ranks, and go up at once when every local rank the call
// concerns has arrived; so a rank that never arrives delays the others by
// one window and the coordinator's diagnostics (the ranks missing from a
// Join or a barrier) name exactly the ranks that did not call. Heartbeats go
// up every flush interval (half the generation's heartbeat interval, at
// most half of what the timeout leaves after an interval, at least 50 ms);
// a rank that stops heartbeating is no longer sent, so the
// coordinator declares it dead as it would without the relay, at most one
// flush interval later. A Heartbeat answered by the relay carries the
// coordinator's latest answer for that process (its generation's error,
// send_members); while the node's last flush failed, it gets that failure
// (UNAVAILABLE, say), so a rank cut off from the coordinator notices as it
// would on its own.
//
// New processes of a rank (in-place recovery, coordinator/coordination.h).
// Once a generation's world has formed, a rank may be lost and a new
// process (another incarnation) may join as it through the same relay.
// Its Join goes up at once, alone (the node's other ranks joined long
// ago). What the relay keeps per process (the pending heartbeat, the
// coordinator's latest answer to it) is keyed by rank and incarnation, so
// the new process never gets the answer meant for the one it replaces (a
// refusal: lost, fenced out). An answer that speaks for one process only
// reaches only it: when the unique-ID fetch made in a lost process's name
// is refused (ABORTED), the other waiters fetch again in their own names;
// an ERROR naming the process the shared WatchJob stream was opened for,
// or an ABORTED end of it, ends that process's watchers, and the stream is
// opened again for the others; and the watch of a process whose heartbeat
// the coordinator refused ends with that refusal. The old process's other
// calls end as the coordinator answers them: it is fenced out.
//
// Authorisation. The socket is created mode 0666 in a directory only the
// agent can write, so no other process can stand in for it. Every call
// must name a job with a generation registered here (AddGeneration, which
// the agent calls before launching the ranks) and, where the job has a
// worker token, carry it ("authorization: Bearer <token>"): PERMISSION_DENIED
// and UNAUTHENTICATED otherwise, without a call to the coordinator. The
// coordinator checks the token again.
//
// Errors. Every reply is the coordinator's, per rank, with the codes of
// protos/mesh/v1/worker.proto; a coordinator that cannot be reached gives
// UNAVAILABLE, as it would to a rank calling it directly. The batch RPCs
// themselves are not served here (UNIMPLEMENTED).
//
// Replicas. With several coordinator addresses, calls go to one replica and
// move to the next after an UNAVAILABLE reply, as libmesh's own client does.
//
// Thread safety: thread-safe. Ownership: the relay owns its server, its
// channels and one flusher thread. Its parts: agent/rank_relay_internal.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "common/security.h"

namespace mesh::agent {

struct RankRelayOptions {
  // Where to listen; an existing socket file there is replaced. At most 107
  // bytes (sockaddr_un).
  std::string socket_path;
  // The coordinator: host:port, or a comma-separated list of replicas.
  std::string coordinator;
  // TLS to the coordinator (the token, the agent's own, is not used: each
  // call carries the worker token of its job).
  security::ClientSecurity security;
  // How long a Join or barrier arrival waits for the node's other ranks.
  absl::Duration batch_window = absl::Milliseconds(20);
  // The heartbeat flush interval before a generation's heartbeat interval is
  // known (from its Join replies).
  absl::Duration default_heartbeat_flush = absl::Milliseconds(250);
  // Counted with RankRelayStats.served and upstream_calls when not null
  // (the agent's mesh_agent_relay_*_calls_total); borrowed, must outlive
  // the relay.
  metrics::Counter* rank_calls = nullptr;
  metrics::Counter* coordinator_calls = nullptr;
};

// Calls the relay made to the coordinator and calls it served, for tests and
// the agent's metrics.
struct RankRelayStats {
  int64_t served = 0;          // calls from ranks
  int64_t upstream_calls = 0;  // calls to the coordinator (streams included)
  int64_t join_batches = 0;
  int64_t barrier_batches = 0;
  int64_t heartbeat_batches = 0;
  int64_t unique_id_fetches = 0;
  int64_t watches = 0;  // upstream WatchJob streams opened
};

class RankRelay {
 public:
  // Listens on options.socket_path and returns.
  // Errors: INVALID_ARGUMENT (empty or over-long path, no coordinator),
  // those of security::MakeChannel, UNAVAILABLE when gRPC cannot listen.
  static absl::StatusOr<std::unique_ptr<RankRelay>> Start(RankRelayOptions options);

  virtual ~RankRelay() = default;

  // "unix:<socket_path>", the target a worker dials.
  virtual std::string target() const = 0;
  virtual const std::string& socket_path() const = 0;

  // The ranks of (job, generation) that run on this node, and the worker
  // token their calls carry ("" when the cluster has no auth). Call before
  // launching them. Registering a generation again replaces its ranks and
  // keeps the rest of its state; a new process of one of its ranks
  // (in-place recovery) needs no new registration.
  virtual void AddGeneration(const std::string& job_id, int64_t generation,
                             std::vector<int> local_ranks, std::string worker_token) = 0;
  // Forgets (job, generation): calls naming it are refused from now on, and
  // its pending batches and watches end with ABORTED. Idempotent.
  virtual void RemoveGeneration(const std::string& job_id, int64_t generation) = 0;

  virtual RankRelayStats stats() const = 0;

  // Ends every call (UNAVAILABLE), stops listening, removes the socket file
  // and joins the flusher. Idempotent; the destructor calls it.
  virtual void Shutdown() = 0;
};

}  // namespace mesh::agent
