// The CPU buffer pool behind Tensor::Empty (libmesh/src/cpu_pool.h): reuse,
// size classes, the byte cap, LRU eviction, thread safety, and that
// Tensor::Empty goes through it.
#include "cpu_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "mesh/tensor.h"

namespace mesh::internal {
namespace cpu_pool_test {

constexpr size_t kMiB = size_t{1} << 20;

TEST(CpuPoolTest, RoundedSizeClasses) {
  EXPECT_EQ(CpuPool::RoundedSize(0), CpuPool::kAlignment);
  EXPECT_EQ(CpuPool::RoundedSize(1), CpuPool::kAlignment);
  EXPECT_EQ(CpuPool::RoundedSize(65), 128u);
  // Pooled sizes: four classes per power of two.
  EXPECT_EQ(CpuPool::RoundedSize(kMiB), kMiB);
  EXPECT_EQ(CpuPool::RoundedSize(kMiB + 1), kMiB + kMiB / 4);
  EXPECT_EQ(CpuPool::RoundedSize(kMiB + kMiB / 4 + 1), kMiB + kMiB / 2);
  EXPECT_EQ(CpuPool::RoundedSize(2 * kMiB - 1), 2 * kMiB);
  for (size_t bytes = CpuPool::kMinPooledBytes; bytes < 64 * kMiB; bytes = bytes * 3 / 2 + 7) {
    const size_t r = CpuPool::RoundedSize(bytes);
    EXPECT_GE(r, bytes);
    EXPECT_LE(r, bytes + bytes / 4 + CpuPool::kAlignment) << bytes;
    EXPECT_EQ(r % CpuPool::kAlignment, 0u);
  }
}

TEST(CpuPoolTest, ReusesAFreedBlockOfTheSameClass) {
  CpuPool pool(64 * kMiB);
  void* first = nullptr;
  {
    std::shared_ptr<void> a = pool.Allocate(4 * kMiB);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.get()) % CpuPool::kAlignment, 0u);
    std::memset(a.get(), 1, 4 * kMiB);  // The whole block is usable.
    first = a.get();
    EXPECT_EQ(pool.stats().idle_blocks, 0u);
  }
  EXPECT_EQ(pool.stats().idle_bytes, 4 * kMiB);
  EXPECT_EQ(pool.stats().idle_blocks, 1u);
  {
    // Same class (4 MiB - 100 rounds to 4 MiB): the same block comes back.
    std::shared_ptr<void> b = pool.Allocate(4 * kMiB - 100);
    EXPECT_EQ(b.get(), first);
    EXPECT_EQ(pool.stats().idle_bytes, 0u);
    // A different class does not take it.
    std::shared_ptr<void> c = pool.Allocate(2 * kMiB);
    EXPECT_NE(c.get(), first);
  }
  const CpuPool::Stats s = pool.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.idle_blocks, 2u);
  EXPECT_EQ(s.idle_bytes, 6 * kMiB);
  pool.Trim();
  EXPECT_EQ(pool.stats().idle_bytes, 0u);
  EXPECT_EQ(pool.stats().idle_blocks, 0u);
}

TEST(CpuPoolTest, SmallBlocksBypassThePool) {
  CpuPool pool(64 * kMiB);
  { std::shared_ptr<void> a = pool.Allocate(1000); }
  EXPECT_EQ(pool.stats().idle_blocks, 0u);
  EXPECT_EQ(pool.stats().misses, 0u);
}

TEST(CpuPoolTest, CapEvictsLeastRecentlyReleased) {
  CpuPool pool(8 * kMiB);
  std::shared_ptr<void> a = pool.Allocate(4 * kMiB);
  std::shared_ptr<void> b = pool.Allocate(2 * kMiB);
  std::shared_ptr<void> c = pool.Allocate(4 * kMiB);
  void* const c_ptr = c.get();
  a.reset();  // idle: a (4)
  b.reset();  // idle: a, b (6)
  c.reset();  // 10 > 8: a, the oldest, goes; idle: b, c (6)
  CpuPool::Stats s = pool.stats();
  EXPECT_EQ(s.idle_bytes, 6 * kMiB);
  EXPECT_EQ(s.idle_blocks, 2u);
  EXPECT_EQ(s.evictions, 1u);
  // The 4 MiB block left is c's, not a's.
  std::shared_ptr<void> d = pool.Allocate(4 * kMiB);
  EXPECT_EQ(d.get(), c_ptr);
  // A block above the cap is never cached.
  { std::shared_ptr<void> big = pool.Allocate(16 * kMiB); }
  EXPECT_EQ(pool.stats().idle_bytes, 2 * kMiB);
  // Lowering the cap evicts at once.
  pool.SetCap(kMiB);
  EXPECT_EQ(pool.stats().idle_bytes, 0u);
  EXPECT_EQ(pool.cap(), kMiB);
}

