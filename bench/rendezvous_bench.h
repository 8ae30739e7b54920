// mesh-bench rendezvous: how long N simulated ranks take to get through the
// start of a job against a real coordinator on loopback, measured against a
// baseline of the same number of plain gRPC calls on the same server.
//
// Each simulated rank is a chain of asynchronous unary calls (gRPC's callback
// API: the next call starts from the previous call's completion), so N ranks
// cost N pending calls, not N threads. Ranks share a handful of channels,
// each its own TCP connection, as ranks on a handful of hosts would.
//
// One round, per rank:
//
//   Join ──▶ Barrier("bench", world) ──▶ [rank 0: PublishUniqueIds] ──▶ GetUniqueIds
//    │                                                                     │
//    rank 0's Join carries the world ncclUniqueId;                          every rank
//    every reply must carry it back                                        gets the group id
//
// Meanwhile every joined rank heartbeats at the interval its Join reply
// gave, as libmesh's Runtime does, against the coordinator's default
// timeouts: a heartbeat that finds the generation failed (a rank declared
// dead while all heartbeat on time) fails the round. After the round every
// rank leaves.
//
// The baseline round makes the same number of callers each do three
// sequential grpc.health.v1.Health/Check calls (a callback service that does
// no work) over the same channels. mesh/baseline is the coordinator's cost of
// rendezvous over the floor of moving that many calls through this gRPC build.
//
// The helpers in the first section are shared with waiters_bench.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/channel.h>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/latency_stats.h"
#include "coordinator/coordinator_server.h"

namespace mesh::bench {

// ---- Shared by the simulated-rank benchmarks ---------------------------------

// TLS for a benchmark's connections, and for its in-process coordinator.
// Off while ca_file is empty. scripts/bench-pki.sh writes a throw-away set.
struct BenchTls {
  // PEM CA that verifies the coordinator's certificate.
  std::string ca_file;
  // The in-process coordinator's PEM certificate chain and key. Required
  // with ca_file when the benchmark starts its own coordinator; refused
  // against --coordinator, whose certificate is its own business.
  std::string cert_file;
  std::string key_file;
  // The name checked against the certificate; empty: the target's host.
  std::string server_name;

