// The Gloo backend: ProcessGroups for CPU tensors over Gloo's TCP transport.
//
//   auto factory = GlooProcessGroupFactory::Create(store, rank, world_size, options);
//   auto world = (*factory)->World();                   // collective
//   auto work = (*world)->AllReduce(tensor, ReduceOp::kSum);
//   MESH_RETURN_IF_ERROR((*work)->Wait());
//
// Rendezvous. Every group rendezvouses through the factory's mesh::Store
// under its own key prefix, "gloo/<name>/<n>/", where <name> is "world" or
// "<family>/<color>" and <n> counts how often this factory has built a group
// of that name (so rebuilding a family after an abort never reads stale
// addresses). Inside the prefix, gloo's full-mesh rendezvous publishes one
// listening address per peer and connects every pair of members over TCP.
//
// Execution. Each group owns one worker thread. Collectives queue on it and
// run strictly in issue order (FIFO), one at a time; their Work completes
// when the worker is done with the op's tensors. Send and Recv are posted to
// the transport at once (so that a Send and the matching Recv can be issued
// in either order on the two ranks, as with c10d) and complete on a second
// thread that waits for them in posting order. Work::Wait(timeout) never
// blocks past `timeout`, whatever the transport does.
//
// Algorithms. AllReduce uses gloo's ring (bandwidth-optimal, pipelined) for
// two members; for more it picks gloo's bcube (recursive halving/doubling,
// log2(n) steps) below a size threshold and the ring at or above it; see
// GlooOptions. The out-of-place AllReduce, where the ring is chosen and the
// group size divides numel, runs a fused ring reduce-scatter + all-gather of
// our own straight from input to output; otherwise it copies the input into
// the output and runs the in-place form. ReduceScatter and AllGather are
// segmented rings of our own (gloo 0.5 has no abortable reduce-scatter, and
// its all-gather does not overlap its steps; backends/gloo/gloo_ring.h).
// Broadcast is gloo's binomial tree, Reduce gloo's ring reduce-scatter plus
// gather, AllToAll gloo's pairwise exchange, Barrier gloo's. With GlooOptions::shared_memory,
// groups on one host run their collectives through shared memory instead (send/recv stay on TCP).
//
// Failure. gloo blocks inside its ops and reports errors by throwing; the
// backend catches every exception at the op boundary and turns it into a
// Status:
//   UNAVAILABLE        a peer's connection broke (the message names the
//                      group rank(s) and world rank(s) the op was waiting on,
//                      and gloo's own message with the peer address);
//   DEADLINE_EXCEEDED  gloo's per-op timeout (ProcessGroupOptions::timeout)
//                      passed inside an op;
//   the abort reason   the group was aborted while the op was queued or ran.
// Any op that fails aborts its group with that status: the connections are
// closed, so peers blocked in the same collective fail at once with
// UNAVAILABLE instead of waiting for their timeout, and every later op fails
// synchronously. An op failing with UNAVAILABLE first waits up to
// GlooOptions::abort_grace for the runtime's Abort(reason), and fails with
// that reason if it comes. A Gloo group cannot be used again after an error; build a
// new one (NewGroups again) if the job survives.
//
// Abort(reason) ends the running op within milliseconds even though gloo
// blocks: the group's gloo context wakes every pending wait of its buffers
// and hard-closes its TCP connections (see
// libmesh/src/backends/gloo/gloo_context.h).
//
// SIGPIPE: gloo writes to sockets without MSG_NOSIGNAL, so the first
// GlooProcessGroupFactory::Create sets SIGPIPE to SIG_IGN when it still has
// its default action (which would kill the process when a peer dies);
// writes then fail with EPIPE and the op with UNAVAILABLE. An application
// handler, if installed first, is left alone.
//
// Thread safety: everything here is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "mesh/process_group.h"
#include "mesh/store.h"

namespace mesh {

enum class GlooAllreduceAlgorithm : uint8_t {
  kAuto,   // Ring for 2 members; for more, bcube below
           // GlooOptions::allreduce_ring_min_bytes and ring from it up.
  kRing,   // gloo ring: 2(n-1)/n of the data per rank, 2(n-1) steps.
  kBcube,  // gloo bcube (base 2): log2(n)-ish steps, for latency-bound sizes.
};

// "auto", "ring", "bcube".
const char* GlooAllreduceAlgorithmName(GlooAllreduceAlgorithm algorithm);

struct GlooOptions {
  // Address (name or IP literal) to bind the listening sockets to and to
  // advertise to peers. Empty: `iface` if set, otherwise this host's name
  // (gethostname), falling back to 127.0.0.1 when the name does not resolve
  // to an address this host can bind. Tests pass "127.0.0.1".
  std::string hostname;
  // Network interface to bind instead (e.g. "eth0"); used when `hostname`
  // is empty.
  std::string iface;