TEST(CpuPoolTest, ZeroCapDisablesCaching) {
  CpuPool pool(0);
  { std::shared_ptr<void> a = pool.Allocate(4 * kMiB); }
  { std::shared_ptr<void> b = pool.Allocate(4 * kMiB); }
  const CpuPool::Stats s = pool.stats();
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.idle_blocks, 0u);
}

TEST(CpuPoolTest, ThreadsAllocateAndReleaseConcurrently) {
  // Each thread writes its own pattern into every block it holds and checks
  // it before release: two holders of one block would corrupt each other.
  CpuPool pool(16 * kMiB);
  constexpr int kThreads = 8;
  constexpr int kRounds = 200;
  std::atomic<int> corrupt{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const size_t bytes = CpuPool::kMinPooledBytes << ((t + i) % 4);
        std::shared_ptr<void> block = pool.Allocate(bytes);
        if (block == nullptr) {
          corrupt.fetch_add(1);
          continue;
        }
        auto* p = static_cast<unsigned char*>(block.get());
        const auto pattern = static_cast<unsigned char>(t * 31 + i);
        std::memset(p, pattern, bytes);
        std::this_thread::yield();
        for (size_t k = 0; k < bytes; k += 4096) {
          if (p[k] != pattern || p[bytes - 1] != pattern) {
            corrupt.fetch_add(1);
            break;
          }
        }
        // Release on another thread half the time.
        if (i % 2 == 0) std::thread([b = std::move(block)]() mutable { b.reset(); }).join();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(corrupt.load(), 0);
  const CpuPool::Stats s = pool.stats();
  EXPECT_EQ(s.hits + s.misses, static_cast<uint64_t>(kThreads * kRounds));
  EXPECT_GT(s.hits, 0u);
  EXPECT_LE(s.idle_bytes, 16 * kMiB);
}

TEST(CpuPoolTest, TensorEmptyDrawsFromTheGlobalPool) {
  CpuPool& pool = CpuPool::Global();
  if (pool.cap() < 8 * kMiB) GTEST_SKIP() << "MESH_CPU_POOL_BYTES disables the pool";
  void* first = nullptr;
  {
    absl::StatusOr<Tensor> t = Tensor::Empty(DType::kFloat32, {1024, 1024});
    ASSERT_TRUE(t.ok()) << t.status();
    first = t->data();
    // A view keeps the block in use after the tensor itself is gone.
    absl::StatusOr<Tensor> view = t->Narrow(0, 1, 2);
    ASSERT_TRUE(view.ok());
    *t = Tensor();
    absl::StatusOr<Tensor> other = Tensor::Empty(DType::kFloat32, {1024, 1024});
    ASSERT_TRUE(other.ok());
    EXPECT_NE(other->data(), first);
  }
  const uint64_t hits = pool.stats().hits;
  absl::StatusOr<Tensor> again = Tensor::Empty(DType::kInt32, {1024, 1024});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(pool.stats().hits, hits + 1);
  // Zeros still zeroes a reused block.
  void* again_data = again->data();
  std::memset(again_data, 0xff, again->nbytes());
  *again = Tensor();
  absl::StatusOr<Tensor> zeros = Tensor::Zeros(DType::kInt32, {1024, 1024});
  ASSERT_TRUE(zeros.ok());
  EXPECT_EQ(zeros->data(), again_data);
  for (int64_t i = 0; i < zeros->numel(); ++i) ASSERT_EQ(zeros->data_as<int32_t>()[i], 0) << i;
}

}  // namespace cpu_pool_test
}  // namespace mesh::internal
