// Helpers for the DTensor tests: a Gloo world of N thread-ranks with one
// DeviceMesh per rank (built once, reused by many cases), deterministic
// global tensors, and the single-process reference of what each rank holds.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mesh/device_mesh.h"
#include "mesh/dtensor.h"
#include "mesh/placement.h"
#include "process_group_gloo_test_util.h"

namespace mesh::dtensor_test {

using gloo_test::Get;
using gloo_test::Set;

// N ranks (threads) over Gloo on 127.0.0.1, each with a DeviceMesh of
// `shape`. The factories outlive the meshes (members in that order).
struct MeshWorld {
  std::shared_ptr<InMemoryStore> store;
  std::vector<std::shared_ptr<GlooProcessGroupFactory>> factories;
  std::vector<std::unique_ptr<DeviceMesh>> meshes;
  int size() const { return static_cast<int>(meshes.size()); }
};

// `options`: shared_memory false forces TCP, which the executor's
// point-to-point paths need (libmesh/src/sharding/exchange.h).
inline absl::StatusOr<std::unique_ptr<MeshWorld>> MakeMeshWorld(
    std::vector<int64_t> shape, GlooOptions options = gloo_test::TestOptions()) {
  int n = 1;
  for (int64_t s : shape) n *= static_cast<int>(s);
  auto world = std::make_unique<MeshWorld>();
  InMemoryStoreOptions store_options;
  store_options.timeout = gloo_test::kTestTimeout;
  world->store = std::make_shared<InMemoryStore>(store_options);
  world->factories.resize(n);
  world->meshes.resize(n);
  for (int r = 0; r < n; ++r) {
    auto factory = GlooProcessGroupFactory::Create(world->store, r, n, options);
    if (!factory.ok()) return factory.status();
    world->factories[r] = std::shared_ptr<GlooProcessGroupFactory>(std::move(*factory));
  }
  std::vector<absl::Status> statuses(n);
  gloo_test::OnRanks(n, [&](int r) {
    auto mesh = DeviceMesh::Init(world->factories[r], shape);
    if (!mesh.ok()) {
      statuses[r] = mesh.status();
      return;
    }
    world->meshes[r] = std::make_unique<DeviceMesh>(*std::move(mesh));
  });
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return world;
}

// A contiguous CPU tensor of `shape` with small integer values (exact in
// every dtype and under sums of a few of them), different per seed.
inline Tensor MakeGlobal(DType dtype, const std::vector<int64_t>& shape, uint64_t seed) {
  auto t = Tensor::Empty(dtype, shape);
  EXPECT_TRUE(t.ok()) << t.status();
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < t->numel(); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    Set(*t, i, static_cast<double>(static_cast<int64_t>((x >> 33) % 17) - 8));
  }
  return *t;
}

// What the rank at `coordinate` holds for `global` laid out with
// `placements`, when every Partial came from a Replicate value: its box of
// the global tensor, or the op's identity (0 for sum, 1 for prod) where a
// Partial(sum) or Partial(prod) dim's coordinate is not 0.
inline Tensor Expected(const Tensor& global, const std::vector<int64_t>& mesh_shape,
                       const Placements& placements, const std::vector<int64_t>& coordinate) {
  auto layout = ComputeLocalLayout(global.shape(), mesh_shape, placements, coordinate);
  EXPECT_TRUE(layout.ok()) << layout.status();
  auto out = Tensor::Zeros(global.dtype(), layout->shape);
  EXPECT_TRUE(out.ok()) << out.status();
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].is_partial() || coordinate[i] == 0) continue;
    if (placements[i].op() == ReduceOp::kSum) return *out;
    if (placements[i].op() == ReduceOp::kProd) {
      for (int64_t e = 0; e < out->numel(); ++e) Set(*out, e, 1);
      return *out;
    }
  }
  Tensor box = global;
  for (int d = 0; d < global.dim(); ++d) box = *box.Narrow(d, layout->offset[d], layout->shape[d]);
  EXPECT_TRUE(CopyTensor(*out, box).ok());
  return *out;
}

// Same shape and values (exact for integers, `tolerance` for floats).
inline ::testing::AssertionResult SameValues(const Tensor& actual, const Tensor& expected,
                                             double tolerance = 1e-5) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure()
           << "shape " << actual.ShapeString() << " != expected " << expected.ShapeString();
  }
  if (actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure() << "dtype " << DTypeName(actual.dtype());
  }
  const double tol = IsFloatingPoint(actual.dtype()) ? tolerance : 0.0;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const double a = Get(actual, i);
    const double e = Get(expected, i);
    if (std::fabs(a - e) > tol) {
      return ::testing::AssertionFailure() << "element " << i << " is " << a << ", expected " << e
                                           << " (of " << actual.ShapeString() << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

inline std::string Describe(const std::vector<int64_t>& shape, DType dtype, const Placements& src,
                            const Placements& dst) {
  return absl::StrCat("global [", absl::StrJoin(shape, ", "), "] ", DTypeName(dtype), " ",
                      PlacementsToString(src), " -> ", PlacementsToString(dst));
}

}  // namespace mesh::dtensor_test