  // Timeout of the rendezvous and of every op inside gloo; default for
  // Work::Wait().
  ProcessGroupOptions group;

  // When an op fails because a peer's connection broke (or a shared-memory
  // peer aborted), how long it waits for a local Abort(reason) before
  // failing with UNAVAILABLE. The runtime learns of a death from the
  // coordinator at about the time the survivors' connections break; its
  // reason names the dead rank, where "connection reset" names only the
  // neighbour that noticed first. Peers of a broken group fail this much
  // later than they could.
  absl::Duration abort_grace = absl::Milliseconds(100);

  GlooAllreduceAlgorithm allreduce_algorithm = GlooAllreduceAlgorithm::kAuto;
  // kAuto's crossover for groups of 3 or more, in bytes of the tensor.
  // Measured on the development machine (loopback TCP, 3, 4 and 8
  // processes, medians of 6 runs; docs/collectives.md): bcube is 1.3x-3.8x
  // faster up to 1 MiB, the two are within 10% of each other from 2 to
  // 8 MiB (bcube still 1.3x faster for 3 ranks), and the ring is 1.3x-2.5x
  // faster from 16 MiB up.
  size_t allreduce_ring_min_bytes = 16 * 1024 * 1024;

  // Upper bound on one message of the ring reduce-scatter; a smaller segment
  // overlaps wire and reduction sooner, a larger one costs fewer messages.
  size_t reduce_scatter_segment_bytes = 512 * 1024;

  // Upper bound on one message of the ring all-gather over TCP (each
  // segment is forwarded to the next rank as soon as it arrives, so the
  // ring's steps overlap; gloo's own all-gather waits out each step).
  size_t all_gather_segment_bytes = 512 * 1024;

  // Upper bound on one message of the out-of-place AllReduce's fused ring
  // (the in-place AllReduce is gloo's, whose segments are also 1 MiB).
  // Measured (docs/performance.md, "Redistribute"): 1 MiB beat 256 KiB,
  // 512 KiB and 2 MiB at 16 and 64 MiB on 4 ranks.
  size_t all_reduce_segment_bytes = 1024 * 1024;

  // When every member of a group runs on this host (same boot,
  // mount and PID namespace), run all_reduce, reduce, broadcast, all_gather,
  // reduce_scatter, all_to_all and barrier through one shared-memory segment
  // instead of TCP (send/recv stay on TCP). Groups that span hosts, or whose
  // segment cannot be created (e.g. a full /dev/shm), silently use TCP;
  // every member reaches the same decision at rendezvous. A member that
  // dies is noticed within 20 ms once its PID is gone (reaped; a zombie
  // still counts as alive), one that aborts at once: tests/libmesh/
  // gloo_peer_death_test kills a real peer process mid-all-reduce and the
  // survivor fails with UNAVAILABLE in ~0.1 s. On by default: on one host it
  // is 4-40x TCP's bandwidth (docs/collectives.md).
  bool shared_memory = true;
  // Bytes per member slot of the segment, which holds size() + 1 slots: the
  // largest piece one barrier round moves.
  size_t shared_memory_slot_bytes = 4 * 1024 * 1024;

  // Run gloo's TCP device thread (the epoll thread that serves every socket
  // of the factory) under SCHED_BATCH, so that its wake-ups never preempt
  // the thread running a collective. Without it, on a busy machine, small
  // collectives over TCP took 3-5 ms each instead of ~0.15 ms: the device
  // thread knocked the collective's thread off its CPU while that thread
  // held a connection's lock, then spun on that lock (gloo retries a failed
  // try_lock through epoll_wait) until the next scheduler tick. The thread's
  // nice value is unchanged; best effort (a kernel that refuses leaves the
  // policy alone). See libmesh/src/backends/gloo/gloo_device_thread.h and
  // docs/performance.md, "Small messages".
  bool batch_device_thread = true;
};

class GlooProcessGroupFactory;

// A ProcessGroup over Gloo. Made by GlooProcessGroupFactory.
//
// Which tensors are accepted (mesh/process_group.h): CPU tensors with any
// strides (non-contiguous ones are staged through a contiguous copy), every
// dtype, with bool limited as the header says. An op's input and output
// must not overlap, except for the in-place forms: AllReduce's output may
// be the same view as its input, AllGather's input may be
// this rank's chunk of the output, ReduceScatter's output may be this rank's
// chunk of the input.
class ProcessGroupGloo final : public ProcessGroup {
 public:
  ~ProcessGroupGloo() override;

  absl::string_view backend() const override { return "gloo"; }

