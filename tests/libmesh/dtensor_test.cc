// DTensor over Gloo: four ranks as threads on 127.0.0.1, on a 1-D (4) and a
// 2-D (2, 2) mesh. Every transition of mesh/redistribute_plan.h, for even,
// uneven and empty shapes, compared on every rank with the single-process
// reference (the global tensor cut by ComputeLocalLayout); FromLocal's
// inference and errors; DistributeTensor from one rank and from all;
// Partial(sum / avg / max) semantics.
#include "mesh/dtensor.h"

#include <atomic>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "dtensor_test_util.h"

namespace mesh {
namespace dtensor_test {

using dtensor_test::Describe;
using dtensor_test::Expected;
using dtensor_test::MakeGlobal;
using dtensor_test::MakeMeshWorld;
using dtensor_test::MeshWorld;
using dtensor_test::SameValues;
using gloo_test::OnRanks;
using ::testing::HasSubstr;

const Placement R = Placement::Replicate();
Placement S(int d) { return Placement::Shard(d); }
Placement P(ReduceOp op = ReduceOp::kSum) { return Placement::Partial(op); }

const std::vector<std::vector<int64_t>> kShapes = {{7, 5}, {3, 1}, {0, 4}};

// Distributes (src_rank -1), checks, redistributes to every dst, checks
// every rank against the reference and FullTensor against the global
// tensor. Records the plan ops seen.
void CheckAllPairs(MeshWorld& world, const std::vector<Placements>& placements,
                   const std::vector<DType>& dtypes, std::set<RedistributeOp>* ops_seen) {
  absl::Mutex mu;
  OnRanks(world.size(), [&](int r) {
    const DeviceMesh& mesh = *world.meshes[r];
    uint64_t seed = 0;
    for (DType dtype : dtypes) {
      for (const std::vector<int64_t>& shape : kShapes) {
        const Tensor global = MakeGlobal(dtype, shape, ++seed);
        for (const Placements& src : placements) {
          if (absl::Status s = ValidatePlacements(src, mesh.shape(), 2); !s.ok()) continue;
          auto x = DistributeTensor(global, mesh, src);
          ASSERT_TRUE(x.ok()) << x.status();
          EXPECT_TRUE(
              SameValues(x->local(), Expected(global, mesh.shape(), src, mesh.GetCoordinate())))
              << "distribute " << Describe(shape, dtype, src, src) << " rank " << r;
          for (const Placements& dst : placements) {
            const std::string what = Describe(shape, dtype, src, dst);
            auto y = Redistribute(*x, dst);
            ASSERT_TRUE(y.ok()) << what << ": " << y.status();
            EXPECT_EQ(y->placements(), dst);
            EXPECT_TRUE(
                SameValues(y->local(), Expected(global, mesh.shape(), dst, mesh.GetCoordinate())))
                << what << " rank " << r;
            auto full = y->FullTensor();
            ASSERT_TRUE(full.ok()) << what << ": " << full.status();
            EXPECT_TRUE(SameValues(*full, global)) << what << " full, rank " << r;
            if (r == 0) {
              auto plan = PlanRedistribute(shape, dtype, mesh.shape(), src, dst);
              ASSERT_TRUE(plan.ok()) << plan.status();
              absl::MutexLock lock(&mu);
              for (const RedistributeStep& step : plan->steps) ops_seen->insert(step.op);
            }
          }
        }
      }
    }
  });
}

TEST(DTensorTest, EveryTransitionOnA1DMesh) {
  auto world = MakeMeshWorld({4});
  ASSERT_TRUE(world.ok()) << world.status();
  std::set<RedistributeOp> ops;
  const std::vector<Placements> all = {
      {S(0)}, {S(1)}, {R}, {P()}, {P(ReduceOp::kMax)}, {P(ReduceOp::kMin)}, {P(ReduceOp::kProd)}};
  CheckAllPairs(**world, all, {DType::kFloat32, DType::kInt32}, &ops);
  CheckAllPairs(**world, {{S(0)}, {R}, {P(ReduceOp::kAvg)}}, {DType::kFloat32}, &ops);
  EXPECT_EQ(ops.size(), 6u) << "not every RedistributeOp was exercised";
}

TEST(DTensorTest, EveryTransitionOnA2DMesh) {
  auto world = MakeMeshWorld({2, 2});
  ASSERT_TRUE(world.ok()) << world.status();
  const std::vector<Placement> per_dim = {S(0), S(1), R, P()};
  std::vector<Placements> all;
  for (const Placement& a : per_dim) {
    for (const Placement& b : per_dim) all.push_back({a, b});
  }
  std::set<RedistributeOp> ops;
  CheckAllPairs(**world, all, {DType::kFloat32, DType::kInt32}, &ops);
  EXPECT_EQ(ops.size(), 6u) << "not every RedistributeOp was exercised";
}

TEST(DTensorTest, DistributeFromEverySourceRank) {
  auto world = MakeMeshWorld({2, 2});
  ASSERT_TRUE(world.ok()) << world.status();
  const std::vector<Placements> cases = {{S(0), S(1)}, {S(0), S(0)}, {R, S(1)},
                                         {P(), S(0)},  {R, R},       {S(1), P(ReduceOp::kMax)}};
  OnRanks(4, [&](int r) {
    const DeviceMesh& mesh = *(*world)->meshes[r];
    uint64_t seed = 100;
    for (int src = 0; src < 4; ++src) {
      for (const std::vector<int64_t>& shape : kShapes) {
        for (const Placements& placements : cases) {
          const Tensor global = MakeGlobal(DType::kInt32, shape, ++seed);
          DistributeOptions options;
          options.src_rank = src;
          // Only the source's tensor counts: the others pass an empty one.
          auto x = DistributeTensor(r == src ? global : Tensor(), mesh, placements, options);
          ASSERT_TRUE(x.ok()) << x.status();
          EXPECT_EQ(x->shape(), absl::Span<const int64_t>(shape));
          EXPECT_EQ(x->dtype(), DType::kInt32);
          EXPECT_TRUE(SameValues(x->local(),
                                 Expected(global, mesh.shape(), placements, mesh.GetCoordinate())))
              << "src " << src << " " << Describe(shape, DType::kInt32, placements, placements)
              << " rank " << r;
          auto full = x->FullTensor();
          ASSERT_TRUE(full.ok()) << full.status();
          EXPECT_TRUE(SameValues(*full, global));
        }
      }
    }
  });
}

TEST(DTensorTest, DistributeDoesNotWriteTheCallersTensor) {
  auto world = MakeMeshWorld({4});
  ASSERT_TRUE(world.ok()) << world.status();
  OnRanks(4, [&](int r) {
    const DeviceMesh& mesh = *(*world)->meshes[r];
    const Tensor global = MakeGlobal(DType::kFloat32, {4, 3}, 7);
    const Tensor before = MakeGlobal(DType::kFloat32, {4, 3}, 7);
    for (int src : {-1, 0, 2}) {
      DistributeOptions options;
      options.src_rank = src;
      auto x = DistributeTensor(global, mesh, {P()}, options);
      ASSERT_TRUE(x.ok()) << x.status();
      EXPECT_NE(x->local().data(), global.data());
      EXPECT_TRUE(SameValues(global, before));
    }
  });
}

TEST(DTensorTest, DistributeErrors) {
  auto world = MakeMeshWorld({4});
  ASSERT_TRUE(world.ok()) << world.status();
  const DeviceMesh& mesh = *(*world)->meshes[0];
  const Tensor global = MakeGlobal(DType::kInt32, {4, 3}, 1);
  DistributeOptions options;
  options.src_rank = 4;
  auto bad_src = DistributeTensor(global, mesh, {S(0)}, options);
  EXPECT_EQ(bad_src.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_src.status().message(), HasSubstr("src_rank 4"));
  EXPECT_EQ(DistributeTensor(global, mesh, {S(2)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DistributeTensor(global, mesh, {S(0), R}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto avg = DistributeTensor(global, mesh, {P(ReduceOp::kAvg)});
  EXPECT_EQ(avg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(avg.status().message(), HasSubstr("floating"));
  auto transposed = Tensor::Create(global.data(), DType::kInt32, {3, 4}, {1, 3}, Device::Cpu());
  ASSERT_TRUE(transposed.ok());
  EXPECT_EQ(DistributeTensor(*transposed, mesh, {S(0)}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DTensorTest, DistributeFromASourceThatRejectsItsTensorFailsEveryRank) {
  auto world = MakeMeshWorld({2, 2});
  ASSERT_TRUE(world.ok()) << world.status();
  std::vector<absl::Status> statuses(4);
  OnRanks(4, [&](int r) {
    const DeviceMesh& mesh = *(*world)->meshes[r];
    // The source's tensor has one dim: Shard(1) does not fit it.
    const Tensor global = MakeGlobal(DType::kFloat32, {6}, 3);
    DistributeOptions options;
    options.src_rank = 1;
    statuses[r] =
        DistributeTensor(r == 1 ? global : Tensor(), mesh, {S(0), S(1)}, options).status();
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kInvalidArgument) << r << statuses[r];
    EXPECT_THAT(statuses[r].message(), HasSubstr("mesh rank 1")) << r;
  }
}

// ---- FromLocal. ----------------------------------------------------------------

TEST(DTensorTest, FromLocalInfersEvenUnevenAndNestedShapes) {
  auto world = MakeMeshWorld({2, 2});
  ASSERT_TRUE(world.ok()) << world.status();
  const std::vector<std::pair<std::vector<int64_t>, Placements>> cases = {
      {{8, 6}, {S(0), S(1)}}, {{7, 5}, {S(0), S(1)}}, {{7, 5}, {S(0), S(0)}},
      {{3, 5}, {S(0), S(0)}}, {{5, 3}, {S(1), R}},    {{1, 2}, {S(0), S(0)}},
      {{0, 3}, {S(0), S(1)}}, {{7, 5}, {R, P()}}};
  OnRanks(4, [&](int r) {
    const DeviceMesh& mesh = *(*world)->meshes[r];
    uint64_t seed = 0;
    for (const auto& [shape, placements] : cases) {
      const Tensor global = MakeGlobal(DType::kFloat32, shape, ++seed);
      const Tensor mine = Expected(global, mesh.shape(), placements, mesh.GetCoordinate());
      FromLocalOptions options;
      options.verify = true;
      auto x = DTensor::FromLocal(mine, mesh, placements, options);
      ASSERT_TRUE(x.ok()) << x.status();
      EXPECT_EQ(x->shape(), absl::Span<const int64_t>(shape))
          << Describe(shape, DType::kFloat32, placements, placements);
      EXPECT_EQ(x->local().data(), mine.data()) << "shares the caller's memory without copy";
      auto full = x->FullTensor();
      ASSERT_TRUE(full.ok()) << full.status();
      EXPECT_TRUE(SameValues(*full, global));
      // With the global shape given: no communication, same result.
      options.verify = false;
      options.copy = true;
      options.global_shape = shape;
      auto y = DTensor::FromLocal(mine, mesh, placements, options);
      ASSERT_TRUE(y.ok()) << y.status();
      EXPECT_NE(y->local().data(), mine.data());
      EXPECT_EQ(y->local_layout(), x->local_layout());
    }
  });
}

TEST(DTensorTest, FromLocalRejectsShapesThatCannotFormATensorOnEveryRank) {
  auto world = MakeMeshWorld({4});
  ASSERT_TRUE(world.ok()) << world.status();
  std::vector<absl::Status> uneven(4), mismatched(4);
  OnRanks(4, [&](int r) {
    const DeviceMesh& mesh = *(*world)->meshes[r];
    // Rows 1, 2, 2, 2: sums to 7, whose torch.chunk split is 2, 2, 2, 1.
    auto a = Tensor::Zeros(DType::kFloat32, {r == 0 ? 1 : 2, 5});
    uneven[r] = DTensor::FromLocal(*a, mesh, {S(0)}).status();
    // Columns differ on rank 2.
    auto b = Tensor::Zeros(DType::kFloat32, {2, r == 2 ? 6 : 5});
    mismatched[r] = DTensor::FromLocal(*b, mesh, {S(0)}).status();
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(uneven[r].code(), absl::StatusCode::kInvalidArgument) << uneven[r];
    EXPECT_THAT(uneven[r].message(), HasSubstr("mesh dim 0")) << uneven[r];
    EXPECT_THAT(uneven[r].message(), HasSubstr("[1, 2, 2, 2]")) << uneven[r];
    EXPECT_EQ(mismatched[r].code(), absl::StatusCode::kInvalidArgument) << mismatched[r];
    EXPECT_THAT(mismatched[r].message(), HasSubstr("tensor dim 1")) << mismatched[r];
  }
}

TEST(DTensorTest, FromLocalChecksTheGivenGlobalShapeLocally) {
  auto world = MakeMeshWorld({4});
  ASSERT_TRUE(world.ok()) << world.status();
  const DeviceMesh& mesh = *(*world)->meshes[3];
  FromLocalOptions options;
  options.global_shape = {7, 5};
  // Rank 3's chunk of 7 rows is 1 row.
  auto wrong = DTensor::FromLocal(*Tensor::Zeros(DType::kInt32, {2, 5}), mesh, {S(0)}, options);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("[1, 5]"));
  auto right = DTensor::FromLocal(*Tensor::Zeros(DType::kInt32, {1, 5}), mesh, {S(0)}, options);
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_EQ(right->local_layout().offset, (DimVector{6, 0}));
  EXPECT_EQ(right->DebugString(),
            "DTensor(shape=[7, 5], placements=[S(0)], local=[1, 5], int32, cpu)");
  options.global_shape = {7};
  EXPECT_EQ(DTensor::FromLocal(*Tensor::Zeros(DType::kInt32, {1, 5}), mesh, {S(0)}, options)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  auto base = Tensor::Zeros(DType::kInt32, {5, 2});
  auto transposed = Tensor::Create(base->data(), DType::kInt32, {2, 5}, {1, 2}, Device::Cpu());
  EXPECT_EQ(DTensor::FromLocal(*transposed, mesh, {R}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DTensor::FromLocal(*base, mesh, {S(0), R}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DTensorTest, VerifyCatchesADivergingReplicaOnEveryRank) {
  auto world = MakeMeshWorld({2, 2});
  ASSERT_TRUE(world.ok()) << world.status();
  std::vector<absl::Status> statuses(4);
  OnRanks(4, [&](int r) {
    const DeviceMesh& mesh = *(*world)->meshes[r];
    const Tensor global = MakeGlobal(DType::kFloat32, {6, 4}, 9);
    const Placements placements = {S(0), R};
    Tensor mine = Expected(global, mesh.shape(), placements, mesh.GetCoordinate());
    FromLocalOptions options;
    options.verify = true;
    // Consistent replicas pass.
    EXPECT_TRUE(DTensor::FromLocal(mine, mesh, placements, options).ok());
    // World rank 3 (coordinate (1, 1)) diverges from rank 2 along mesh dim 1.
    if (r == 3) gloo_test::Set(mine, 5, 1000);
    statuses[r] = DTensor::FromLocal(mine, mesh, placements, options).status();
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kFailedPrecondition) << r << statuses[r];
    EXPECT_THAT(statuses[r].message(), HasSubstr("mesh dim 1")) << statuses[r];
  }
  EXPECT_THAT(statuses[3].message(), HasSubstr("world ranks 2 and 3"));
}

// ---- Large tensors: the executor's segmented point-to-point and split
// all-reduce paths (libmesh/src/sharding/), which small shapes never reach: pieces of
// more than one 1 MiB segment, packed and unpacked, even and uneven.
// The shapes are the smallest that keep every piece over a segment: on a
// (2, 2) mesh the smallest piece of (1031, 1031) is 515 x 515 floats,
// 1,060,900 bytes, so it goes in a full segment of 509 rows and a short
// one of 6.

const std::vector<std::vector<int64_t>> kLargeShapes = {{1030, 1030}, {1031, 1031}};

// Both transports: TCP takes the point-to-point and split paths, shared
// memory the collective ones.
class DTensorLargeTest : public ::testing::TestWithParam<bool> {
 protected:
  static GlooOptions Options() {
    GlooOptions options = gloo_test::TestOptions();
    options.shared_memory = GetParam();
    return options;
  }
};

INSTANTIATE_TEST_SUITE_P(Transports, DTensorLargeTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "shm" : "tcp"; });

// The small, uneven and empty shapes again over TCP, where the executor
// moves pieces point to point instead of through collectives.
TEST(DTensorTest, EveryTransitionOverTcp) {
  GlooOptions tcp = gloo_test::TestOptions();
  tcp.shared_memory = false;
  std::set<RedistributeOp> ops;
  auto line = MakeMeshWorld({4}, tcp);
  ASSERT_TRUE(line.ok()) << line.status();
  CheckAllPairs(**line, {{S(0)}, {S(1)}, {R}, {P()}, {P(ReduceOp::kAvg)}}, {DType::kFloat32}, &ops);
  auto grid = MakeMeshWorld({2, 2}, tcp);
  ASSERT_TRUE(grid.ok()) << grid.status();
  std::vector<Placements> all;
  for (const Placement& a : {S(0), S(1), R, P()}) {
    for (const Placement& b : {S(0), S(1), R, P()}) all.push_back({a, b});
  }
  CheckAllPairs(**grid, all, {DType::kInt32}, &ops);
  EXPECT_EQ(ops.size(), 6u);
}

TEST_P(DTensorLargeTest, ShardTransitionsSegmentPiecesExactly) {
  for (const std::vector<int64_t>& mesh_shape : {std::vector<int64_t>{2}, {2, 2}}) {
    auto world = MakeMeshWorld(mesh_shape, Options());
    ASSERT_TRUE(world.ok()) << world.status();
    std::vector<Placements> all;
    if (mesh_shape.size() == 1) {
      all = {{S(0)}, {S(1)}, {R}};
    } else {
      all = {{S(0), S(1)}, {S(1), S(0)}, {R, R}, {S(0), R}, {R, S(1)}};
    }
    OnRanks((*world)->size(), [&](int r) {
      const DeviceMesh& mesh = *(*world)->meshes[r];
      uint64_t seed = 40;
      for (const std::vector<int64_t>& shape : kLargeShapes) {
        const Tensor global = MakeGlobal(DType::kFloat32, shape, ++seed);
        for (const Placements& src : all) {
          auto x = DistributeTensor(global, mesh, src);
          ASSERT_TRUE(x.ok()) << x.status();
          for (const Placements& dst : all) {
            auto y = Redistribute(*x, dst);
            const std::string what = Describe(shape, DType::kFloat32, src, dst);
            ASSERT_TRUE(y.ok()) << what << ": " << y.status();
            EXPECT_TRUE(SameValues(y->local(),
                                   Expected(global, mesh.shape(), dst, mesh.GetCoordinate()), 0))
                << what << " rank " << r;
          }
        }
      }
    });
  }
}

TEST_P(DTensorLargeTest, PartialToReplicateReducesExactly) {
  auto world = MakeMeshWorld({2}, Options());
  ASSERT_TRUE(world.ok()) << world.status();
  OnRanks(2, [&](int r) {
    const DeviceMesh& mesh = *(*world)->meshes[r];
    for (const std::vector<int64_t>& shape : kLargeShapes) {  // Even numel, then odd.
      const Tensor a = MakeGlobal(DType::kFloat32, shape, 7);
      const Tensor b = MakeGlobal(DType::kFloat32, shape, 8);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        auto x = DTensor::FromLocal(r == 0 ? a : b, mesh, {P(op)});
        ASSERT_TRUE(x.ok()) << x.status();
        auto expected = Tensor::Empty(DType::kFloat32, shape);
        for (int64_t e = 0; e < a.numel(); ++e) {
          const double va = dtensor_test::Get(a, e);
          const double vb = dtensor_test::Get(b, e);
          dtensor_test::Set(*expected, e,
                            op == ReduceOp::kSum   ? va + vb
                            : op == ReduceOp::kAvg ? (va + vb) / 2
                                                   : std::max(va, vb));
        }
        for (const Placements& dst : std::vector<Placements>{{R}, {S(0)}, {S(1)}}) {
          auto y = Redistribute(*x, dst);
          ASSERT_TRUE(y.ok()) << y.status();
          EXPECT_TRUE(SameValues(y->local(), Expected(*expected, {2}, dst, {r}), 0))
              << ReduceOpName(op) << " -> " << PlacementsToString(dst) << " " << shape[0] << "x"
              << shape[1] << " rank " << r;
        }
        // The input is untouched (the split all-reduce reads it in place).
        EXPECT_TRUE(SameValues(x->local(), r == 0 ? a : b, 0)) << ReduceOpName(op);
      }
    }
  });
}

// ---- Partial. --------------------------------------------------------------------

TEST(DTensorTest, PartialValuesReduceByTheirOp) {
  auto world = MakeMeshWorld({4});
  ASSERT_TRUE(world.ok()) << world.status();
  OnRanks(4, [&](int r) {
    const DeviceMesh& mesh = *(*world)->meshes[r];
    // Rank r holds r + 1 everywhere: sum 10, avg 2.5, max 4, min 1, prod 24.
    auto local = Tensor::Empty(DType::kFloat32, {7, 5});
    ASSERT_TRUE(Fill(*local, r + 1).ok());
    const std::vector<std::pair<ReduceOp, double>> ops = {{ReduceOp::kSum, 10},
                                                          {ReduceOp::kAvg, 2.5},
                                                          {ReduceOp::kMax, 4},
                                                          {ReduceOp::kMin, 1},
                                                          {ReduceOp::kProd, 24}};
    for (const auto& [op, value] : ops) {
      auto x = DTensor::FromLocal(*local, mesh, {P(op)});
      ASSERT_TRUE(x.ok()) << x.status();
      auto expected = Tensor::Empty(DType::kFloat32, {7, 5});
      ASSERT_TRUE(Fill(*expected, value).ok());
      auto full = x->FullTensor();
      ASSERT_TRUE(full.ok()) << full.status();
      EXPECT_TRUE(SameValues(*full, *expected)) << ReduceOpName(op);
      // Partial -> Shard: uneven reduce_scatter (7 rows: 2, 2, 2, 1).
      for (int d : {0, 1}) {
        auto y = Redistribute(*x, {S(d)});
        ASSERT_TRUE(y.ok()) << y.status();
        EXPECT_TRUE(SameValues(y->local(), Expected(*expected, {4}, {S(d)}, {r})))
            << ReduceOpName(op) << " S(" << d << ") rank " << r;
      }
    }
  });
}

TEST(DTensorTest, DistributingPartialSumKeepsTheValueOnCoordinateZeroOnly) {
  auto world = MakeMeshWorld({2, 2});
  ASSERT_TRUE(world.ok()) << world.status();
  OnRanks(4, [&](int r) {
    const DeviceMesh& mesh = *(*world)->meshes[r];
    const Tensor global = MakeGlobal(DType::kInt32, {4, 4}, 5);
    auto x = DistributeTensor(global, mesh, {R, P()});
    ASSERT_TRUE(x.ok()) << x.status();
    auto zeros = Tensor::Zeros(DType::kInt32, {4, 4});
    EXPECT_TRUE(SameValues(x->local(), mesh.GetCoordinate()[1] == 0 ? global : *zeros)) << r;
    auto avg = DistributeTensor(MakeGlobal(DType::kFloat32, {4, 4}, 5), mesh,
                                {P(ReduceOp::kMax), P(ReduceOp::kMax)});
    ASSERT_TRUE(avg.ok()) << avg.status();
    EXPECT_TRUE(SameValues(avg->local(), MakeGlobal(DType::kFloat32, {4, 4}, 5))) << r;
  });
}

TEST(DTensorTest, PlanCacheIsUsed) {
  auto world = MakeMeshWorld({4});
  ASSERT_TRUE(world.ok()) << world.status();
  std::vector<RedistributePlanCache> caches(4);
  OnRanks(4, [&](int r) {
    const DeviceMesh& mesh = *(*world)->meshes[r];
    auto x = DistributeTensor(MakeGlobal(DType::kFloat32, {8, 2}, 1), mesh, {S(0)});
    ASSERT_TRUE(x.ok());
    RedistributeOptions options;
    options.cache = &caches[r];
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(Redistribute(*x, {R}, options).ok());
  });
  for (const auto& cache : caches) {
    EXPECT_EQ(cache.misses(), 1);
    EXPECT_EQ(cache.hits(), 2);
  }
}

}  // namespace dtensor_test
}  // namespace mesh
