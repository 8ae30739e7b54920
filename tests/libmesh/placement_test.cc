// Placements: printing, validation, torch.chunk's rule and the left-to-right
// local layout, against hand-worked PyTorch cases
// (compute_local_shape_and_global_offset) and a tiling property on random
// shapes, meshes and placements.
#include "mesh/placement.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace mesh {
namespace placement_test {

using ::testing::HasSubstr;

const Placement R = Placement::Replicate();
Placement S(int d) { return Placement::Shard(d); }
Placement P(ReduceOp op = ReduceOp::kSum) { return Placement::Partial(op); }

}  // namespace placement_test

// Readable failures: "shape [2, 5] offset [4, 0]".
void PrintTo(const LocalLayout& layout, std::ostream* os) {
  *os << "shape "
      << testing::PrintToString(std::vector<int64_t>(layout.shape.begin(), layout.shape.end()))
      << " offset "
      << testing::PrintToString(std::vector<int64_t>(layout.offset.begin(), layout.offset.end()));
}

namespace placement_test {

LocalLayout Layout(std::vector<int64_t> shape, std::vector<int64_t> offset) {
  LocalLayout layout;
  layout.shape.assign(shape.begin(), shape.end());
  layout.offset.assign(offset.begin(), offset.end());
  return layout;
}

LocalLayout MustLayout(std::vector<int64_t> global, std::vector<int64_t> mesh,
                       Placements placements, std::vector<int64_t> coordinate) {
  absl::StatusOr<LocalLayout> layout = ComputeLocalLayout(global, mesh, placements, coordinate);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return layout.ok() ? *layout : LocalLayout{};
}

void ExpectInvalid(const absl::Status& status, const std::string& substring) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(substring)) << status;
}

TEST(ShardPlacementTest, ToString) {
  EXPECT_EQ(R.ToString(), "R");
  EXPECT_EQ(S(0).ToString(), "S(0)");
  EXPECT_EQ(S(3).ToString(), "S(3)");
  EXPECT_EQ(P().ToString(), "P(sum)");
  EXPECT_EQ(P(ReduceOp::kAvg).ToString(), "P(avg)");
  EXPECT_EQ(P(ReduceOp::kMax).ToString(), "P(max)");
  EXPECT_EQ(PlacementsToString({S(0), R}), "[S(0), R]");
  EXPECT_EQ(PlacementsToString({P(ReduceOp::kProd), S(1), R}), "[P(prod), S(1), R]");
  EXPECT_EQ(PlacementsToString({}), "[]");
}

TEST(ShardPlacementTest, Equality) {
  EXPECT_EQ(S(1), S(1));
  EXPECT_NE(S(0), S(1));
  EXPECT_EQ(P(ReduceOp::kSum), P());
  EXPECT_NE(P(ReduceOp::kSum), P(ReduceOp::kMin));
  EXPECT_NE(R, S(0));
  EXPECT_NE(R, P());
  EXPECT_EQ(Placement(), R);
}

TEST(ChunkOfTest, ExactDivision) {
  EXPECT_EQ(ChunkOf(8, 4, 0), (Chunk{2, 0}));
  EXPECT_EQ(ChunkOf(8, 4, 1), (Chunk{2, 2}));
  EXPECT_EQ(ChunkOf(8, 4, 3), (Chunk{2, 6}));
  EXPECT_EQ(ChunkOf(6, 1, 0), (Chunk{6, 0}));
}

TEST(ChunkOfTest, UnevenTrailingChunksShrinkThenEmpty) {
  // The header's example: 5 split 4 ways is 2, 2, 1, 0.
  EXPECT_EQ(ChunkOf(5, 4, 0), (Chunk{2, 0}));
  EXPECT_EQ(ChunkOf(5, 4, 1), (Chunk{2, 2}));
  EXPECT_EQ(ChunkOf(5, 4, 2), (Chunk{1, 4}));
  EXPECT_EQ(ChunkOf(5, 4, 3), (Chunk{0, 5}));
  // torch.chunk(arange(7), 4): 2, 2, 2, 1.
  EXPECT_EQ(ChunkOf(7, 4, 3), (Chunk{1, 6}));
  // 10 split 4 ways: ceil = 3 -> 3, 3, 3, 1.
  EXPECT_EQ(ChunkOf(10, 4, 3), (Chunk{1, 9}));
  // 4 split 3 ways: ceil = 2 -> 2, 2, 0 (torch.chunk returns only two).
  EXPECT_EQ(ChunkOf(4, 3, 2), (Chunk{0, 4}));
}

