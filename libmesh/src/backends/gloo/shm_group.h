// ShmGroup: collectives through one shared-memory segment, for a Gloo group
// whose members all run on this host (internal; GlooOptions::shared_memory).
//
// Why: on one host, Gloo's TCP path moves every byte through the kernel's
// loopback twice and needs several thread hand-offs per message (the device
// loop reads, then wakes the op's thread). Through shared memory an
// all-reduce is two memcpy-like passes and two barriers per slot-sized round.
//
// Layout of the segment (POSIX shm, created by member 0, unlinked as soon as
// every member has mapped it, so nothing leaks if a process dies):
//
//   Header | Control[0..n-1] (one futex word + pid each) | in[0] .. in[n-1] | result
//
// Every round of an all-reduce of L <= slot bytes (member r owns share r,
// the r-th 1/n of the round):
//   1. member r copies the other members' shares of its L bytes into in[r];
//                                                                barrier
//   2. member r reduces share r in its own tensor with share r of every
//      other in[j], and copies it into result;                   barrier
//   3. member r copies the other shares from result into its tensor.
// Per member that is about 3L bytes of memory traffic for two members (the
// TCP path moves each byte through two socket copies and a reduction).
// The next round's step 1 rewrites in[r] only after everyone passed step 2's
// barrier, and rewrites result only after everyone passed the next step-1
// barrier, so one set of slots is enough. The rule that keeps this true for
// every op: before an op's first barrier a member writes only its own input
// slot. Broadcast (through the root's input slot), all-gather,
// reduce-scatter and all-to-all are the same pattern with other copies. A barrier publishes an
// ever-increasing number in the member's futex word and waits for every other member's to reach it
// (a short spin, then FUTEX_WAIT in 20 ms slices).
//
// Failure. Waits end with:
//   AbortedError   this process called Abort();
//   PeerIoError    another member aborted (its Abort() sets a shared flag),
//                  its process exited (kill(pid, 0) fails with ESRCH), or the
//                  per-op timeout passed ("Timed out ..."; DEADLINE_EXCEEDED).
// Abort() wakes every waiter of the segment; a waiter that slipped between
// its checks and its FUTEX_WAIT notices within one 20 ms slice.
//
// Thread safety: one thread runs ops (the group's worker); Abort() may be
// called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/gloo/gloo_reduce.h"
#include "mesh/store.h"

namespace mesh::gloo_backend {

class ShmGroup {
 public:
  // Collective over `store` (the group's own key prefix). Returns null, not
  // an error, when the members are not all on this host (host name, boot id
  // and PID namespace must match) or the segment cannot be created or
  // mapped everywhere: the group then uses TCP. Every member reaches the
  // same decision.
  // Possible errors: the store's (e.g. DEADLINE_EXCEEDED when a member does
  // not show up within `timeout`).
  static absl::StatusOr<std::unique_ptr<ShmGroup>> Create(Store& store, int rank, int size,
                                                          size_t slot_bytes,
                                                          absl::Duration timeout);
  ~ShmGroup();

  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // The ops throw AbortedError or PeerIoError (gloo_context.h). `timeout`
  // bounds each wait.
  //
  // In place on `data` (`count` elements of `elem` bytes).
  void AllReduce(void* data, size_t count, size_t elem, const ReduceFn& reduce,
                 std::chrono::milliseconds timeout);
  void Broadcast(void* data, size_t bytes, int root, std::chrono::milliseconds timeout);
  // `input` holds `bytes`; `output` size() * `bytes`, in rank order.
  void AllGather(const void* input, void* output, size_t bytes, std::chrono::milliseconds timeout);
  // `input` holds size() chunks of `count` elements; `output` one.
  void ReduceScatter(const void* input, void* output, size_t count, size_t elem,
                     const ReduceFn& reduce, std::chrono::milliseconds timeout);
  // Block j of `input` (in_bytes[j] bytes at in_offsets[j]) goes to member
  // j; block j of `output` (out_bytes[j] at out_offsets[j]) comes from
  // member j. Sizes may differ per pair (member j's in_bytes[r] must equal
  // member r's out_bytes[j]); the members first agree on the number of
  // rounds through their control words.
  void AllToAll(const void* input, const std::vector<size_t>& in_offsets,
                const std::vector<size_t>& in_bytes, void* output,
                const std::vector<size_t>& out_offsets, const std::vector<size_t>& out_bytes,
                std::chrono::milliseconds timeout);
  void Barrier(std::chrono::milliseconds timeout);

  // See the file comment. Idempotent.
  void Abort();

  struct Header;
  struct Control;

 private:
  ShmGroup(int rank, int size, size_t slot_bytes, void* base, size_t mapped_bytes);

  // Publishes the next barrier number and waits for every other member.
  void Sync(std::chrono::steady_clock::time_point deadline);
  void WaitFor(int peer, uint32_t target, std::chrono::steady_clock::time_point deadline);
  uint8_t* in_slot(int member) const;
  uint8_t* result_slot() const;

  const int rank_;
  const int size_;
  const size_t slot_bytes_;
  void* const base_;
  const size_t mapped_bytes_;
  Header* const header_;
  Control* const control_;
  std::atomic<bool> aborted_{false};
  // The last barrier number this member published, and the number of
  // all-to-alls run; only the op thread touches them.
  uint32_t epoch_ = 0;
  uint64_t all_to_alls_ = 0;
};

}  // namespace mesh::gloo_backend
