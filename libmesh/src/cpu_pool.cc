#include "cpu_pool.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iterator>

namespace mesh::internal {
namespace {

// MESH_CPU_POOL_BYTES, or the default. A bad value is reported once (this
// runs once, from Global) and ignored.
size_t CapFromEnvironment() {
  const char* value = std::getenv("MESH_CPU_POOL_BYTES");
  if (value == nullptr || *value == '\0') return CpuPool::kDefaultCapBytes;
  errno = 0;
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || value[0] == '-') {
    std::fprintf(stderr,
                 "libmesh: ignoring MESH_CPU_POOL_BYTES=\"%s\" (expected a byte count, 0 to "
                 "disable); the CPU buffer pool keeps its default cap of %zu bytes\n",
                 value, CpuPool::kDefaultCapBytes);
    return CpuPool::kDefaultCapBytes;
  }
  return static_cast<size_t>(parsed);
}

}  // namespace

CpuPool::~CpuPool() { Trim(); }

CpuPool& CpuPool::Global() {
  // Never destroyed: tensors may die during static destruction and still
  // release into it. The atexit handler (registered after construction, so
  // it runs before earlier-constructed statics are destroyed) frees the
  // idle blocks and turns caching off for anything released later.
  static CpuPool* const pool = [] {
    auto* p = new CpuPool(CapFromEnvironment());
    std::atexit([] { Global().SetCap(0); });
    return p;
  }();
  return *pool;
}

size_t CpuPool::RoundedSize(size_t bytes) {
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  if (rounded < kMinPooledBytes) return rounded;
  // Four classes per power of two: step = 2^floor(log2(rounded)) / 4.
  const int log2 = 63 - __builtin_clzll(static_cast<unsigned long long>(rounded));
  const size_t step = size_t{1} << (log2 - 2);
  return (rounded + step - 1) / step * step;
}

std::shared_ptr<void> CpuPool::Allocate(size_t bytes) {
  const size_t size = RoundedSize(bytes);
  if (size < kMinPooledBytes) {
    void* p = std::aligned_alloc(kAlignment, size);
    if (p == nullptr) return nullptr;
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }
  void* p = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = by_size_.find(size);
    if (it != by_size_.end() && !it->second.empty()) {
      // Most recently released: the warmest in cache and TLB.
      Lru::iterator block = it->second.back();
      it->second.pop_back();
      p = block->ptr;
      lru_.erase(block);
      stats_.idle_bytes -= size;
      --stats_.idle_blocks;
      ++stats_.hits;
    } else {
      ++stats_.misses;
    }
  }
  if (p == nullptr) {
    p = std::aligned_alloc(kAlignment, size);
    if (p == nullptr) {
      // Memory held idle here may be what the system is missing.
      Trim();
      p = std::aligned_alloc(kAlignment, size);
      if (p == nullptr) return nullptr;
    }
  }
  return std::shared_ptr<void>(p, [this, size](void* q) { Release(q, size); });
}

void CpuPool::Release(void* ptr, size_t size) {
  {
    absl::MutexLock lock(&mu_);
    if (size <= cap_bytes_) {
      EvictTo(cap_bytes_ - size);
      lru_.push_back(Block{ptr, size});
      by_size_[size].push_back(std::prev(lru_.end()));
      stats_.idle_bytes += size;
      ++stats_.idle_blocks;
      return;
    }
  }
  std::free(ptr);  // Larger than the cap (or caching is off).
}

void CpuPool::EvictTo(size_t target) {
  // free() of a large block is a munmap; doing it under the lock is rare
  // (only past the cap) and keeps the bookkeeping simple.
  while (stats_.idle_bytes > target && !lru_.empty()) {
    const Block oldest = lru_.front();
    auto it = by_size_.find(oldest.size);
    // The oldest block overall is the oldest of its class.
    it->second.pop_front();
    if (it->second.empty()) by_size_.erase(it);
    lru_.pop_front();
    stats_.idle_bytes -= oldest.size;
    --stats_.idle_blocks;
    ++stats_.evictions;
    std::free(oldest.ptr);
  }
}

void CpuPool::Trim() {
  absl::MutexLock lock(&mu_);
  EvictTo(0);
}

void CpuPool::SetCap(size_t cap_bytes) {
  absl::MutexLock lock(&mu_);
  cap_bytes_ = cap_bytes;
  EvictTo(cap_bytes_);
}

size_t CpuPool::cap() const {
  absl::MutexLock lock(&mu_);
  return cap_bytes_;
}

CpuPool::Stats CpuPool::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace mesh::internal