TEST(ChunkOfTest, SmallerThanParts) {
  // 2 split 5 ways: 1, 1, 0, 0, 0; empty chunks start at the end.
  EXPECT_EQ(ChunkOf(2, 5, 0), (Chunk{1, 0}));
  EXPECT_EQ(ChunkOf(2, 5, 1), (Chunk{1, 1}));
  EXPECT_EQ(ChunkOf(2, 5, 2), (Chunk{0, 2}));
  EXPECT_EQ(ChunkOf(2, 5, 4), (Chunk{0, 2}));
  EXPECT_EQ(ChunkOf(1, 8, 7), (Chunk{0, 1}));
}

TEST(ChunkOfTest, ZeroSizeGivesAllEmpty) {
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(ChunkOf(0, 3, i), (Chunk{0, 0}));
}

TEST(ChunkOfTest, PrimesMatchTorchChunkByBruteForce) {
  // torch.chunk: chunk size c = ceil(n/k); chunk i = [min(i c, n), min((i+1) c, n)).
  for (int64_t n : {0, 1, 2, 3, 5, 7, 11, 13, 17, 31, 97}) {
    for (int64_t k : {1, 2, 3, 4, 5, 7, 8, 16}) {
      const int64_t c = (n + k - 1) / k;
      int64_t covered = 0;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t begin = std::min(i * c, n);
        const int64_t end = std::min((i + 1) * c, n);
        EXPECT_EQ(ChunkOf(n, k, i), (Chunk{end - begin, begin})) << n << " / " << k << " @" << i;
        covered += ChunkOf(n, k, i).size;
      }
      EXPECT_EQ(covered, n);
    }
  }
}

TEST(ChunkOfTest, HugeSizesDoNotOverflow) {
  const int64_t big = INT64_MAX;
  const Chunk last = ChunkOf(big, 3, 2);
  EXPECT_EQ(last.offset + last.size, big);
  EXPECT_GT(last.size, 0);
  EXPECT_EQ(ChunkOf(big, 2, 0).size, big / 2 + 1);
}

TEST(ChunkOfDeathTest, PreconditionsAreChecked) {
  EXPECT_DEATH(ChunkOf(-1, 2, 0), "size");
  EXPECT_DEATH(ChunkOf(4, 0, 0), "parts");
  EXPECT_DEATH(ChunkOf(4, 2, 2), "index");
}

TEST(ValidatePlacementsTest, AcceptsValid) {
  EXPECT_TRUE(ValidatePlacements({S(0), R}, std::vector<int64_t>{2, 2}, 1).ok());
  EXPECT_TRUE(
      ValidatePlacements({S(1), S(1), P(ReduceOp::kAvg)}, std::vector<int64_t>{2, 3, 1}, 2).ok());
  EXPECT_TRUE(ValidatePlacements({R}, std::vector<int64_t>{4}, 0).ok());
}

