// Property test of DTensor over Gloo: about 1,750 random cases per run (a
// new seed each run, so coverage grows run by run) on 1-D, 2-D and 3-D meshes (worlds of 2 to 8
// thread-ranks on 127.0.0.1). Each case draws a global shape (dims of 0, 1, primes, sizes below the
// mesh), a dtype, source placements (Shard, Replicate, Partial), a source rank (or -1) and a chain
// of target placements; every rank's local tensor after the distribute and after each redistribute
// is compared with the single-process reference, and FullTensor with the original at the end.
//
// The seed is printed; MESH_PROPERTY_SEED=<n> reruns one. A mesh is built
// once per world and reused by all its cases (group setup is the slow part).
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "dtensor_test_util.h"
#include "mesh/dtensor.h"

namespace mesh {
namespace dtensor_property_test {

using dtensor_test::Describe;
using dtensor_test::Expected;
using dtensor_test::MakeGlobal;
using dtensor_test::MakeMeshWorld;
using dtensor_test::SameValues;

struct Case {
  std::vector<int64_t> shape;
  DType dtype;
  Placements src;
  int src_rank;
  std::vector<Placements> chain;
  uint64_t data_seed;
};

uint64_t Seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("MESH_PROPERTY_SEED");
    const uint64_t s = env != nullptr ? std::strtoull(env, nullptr, 10) : 20240611;
    std::printf("dtensor_property_test: seed %llu (set MESH_PROPERTY_SEED to rerun one)\n",
                static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

Placements RandomPlacements(std::mt19937_64& rng, int mesh_ndim, int tensor_rank, DType dtype) {
  Placements p;
  for (int i = 0; i < mesh_ndim; ++i) {
    switch (rng() % 7) {
      case 0:
      case 1:
        p.push_back(Placement::Replicate());
        break;
      case 2:
      case 3:
      case 4:
        p.push_back(Placement::Shard(static_cast<int>(rng() % tensor_rank)));
        break;
      default: {
        std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin,
                                     ReduceOp::kProd};
        if (IsFloatingPoint(dtype)) ops.push_back(ReduceOp::kAvg);
        p.push_back(Placement::Partial(ops[rng() % ops.size()]));
      }
    }
  }
  // Partials must commute (ValidatePlacements): sum and avg mix, the other
  // ops only with themselves. Make later Partials follow the first.
  const Placement* first = nullptr;
  for (Placement& placement : p) {
    if (!placement.is_partial()) continue;
    if (first == nullptr) {
      first = &placement;
      continue;
    }
    const bool linear = [](ReduceOp a, ReduceOp b) {
      return (a == ReduceOp::kSum || a == ReduceOp::kAvg) &&
             (b == ReduceOp::kSum || b == ReduceOp::kAvg);
    }(first->op(), placement.op());
    if (!linear && first->op() != placement.op()) placement = Placement::Partial(first->op());
  }
  return p;
}

std::vector<Case> MakeCases(const std::vector<int64_t>& mesh_shape, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  int world = 1;
  for (int64_t s : mesh_shape) world *= static_cast<int>(s);
  const int64_t sizes[] = {0, 1, 1, 2, 3, 4, 5, 7, 8, 11, 13, 16};
  const DType dtypes[] = {DType::kFloat32, DType::kInt32, DType::kFloat64, DType::kInt64};
  std::vector<Case> cases;
  for (int c = 0; c < count; ++c) {
    Case x;
    const int rank = 1 + static_cast<int>(rng() % 3);
    for (int d = 0; d < rank; ++d) x.shape.push_back(sizes[rng() % std::size(sizes)]);
    x.dtype = dtypes[rng() % std::size(dtypes)];
    const int ndim = static_cast<int>(mesh_shape.size());
    x.src = RandomPlacements(rng, ndim, rank, x.dtype);
    x.src_rank = rng() % 3 == 0 ? -1 : static_cast<int>(rng() % world);
    const int steps = 1 + static_cast<int>(rng() % 3);
    for (int s = 0; s < steps; ++s) x.chain.push_back(RandomPlacements(rng, ndim, rank, x.dtype));
    x.data_seed = rng();
    cases.push_back(std::move(x));
  }
  return cases;
}

void RunCases(const std::vector<int64_t>& mesh_shape, int count, uint64_t salt) {
  const uint64_t seed = Seed() ^ (salt * 0x9E3779B97F4A7C15ull);
  const std::vector<Case> cases = MakeCases(mesh_shape, count, seed);
  auto world = MakeMeshWorld(mesh_shape);
  ASSERT_TRUE(world.ok()) << world.status();
  const auto start = std::chrono::steady_clock::now();
  gloo_test::OnRanks((*world)->size(), [&](int r) {
    const DeviceMesh& mesh = *(*world)->meshes[r];
    int failures = 0;
    for (size_t c = 0; c < cases.size() && failures < 5; ++c) {
      const Case& x = cases[c];
      const Tensor global = MakeGlobal(x.dtype, x.shape, x.data_seed);
      const std::string where =
          absl::StrCat("case ", c, " (seed ", Seed(), "), rank ", r, ", src_rank ", x.src_rank);
      DistributeOptions options;
      options.src_rank = x.src_rank;
      const bool has_global = x.src_rank == -1 || x.src_rank == r;
      auto current = DistributeTensor(has_global ? global : Tensor(), mesh, x.src, options);
      // An error here would desynchronize the ranks: stop this rank's run.
      ASSERT_TRUE(current.ok()) << where << ": " << current.status();
      ::testing::AssertionResult ok =
          SameValues(current->local(), Expected(global, mesh.shape(), x.src, mesh.GetCoordinate()));
      if (!ok) {
        ++failures;
        ADD_FAILURE() << where << " distribute " << Describe(x.shape, x.dtype, x.src, x.src) << ": "
                      << ok.message();
      }
      Placements from = x.src;
      for (const Placements& dst : x.chain) {
        auto next = Redistribute(*current, dst);
        ASSERT_TRUE(next.ok()) << where << " " << Describe(x.shape, x.dtype, from, dst) << ": "
                               << next.status();
        ok = SameValues(next->local(), Expected(global, mesh.shape(), dst, mesh.GetCoordinate()));
        if (!ok) {
          ++failures;
          ADD_FAILURE() << where << " " << Describe(x.shape, x.dtype, from, dst) << ": "
                        << ok.message();
        }
        current = std::move(next);
        from = dst;
      }
      auto full = current->FullTensor();
      ASSERT_TRUE(full.ok()) << where << ": " << full.status();
      ok = SameValues(*full, global);
      if (!ok) {
        ++failures;
        ADD_FAILURE() << where << " full tensor after " << PlacementsToString(from) << ": "
                      << ok.message();
      }
    }
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("mesh (%s): %d cases in %.2f s\n", absl::StrJoin(mesh_shape, ", ").c_str(), count,
              seconds);
}

TEST(DTensorPropertyTest, OneDimMeshes) {
  RunCases({2}, 300, 1);
  RunCases({3}, 250, 2);
  RunCases({4}, 225, 3);
  RunCases({8}, 100, 4);
}

TEST(DTensorPropertyTest, TwoDimMeshes) {
  RunCases({2, 2}, 250, 5);
  RunCases({2, 3}, 150, 6);
  RunCases({4, 2}, 125, 7);
  RunCases({1, 4}, 100, 8);
}

TEST(DTensorPropertyTest, ThreeDimMeshes) {
  RunCases({2, 2, 2}, 150, 9);
  RunCases({2, 1, 3}, 100, 10);
}

}  // namespace dtensor_property_test
}  // namespace mesh
