// CpuPool: a bounded cache of freed CPU blocks behind Tensor::Empty.
//
// Why: a DTensor redistribute returns a freshly allocated result on every
// call, and so do the temporaries it packs into. Above glibc's mmap
// threshold each such allocation is a new mapping that the kernel
// page-faults and zero-fills on first touch, and munmaps again on free: at
// 64 MiB that costs as much as a memcpy of the whole tensor, per call. The
// pool keeps freed blocks warm (mapped, faulted in) and hands them to the
// next allocation of the same size class, as PyTorch's caching allocators
// do. Ownership does not change: a block is in use while any view of it
// lives, and returns to the pool (not to the system) when the last one dies.
//
// Policy:
//   * Blocks under kMinPooledBytes bypass the pool: malloc's own bins are
//     already fast there, and caching them would only fragment.
//   * Pooled sizes round up to one of four classes per power of two (at most
//     25% more virtual memory; pages past the request are never touched
//     unless a larger request of the same class reuses the block).
//   * Only idle bytes (cached, not in use) count against the cap. Releasing a
//     block that would exceed it evicts the least recently released blocks
//     first; a block larger than the cap is freed at once. A cap of 0
//     disables caching.
//   * An allocation that fails empties the cache and retries once.
//   * The process-wide pool (Global) takes its cap from MESH_CPU_POOL_BYTES
//     (bytes, default 1 GiB; 0 disables; an unparsable value warns once on
//     stderr and keeps the default). At exit it frees its idle blocks and
//     stops caching; blocks released later (static destructors) go straight
//     back to the system. The pool object itself is never destroyed, so a
//     release during static destruction is always safe.
//
// Errors: Allocate returns null when the system allocation fails (the
// caller words the RESOURCE_EXHAUSTED error).
// Thread safety: every member function is safe from any thread; blocks may
// be released on a thread other than the one that allocated them.
// Private to libmesh (tests reach it through libmesh/src).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace mesh::internal {

class CpuPool {
 public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kMinPooledBytes = size_t{64} << 10;
  static constexpr size_t kDefaultCapBytes = size_t{1} << 30;

  struct Stats {
    uint64_t hits = 0;       // Allocations served from the cache.
    uint64_t misses = 0;     // Pooled-size allocations that went to the system.
    uint64_t evictions = 0;  // Idle blocks freed to respect the cap (or trimmed).
    size_t idle_bytes = 0;   // Cached, not in use.
    size_t idle_blocks = 0;
  };

  explicit CpuPool(size_t cap_bytes) : cap_bytes_(cap_bytes) {}
  ~CpuPool();  // Frees the idle blocks; blocks still in use must not outlive it.
  CpuPool(const CpuPool&) = delete;
  CpuPool& operator=(const CpuPool&) = delete;

  // The process-wide pool behind Tensor::Empty (see the header comment).
  static CpuPool& Global();

  // The size a request of `bytes` is rounded to: a multiple of kAlignment,
  // never zero, and a size class at or above kMinPooledBytes.
  static size_t RoundedSize(size_t bytes);

  // `bytes` of kAlignment-aligned memory owned by the returned pointer,
  // whose deleter gives the block back to this pool. Null on failure.
  std::shared_ptr<void> Allocate(size_t bytes);

  // Frees every idle block.
  void Trim();
  // Changes the cap; evicts down to it at once.
  void SetCap(size_t cap_bytes);
  size_t cap() const;
  Stats stats() const;

 private:
  struct Block {
    void* ptr;
    size_t size;
  };
  using Lru = std::list<Block>;

  void Release(void* ptr, size_t size);
  // Evicts least recently released blocks until idle bytes <= target.
  void EvictTo(size_t target) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  size_t cap_bytes_ ABSL_GUARDED_BY(mu_);
  Lru lru_ ABSL_GUARDED_BY(mu_);  // Oldest release first.
  // Per size class, its idle blocks in release order (iterators into lru_).
  absl::flat_hash_map<size_t, std::deque<Lru::iterator>> by_size_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mesh::internal