TEST(ValidatePlacementsTest, Errors) {
  ExpectInvalid(ValidatePlacements({S(0)}, std::vector<int64_t>{2, 2}, 1), "has 2");
  ExpectInvalid(ValidatePlacements({S(0), R, R}, std::vector<int64_t>{2, 2}, 1), "has 2");
  ExpectInvalid(ValidatePlacements({R, S(2)}, std::vector<int64_t>{2, 2}, 2), "mesh dim 1");
  ExpectInvalid(ValidatePlacements({R, S(2)}, std::vector<int64_t>{2, 2}, 2), "S(2)");
  ExpectInvalid(ValidatePlacements({S(-1)}, std::vector<int64_t>{2}, 2), "mesh dim 0");
  ExpectInvalid(ValidatePlacements({S(0)}, std::vector<int64_t>{2}, 0), "0 dims");
  ExpectInvalid(ValidatePlacements({R}, std::vector<int64_t>{0}, 1), "mesh dim 0 has size 0");
  ExpectInvalid(
      ValidatePlacements({R, P(static_cast<ReduceOp>(42))}, std::vector<int64_t>{2, 2}, 1),
      "mesh dim 1 is Partial with unknown reduce op 42");
  // Partials that do not commute.
  ExpectInvalid(
      ValidatePlacements({P(ReduceOp::kSum), P(ReduceOp::kProd)}, std::vector<int64_t>{2, 2}, 1),
      "mesh dims 0 and 1 are P(sum) and P(prod), which do not commute");
  ExpectInvalid(ValidatePlacements({P(ReduceOp::kMin), R, P(ReduceOp::kMax)},
                                   std::vector<int64_t>{2, 2, 2}, 1),
                "do not commute");
  // These do.
  EXPECT_TRUE(
      ValidatePlacements({P(ReduceOp::kSum), P(ReduceOp::kAvg)}, std::vector<int64_t>{2, 2}, 1)
          .ok());
  EXPECT_TRUE(
      ValidatePlacements({P(ReduceOp::kMax), P(ReduceOp::kMax)}, std::vector<int64_t>{2, 2}, 1)
          .ok());
}

TEST(ComputeLocalLayoutTest, OneDimMesh) {
  const std::vector<int64_t> mesh = {4};
  // [7, 5] S(0) on 4: rows 2, 2, 2, 1.
  EXPECT_EQ(MustLayout({7, 5}, mesh, {S(0)}, {0}), Layout({2, 5}, {0, 0}));
  EXPECT_EQ(MustLayout({7, 5}, mesh, {S(0)}, {2}), Layout({2, 5}, {4, 0}));
  EXPECT_EQ(MustLayout({7, 5}, mesh, {S(0)}, {3}), Layout({1, 5}, {6, 0}));
  // S(1): cols 2, 2, 1, 0.
  EXPECT_EQ(MustLayout({7, 5}, mesh, {S(1)}, {2}), Layout({7, 1}, {0, 4}));
  EXPECT_EQ(MustLayout({7, 5}, mesh, {S(1)}, {3}), Layout({7, 0}, {0, 5}));
  EXPECT_EQ(MustLayout({7, 5}, mesh, {R}, {3}), Layout({7, 5}, {0, 0}));
  EXPECT_EQ(MustLayout({7, 5}, mesh, {P()}, {1}), Layout({7, 5}, {0, 0}));
  // A scalar is never sharded.
  EXPECT_EQ(MustLayout({}, mesh, {R}, {1}), Layout({}, {}));
}

TEST(ComputeLocalLayoutTest, TwoDimMeshDifferentTensorDims) {
  const std::vector<int64_t> mesh = {2, 3};
  // [5, 7] with (S(0), S(1)): rows 3, 2; cols 3, 3, 1.
  EXPECT_EQ(MustLayout({5, 7}, mesh, {S(0), S(1)}, {0, 0}), Layout({3, 3}, {0, 0}));
  EXPECT_EQ(MustLayout({5, 7}, mesh, {S(0), S(1)}, {1, 2}), Layout({2, 1}, {3, 6}));
  EXPECT_EQ(MustLayout({5, 7}, mesh, {S(1), S(0)}, {1, 2}), Layout({1, 3}, {4, 4}));
  EXPECT_EQ(MustLayout({5, 7}, mesh, {R, S(0)}, {1, 1}), Layout({2, 7}, {2, 0}));
  EXPECT_EQ(MustLayout({5, 7}, mesh, {S(1), P()}, {1, 2}), Layout({5, 3}, {0, 4}));
}