  absl::StatusOr<WorkPtr> AllReduce(Tensor tensor, ReduceOp op) override;
  absl::StatusOr<WorkPtr> AllReduce(Tensor input, Tensor output, ReduceOp op) override;
  absl::StatusOr<WorkPtr> Broadcast(Tensor tensor, int root) override;
  absl::StatusOr<WorkPtr> Reduce(Tensor tensor, int root, ReduceOp op) override;
  absl::StatusOr<WorkPtr> AllGather(Tensor input, Tensor output) override;
  absl::StatusOr<WorkPtr> ReduceScatter(Tensor input, Tensor output, ReduceOp op) override;
  absl::StatusOr<WorkPtr> AllToAll(Tensor input, Tensor output,
                                   std::vector<int64_t> input_splits = {},
                                   std::vector<int64_t> output_splits = {}) override;
  // `tag` must be >= 0 (INVALID_ARGUMENT otherwise).
  absl::StatusOr<WorkPtr> Send(Tensor tensor, int peer, int tag = 0) override;
  absl::StatusOr<WorkPtr> Recv(Tensor tensor, int peer, int tag = 0) override;
  absl::StatusOr<WorkPtr> Barrier() override;

  void Abort(absl::Status reason) override;
  absl::Status health() const override;

  // The algorithm AllReduce uses for a tensor of `nbytes` bytes over TCP.
  GlooAllreduceAlgorithm AllreduceAlgorithmFor(size_t nbytes) const;

  // Whether collectives go through shared memory (GlooOptions::shared_memory
  // was set and every member is on this host).
  bool uses_shared_memory() const;

  // Internal: the group's state, shared with its threads and Works.
  class State;

 private:
  friend class GlooProcessGroupFactory;
  ProcessGroupGloo(int rank, std::vector<int> global_ranks, std::string name,
                   const GlooOptions& options, std::shared_ptr<State> state);

  const std::shared_ptr<State> state_;
};

// Makes Gloo groups for one process (one world rank) over a Store that every
// rank of the world shares: the coordinator's store for one job generation
// (mesh/coordinator_store.h), or an InMemoryStore when ranks are threads.
//
// World() and NewGroups() are collective as ProcessGroupFactory says: the
// first World() call on every rank rendezvouses the world group (later calls
// return the same group); each NewGroups() call rendezvouses its groups in
// spec order.
//
// Errors: those of ProcessGroupFactory; DEADLINE_EXCEEDED (from the store)
// when a member does not show up within the timeout; UNAVAILABLE when a
// member's address cannot be reached; the abort reason after AbortAll().
class GlooProcessGroupFactory final : public ProcessGroupFactory {
 public:
  // Resolves the address to bind (see GlooOptions::hostname) and starts
  // gloo's TCP device (one event-loop thread shared by all groups).
  // Possible errors: INVALID_ARGUMENT for a null store, a rank outside
  // [0, world_size), a non-positive world size or timeout;
  // INVALID_ARGUMENT when an explicit hostname or iface cannot be used.
  static absl::StatusOr<std::unique_ptr<GlooProcessGroupFactory>> Create(
      std::shared_ptr<Store> store, int world_rank, int world_size, GlooOptions options = {});

  ~GlooProcessGroupFactory() override;

  int world_rank() const override { return world_rank_; }
  int world_size() const override { return world_size_; }
  // The address this process's Gloo sockets bind to, e.g. "127.0.0.1".
  const std::string& address() const;

  absl::StatusOr<std::shared_ptr<ProcessGroup>> World() override;
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroups(
      const std::vector<GroupSpec>& specs) override;
  // A rendezvous in progress is not interrupted (it ends with its timeout);
  // the groups it makes are aborted before they are returned.
  // NewGroups: each group already connects among its own members alone.
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroupsAmongMembers(
      const std::vector<GroupSpec>& specs) override {
    return NewGroups(specs);
  }
  void AbortAll(absl::Status reason) override;

  class Device;

 private:
  GlooProcessGroupFactory(std::shared_ptr<Store> store, int world_rank, int world_size,
                          GlooOptions options, std::unique_ptr<Device> device);

  // Rendezvous of one group, `global_ranks` in group-rank order.
  absl::StatusOr<std::shared_ptr<ProcessGroupGloo>> MakeGroup(const std::string& name,
                                                              const std::vector<int>& global_ranks);

  const std::shared_ptr<Store> store_;
  const int world_rank_;
  const int world_size_;
  const GlooOptions options_;
  const std::unique_ptr<Device> device_;

  // Serializes World() and NewGroups(): rendezvous are collective and must
  // run in the same order on every rank.
  absl::Mutex create_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::shared_ptr<ProcessGroupGloo> world_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> generations_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<ProcessGroupGloo>> groups_ ABSL_GUARDED_BY(mu_);
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mesh