  bool enabled() const { return !ca_file.empty(); }
};

// `count` channels to `address`, each on its own TCP connection: a distinct
// channel argument keeps gRPC from sharing one subchannel among them.
// Channels have no keepalive (a quiet pending wait must not trigger ping
// policing) and no message-size cap beyond the server's. With `tls`
// enabled, every connection makes its own full TLS handshake (one set of
// credentials, no session cache). Errors: those of
// security::MakeChannelCredentials for unreadable or inconsistent files.
absl::StatusOr<std::vector<std::shared_ptr<grpc::Channel>>> MakeConnections(
    const std::string& address, int count, const BenchTls& tls);
// Plaintext channels, as above.
std::vector<std::shared_ptr<grpc::Channel>> MakeConnections(const std::string& address, int count);

// Connects every channel, in waves of at most 1024 connections at a time.
// Possible errors: UNAVAILABLE when a connection fails, or is not up within
// `timeout`.
absl::Status Connect(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                     absl::Duration timeout);

// Starts a coordinator in this process on 127.0.0.1:0 for a benchmark, in
// the default configuration. `ranks_heartbeat` false (simulated ranks that
// never heartbeat, as waiters_bench's) raises its heartbeat timeout far
// above any round's length instead.
// With tls.cert_file set it serves TLS with it and tls.key_file.
absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> StartBenchCoordinator(
    bool ranks_heartbeat = true, const BenchTls& tls = {});

// This process's resource use, from /proc/self.
struct ProcessStats {
  int threads = 0;
  int64_t rss_bytes = 0;
  int64_t peak_rss_bytes = 0;  // Since the process started (VmHWM).
  int open_fds = 0;
};
ProcessStats ReadProcessStats();
// User + system CPU time this process has used so far.
double ProcessCpuSeconds();
// The machine's 1-minute load average (/proc/loadavg); -1 when unknown.
// Recorded with results: on a shared machine it says how loaded the run was.
double LoadAverage();
nlohmann::json ToJson(const ProcessStats& stats);

// ---- rendezvous --------------------------------------------------------------

struct RendezvousBenchOptions {
  // Simulated ranks per round (the job's world size).
  int ranks = 4096;
  // Connections the ranks are spread over, rank r on channel r % channels.
  int channels = 4;
  // Each rank its own connection (channels = ranks), as ranks of a real job
  // have: the coordinator then holds as many connections as ranks. Needs a
  // descriptor per connection in this process (and another per connection
  // in an in-process coordinator); the soft limit is raised to the hard
  // one, and a run that would exceed it is refused (RESOURCE_EXHAUSTED).
  bool connection_per_rank = false;
  // Through agents (agent/rank_relay.h): ranks_per_node ranks per
  // simulated agent, each agent with its own connection, making the node
  // calls a relay makes (JoinBatch, BarrierBatch, one GetUniqueIds,
  // HeartbeatBatch; rendezvous_nodes.cc). The ranks' hop to their agent is
  // not simulated.
  bool via_agent = false;
  int ranks_per_node = 8;
  // Coordinator to measure; empty starts one in this process (own threads)
  // and creates jobs directly, otherwise jobs come from AdminService.CreateJob.
  std::string coordinator;
  // TLS on every connection (and on the in-process coordinator).
  BenchTls tls;
  // Measured rounds of each kind, and unmeasured warm-up rounds before them.
  // Every round of the coordinator uses a fresh job.
  int repeat = 3;
  int warmup = 1;
  // Timeout of a whole round: every waiting request carries it in
  // timeout_seconds, and the coordinator enforces it.
  absl::Duration round_timeout = absl::Seconds(120);
  // Also give every call a gRPC deadline at the end of the round. Off by
  // default: gRPC then arms a timer per call on both sides, and the Debian
  // build of gRPC 1.51 (assertions on) tracks every timer in a debug hash
  // table of 1009 buckets, a cost that grows with the calls pending
  // (docs/performance.md).
  bool grpc_deadlines = false;
};

// One round of one kind. Times count from the first request sent.
struct RoundResult {
  double total_s = 0;  // Until the last rank finished its last call.
  // CPU time of this whole process (user + system) during the round: with
  // an in-process coordinator, client and server together. Less sensitive
  // than total_s to other load on a shared machine.
  double cpu_s = 0;
  // Until the last rank finished each step: join, barrier, unique_id for the
  // coordinator; check1..3 for the baseline. step_first_s: until the first
  // rank did; the difference is how long the step's replies took to fan out.
  std::vector<double> step_s;
  std::vector<double> step_first_s;
  // Per rank: its first request sent -> its last reply.
  LatencyStats rank_latency;
  // Mesh rounds: heartbeats sent (each joined rank once per the interval
  // Join gave, until the round is over) and those that failed in transit
  // (a deadline, the server's backlog); a heartbeat that finds the
  // generation failed fails the round.
  int64_t heartbeats = 0;
  int64_t heartbeat_errors = 0;
};

struct RendezvousBenchResult {
  std::string coordinator;
  bool in_process = false;
  int ranks = 0;
  int channels = 0;
  bool via_agent = false;
  int ranks_per_node = 0;  // With via_agent.
  bool grpc_deadlines = false;
  bool tls = false;
  // How long opening every connection took, in waves of 1024 (TCP, and the
  // TLS handshakes with tls), before the first round. Agents hold their
  // connection before a job starts; ranks of a real job open theirs as they
  // start, so with a connection per rank this is part of a job's start.
  double connect_s = 0;
  double load_average = 0;            // When the run started.
  std::vector<RoundResult> mesh;      // One per measured round.
  std::vector<RoundResult> baseline;  // Likewise, interleaved with mesh.
  // Summary: medians over rounds of total_s, cpu_s and each percentile.
  double mesh_total_s = 0;
  double baseline_total_s = 0;
  // Median over rounds of each round's mesh / baseline. A round's two halves
  // run back to back, so their ratio is steadier under other load on the
  // machine than a ratio of medians taken over minutes.
  double ratio = 0;
  double mesh_cpu_s = 0;
  double baseline_cpu_s = 0;
  double cpu_ratio = 0;  // Likewise, of cpu_s,
  double p50_ratio = 0;  // of rank_latency.p50_us,
  double p99_ratio = 0;  // and of rank_latency.p99_us.
  double mesh_p50_us = 0;
  double mesh_p99_us = 0;
  double baseline_p50_us = 0;
  double baseline_p99_us = 0;
  // Medians over rounds of each step's times.
  std::vector<double> mesh_step_s;
  std::vector<double> mesh_step_first_s;
  std::vector<double> baseline_step_s;
  std::vector<double> baseline_step_first_s;
  // Whole process (client, and server when in process) after the last round.
  ProcessStats process;
};

// Step names, in RoundResult::step_s order.
const std::vector<std::string>& MeshStepNames();
const std::vector<std::string>& BaselineStepNames();

// Runs warm-up and measured rounds, checking every reply: the rank, world
// size, generation, node and local rank, and the ID bytes in the Join and
// GetUniqueIds replies; the participant count of the barrier; SERVING from
// the health check. Possible errors: INVALID_ARGUMENT for bad options;
// UNAVAILABLE when the coordinator cannot be started or reached; INTERNAL
// naming the first wrong reply and how many ranks failed; any error a call
// returned (the first one, with the count).
absl::StatusOr<RendezvousBenchResult> RunRendezvousBench(const RendezvousBenchOptions& options);

nlohmann::json ToJson(const RendezvousBenchResult& result);

}  // namespace mesh::bench