TEST(ComputeLocalLayoutTest, NestedShardSameDimMatchesPyTorch) {
  // PyTorch's compute_local_shape_and_global_offset for global [5] on a
  // (2, 2) mesh with (Shard(0), Shard(0)): mesh dim 0 splits 5 into 3 | 2
  // (offsets 0, 3); mesh dim 1 splits each again: 3 -> 2 | 1, 2 -> 1 | 1.
  const std::vector<int64_t> mesh = {2, 2};
  EXPECT_EQ(MustLayout({5}, mesh, {S(0), S(0)}, {0, 0}), Layout({2}, {0}));
  EXPECT_EQ(MustLayout({5}, mesh, {S(0), S(0)}, {0, 1}), Layout({1}, {2}));
  EXPECT_EQ(MustLayout({5}, mesh, {S(0), S(0)}, {1, 0}), Layout({1}, {3}));
  EXPECT_EQ(MustLayout({5}, mesh, {S(0), S(0)}, {1, 1}), Layout({1}, {4}));
  // Global [3] on (2, 2): 2 | 1, then 2 -> 1 | 1 and 1 -> 1 | 0.
  EXPECT_EQ(MustLayout({3}, mesh, {S(0), S(0)}, {0, 1}), Layout({1}, {1}));
  EXPECT_EQ(MustLayout({3}, mesh, {S(0), S(0)}, {1, 0}), Layout({1}, {2}));
  EXPECT_EQ(MustLayout({3}, mesh, {S(0), S(0)}, {1, 1}), Layout({0}, {3}));
}

TEST(ComputeLocalLayoutTest, EmptyShardsSitAtTheGlobalExtentAsInPyTorch) {
  // PyTorch gives a zero-size shard offset global_shape[d], wherever its
  // parent chunk ends. [8] on (2, 3) with (S(0), S(0)): 8 -> 4 | 4, then
  // 4 -> 2, 2, 0; coordinate (0, 2) is empty inside [0, 4).
  const std::vector<int64_t> mesh = {2, 3};
  EXPECT_EQ(MustLayout({8}, mesh, {S(0), S(0)}, {0, 2}), Layout({0}, {8}));
  EXPECT_EQ(MustLayout({8}, mesh, {S(0), S(0)}, {1, 2}), Layout({0}, {8}));
  EXPECT_EQ(MustLayout({8}, mesh, {S(0), S(0)}, {1, 1}), Layout({2}, {6}));
  // An empty parent chunk stays at the extent when split again: [1] on
  // (2, 3) gives 1 | 0, and coordinate (1, *) is empty.
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_EQ(MustLayout({1, 4}, mesh, {S(0), S(0)}, {1, j}), Layout({0, 4}, {1, 0})) << j;
  }
  // Single level: the trailing empty chunk of 5 on 4 is at 5 too.
  EXPECT_EQ(MustLayout({7, 5}, {4}, {S(1)}, {3}), Layout({7, 0}, {0, 5}));
  // A zero-size tensor dim: every shard is empty, at offset 0 = the extent.
  EXPECT_EQ(MustLayout({0, 3}, mesh, {S(0), S(1)}, {1, 2}), Layout({0, 1}, {0, 2}));
}

TEST(ComputeLocalLayoutTest, ThreeDimMesh) {
  const std::vector<int64_t> mesh = {2, 2, 3};
  // [10, 4] with (S(0), R, S(0)): 10 -> 5 | 5 on dim 0; 5 -> 2, 2, 1 on dim 2.
  EXPECT_EQ(MustLayout({10, 4}, mesh, {S(0), R, S(0)}, {1, 1, 2}), Layout({1, 4}, {9, 0}));
  EXPECT_EQ(MustLayout({10, 4}, mesh, {S(0), R, S(0)}, {1, 0, 1}), Layout({2, 4}, {7, 0}));
  // (S(1), S(0), S(1)): cols 4 -> 2 | 2 -> 1, 1, 0; rows 10 -> 5 | 5.
  EXPECT_EQ(MustLayout({10, 4}, mesh, {S(1), S(0), S(1)}, {1, 1, 1}), Layout({5, 1}, {5, 3}));
  EXPECT_EQ(MustLayout({10, 4}, mesh, {S(1), S(0), S(1)}, {1, 0, 2}), Layout({5, 0}, {0, 4}));
}

