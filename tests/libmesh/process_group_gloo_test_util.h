// Helpers for the Gloo process-group tests: N ranks as threads of this
// process, one InMemoryStore, gloo's real TCP transport on 127.0.0.1.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "mesh/float16.h"
#include "mesh/in_memory_store.h"
#include "mesh/process_group_gloo.h"
#include "mesh/tensor.h"

namespace mesh::gloo_test {

// Long enough for 8 ranks on a loaded 2-core machine, short enough that a
// bug that hangs fails the test well within ctest's limit.
inline constexpr absl::Duration kTestTimeout = absl::Seconds(30);

inline GlooOptions TestOptions() {
  GlooOptions options;
  options.hostname = "127.0.0.1";
  options.group.timeout = kTestTimeout;
  return options;
}

// Runs fn(rank) on `n` threads at once and joins them.
inline void OnRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

// One world of `n` ranks: a factory and a world group per rank.
struct Ranks {
  std::shared_ptr<InMemoryStore> store;
  std::vector<std::unique_ptr<GlooProcessGroupFactory>> factories;
  std::vector<std::shared_ptr<ProcessGroup>> world;

  int size() const { return static_cast<int>(world.size()); }
  bool healthy() const {
    for (const auto& g : world) {
      if (!g->health().ok()) return false;
    }
    return true;
  }
};

inline absl::StatusOr<std::unique_ptr<Ranks>> MakeRanks(int n,
                                                        GlooOptions options = TestOptions()) {
  auto ranks = std::make_unique<Ranks>();
  InMemoryStoreOptions store_options;
  store_options.timeout = kTestTimeout;
  ranks->store = std::make_shared<InMemoryStore>(store_options);
  ranks->factories.resize(n);
  ranks->world.resize(n);
  std::vector<absl::Status> statuses(n);
  for (int r = 0; r < n; ++r) {
    auto factory = GlooProcessGroupFactory::Create(ranks->store, r, n, options);
    if (!factory.ok()) return factory.status();
    ranks->factories[r] = *std::move(factory);
  }
  OnRanks(n, [&](int r) {
    auto world = ranks->factories[r]->World();
    if (!world.ok()) {
      statuses[r] = world.status();
      return;
    }
    ranks->world[r] = *std::move(world);
  });
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return ranks;
}

// Element access by flat (row-major) index through the tensor's strides, as
// double: every test value is a small integer, exact in every dtype.
inline void* ElementAddress(const Tensor& t, int64_t flat) {
  int64_t offset = 0;
  for (int d = t.dim() - 1; d >= 0; --d) {
    const int64_t size = t.size(d);
    offset += (flat % size) * t.stride(d);
    flat /= size;
  }
  return static_cast<unsigned char*>(t.data()) + offset * static_cast<int64_t>(t.element_size());
}

inline double Get(const Tensor& t, int64_t flat) {
  const void* p = ElementAddress(t, flat);
  switch (t.dtype()) {
    case DType::kFloat32:
      return *static_cast<const float*>(p);
    case DType::kFloat64:
      return *static_cast<const double*>(p);
    case DType::kFloat16:
      return static_cast<float>(*static_cast<const Float16*>(p));
    case DType::kBFloat16:
      return static_cast<float>(*static_cast<const BFloat16*>(p));
    case DType::kInt8:
      return *static_cast<const int8_t*>(p);
    case DType::kUInt8:
      return *static_cast<const uint8_t*>(p);
    case DType::kInt32:
      return *static_cast<const int32_t*>(p);
    case DType::kInt64:
      return static_cast<double>(*static_cast<const int64_t*>(p));
    case DType::kBool:
      // The raw byte: a result must be exactly 0 or 1.
      return *static_cast<const uint8_t*>(p);
  }
  return 0;
}

inline void Set(const Tensor& t, int64_t flat, double v) {
  void* p = ElementAddress(t, flat);
  switch (t.dtype()) {
    case DType::kFloat32:
      *static_cast<float*>(p) = static_cast<float>(v);
      return;
    case DType::kFloat64:
      *static_cast<double*>(p) = v;
      return;
    case DType::kFloat16:
      *static_cast<Float16*>(p) = Float16(static_cast<float>(v));
      return;
    case DType::kBFloat16:
      *static_cast<BFloat16*>(p) = BFloat16(static_cast<float>(v));
      return;
    case DType::kInt8:
      *static_cast<int8_t*>(p) = static_cast<int8_t>(v);
      return;
    case DType::kUInt8:
      *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
      return;
    case DType::kInt32:
      *static_cast<int32_t*>(p) = static_cast<int32_t>(v);
      return;
    case DType::kInt64:
      *static_cast<int64_t*>(p) = static_cast<int64_t>(v);
      return;
    case DType::kBool:
      *static_cast<uint8_t*>(p) = v != 0 ? 1 : 0;
      return;
  }
}

// A fresh contiguous tensor whose every byte is garbage (0xA5), so that
// elements an op fails to write show up.
inline Tensor Poisoned(DType dtype, std::vector<int64_t> shape) {
  auto t = Tensor::Empty(dtype, shape);
  EXPECT_TRUE(t.ok()) << t.status();
  if (t->numel() > 0) std::memset(t->data(), 0xA5, t->nbytes());
  return *t;
}

}  // namespace mesh::gloo_test