TEST(ComputeLocalLayoutTest, Errors) {
  const std::vector<int64_t> mesh = {2, 2};
  ExpectInvalid(
      ComputeLocalLayout(std::vector<int64_t>{4}, mesh, {S(0)}, std::vector<int64_t>{0, 0})
          .status(),
      "has 2");
  ExpectInvalid(
      ComputeLocalLayout(std::vector<int64_t>{4}, mesh, {S(0), S(1)}, std::vector<int64_t>{0, 0})
          .status(),
      "mesh dim 1");
  ExpectInvalid(
      ComputeLocalLayout(std::vector<int64_t>{-4}, mesh, {S(0), R}, std::vector<int64_t>{0, 0})
          .status(),
      "negative size -4");
  ExpectInvalid(
      ComputeLocalLayout(std::vector<int64_t>{4}, mesh, {S(0), R}, std::vector<int64_t>{0, 2})
          .status(),
      "outside the mesh (2, 2) at mesh dim 1");
  ExpectInvalid(
      ComputeLocalLayout(std::vector<int64_t>{4}, mesh, {S(0), R}, std::vector<int64_t>{0})
          .status(),
      "coordinate (0) has 1 dims");
}

// Every global element lies in exactly one shard among the ranks whose
// coordinate is 0 on every non-Shard mesh dim (one representative per
// Replicate/Partial group), and every rank of such a group holds the same box.
TEST(ComputeLocalLayoutTest, RandomShardsTileTheGlobalTensorOnce) {
  const uint32_t seed = 20240611;
  std::mt19937 rng(seed);
  std::printf("seed %u\n", seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int iteration = 0; iteration < 2000; ++iteration) {
    const int rank = uniform(0, 3);
    std::vector<int64_t> global(rank);
    int64_t numel = 1;
    for (int64_t& g : global) {
      g = uniform(0, 9);
      numel *= g;
    }
    const int ndim = uniform(1, 3);
    std::vector<int64_t> mesh(ndim);
    int64_t ranks = 1;
    for (int64_t& m : mesh) {
      m = uniform(1, 4);
      ranks *= m;
    }
    Placements placements(ndim);
    for (Placement& p : placements) {
      const int pick = uniform(0, rank == 0 ? 1 : 3);
      if (pick == 0) p = R;
      if (pick == 1) p = P();
      if (pick >= 2) p = S(uniform(0, rank - 1));
    }
    SCOPED_TRACE(testing::Message()
                 << "iteration " << iteration << " global [" << testing::PrintToString(global)
                 << "] mesh " << testing::PrintToString(mesh) << " "
                 << PlacementsToString(placements));
    std::vector<int> hits(numel, 0);
    std::vector<int64_t> coordinate(ndim, 0);
    for (int64_t r = 0; r < ranks; ++r) {
      int64_t rest = r;
      for (int i = ndim - 1; i >= 0; --i) {
        coordinate[i] = rest % mesh[i];
        rest /= mesh[i];
      }
      const LocalLayout layout = MustLayout(global, mesh, placements, coordinate);
      ASSERT_EQ(layout.shape.size(), global.size());
      // The representative of this rank's Replicate/Partial group.
      std::vector<int64_t> representative = coordinate;
      bool is_representative = true;
      for (int i = 0; i < ndim; ++i) {
        if (!placements[i].is_shard()) {
          is_representative = is_representative && coordinate[i] == 0;
          representative[i] = 0;
        }
      }
      ASSERT_EQ(layout, MustLayout(global, mesh, placements, representative));
      for (int d = 0; d < rank; ++d) {
        ASSERT_GE(layout.shape[d], 0);
        ASSERT_GE(layout.offset[d], 0);
        ASSERT_LE(layout.offset[d] + layout.shape[d], global[d]);
      }
      if (!is_representative) continue;
      // Mark the box.
      int64_t box = 1;
      for (int64_t s : layout.shape) box *= s;
      for (int64_t e = 0; e < box; ++e) {
        int64_t rest_e = e;
        int64_t flat = 0;
        int64_t stride = 1;
        for (int d = rank - 1; d >= 0; --d) {
          const int64_t index = layout.offset[d] + rest_e % layout.shape[d];
          rest_e /= layout.shape[d];
          flat += index * stride;
          stride *= global[d];
        }
        ++hits[flat];
      }
    }
    for (int64_t e = 0; e < numel; ++e) ASSERT_EQ(hits[e], 1) << "element " << e;
  }
}

}  // namespace placement_test
}  // namespace mesh
