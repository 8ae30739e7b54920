// The NCCL backend's argument checks: everything it rejects is rejected here,
// before any CUDA or NCCL call, so these run without a GPU. The tensors are
// views over host buffers labelled cuda:N; nothing dereferences them.
#include "backends/nccl/nccl_checks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace mesh::nccl {
namespace nccl_checks_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr Device kCuda0 = Device::Cuda(0);

// Storage for fake device tensors: big enough for every shape below.
alignas(64) char g_buffer[1 << 16];
alignas(64) char g_other[1 << 16];

Tensor View(DType dtype, std::vector<int64_t> shape, Device device = kCuda0,
            void* data = g_buffer) {
  return Tensor::Contiguous(data, dtype, shape, device);
}

GroupView Group(int rank, int size) {
  GroupView g;
  g.name = "mesh/tp/1";
  g.rank = rank;
  g.size = size;
  g.device = kCuda0;
  return g;
}

void ExpectInvalid(const absl::Status& s, absl::string_view fragment) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(std::string(fragment))) << s;
}

TEST(NcclCheckTensor, AcceptsContiguousTensorsOnTheGroupDevice) {
  for (DType dtype : kAllDTypes) {
    EXPECT_TRUE(CheckTensor(Group(0, 2), "all_reduce", "tensor", View(dtype, {4, 3}), {}).ok())
        << DTypeName(dtype);
  }
  // Zero elements and 0-dim scalars are contiguous too.
  EXPECT_TRUE(
      CheckTensor(Group(0, 2), "all_reduce", "tensor", View(DType::kFloat32, {0}), {}).ok());
  EXPECT_TRUE(CheckTensor(Group(0, 2), "all_reduce", "tensor", View(DType::kFloat32, {}), {}).ok());
}

TEST(NcclCheckTensor, RejectsCpuAndOtherDevicesNamingBoth) {
  absl::Status cpu = CheckTensor(Group(0, 2), "broadcast", "tensor",
                                 View(DType::kFloat32, {4}, Device::Cpu()), {});
  ExpectInvalid(cpu, "is on cpu but the group runs on cuda:0");
  EXPECT_THAT(std::string(cpu.message()), HasSubstr("'mesh/tp/1' broadcast"));
  ExpectInvalid(CheckTensor(Group(0, 2), "broadcast", "input",
                            View(DType::kFloat32, {4}, Device::Cuda(1)), {}),
                "input is on cuda:1");
}

TEST(NcclCheckTensor, RejectsNonContiguousViews) {
  // A transposed [3, 4] view: strides [1, 3].
  const int64_t shape[] = {4, 3};
  const int64_t strides[] = {1, 4};
  Tensor transposed(g_buffer, DType::kFloat32, shape, strides, kCuda0);
  ASSERT_FALSE(transposed.is_contiguous());
  ExpectInvalid(CheckTensor(Group(0, 2), "all_gather", "output", transposed, {}),
                "output is not contiguous");
  // A narrowed column is not contiguous either; a narrowed row block is.
  Tensor base = View(DType::kInt32, {4, 6});
  EXPECT_FALSE(CheckTensor(Group(0, 2), "x", "t", *base.Narrow(1, 0, 3), {}).ok());
  EXPECT_TRUE(CheckTensor(Group(0, 2), "x", "t", *base.Narrow(0, 1, 2), {}).ok());
}

TEST(NcclCheckTensor, Bfloat16NeedsTheCapability) {
  NcclCaps old;
  old.bfloat16 = false;
  ExpectInvalid(CheckTensor(Group(0, 2), "all_reduce", "tensor", View(DType::kBFloat16, {2}), old),
                "NCCL >= 2.10");
  EXPECT_TRUE(
      CheckTensor(Group(0, 2), "all_reduce", "tensor", View(DType::kFloat16, {2}), old).ok());
}

TEST(NcclCheckReduceOp, BoolTakesOnlyMinAndMax) {
  const GroupView g = Group(0, 2);
  EXPECT_TRUE(CheckReduceOp(g, "all_reduce", DType::kBool, ReduceOp::kMin, {}).ok());
  EXPECT_TRUE(CheckReduceOp(g, "all_reduce", DType::kBool, ReduceOp::kMax, {}).ok());
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd}) {
    ExpectInvalid(CheckReduceOp(g, "all_reduce", DType::kBool, op, {}), "not defined for bool");
  }
  // Every reduction exists for the other dtypes (kAvg on integers truncates).
  for (DType dtype : kAllDTypes) {
    if (dtype == DType::kBool) continue;
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd}) {
      EXPECT_TRUE(CheckReduceOp(g, "reduce", dtype, op, {}).ok()) << DTypeName(dtype);
    }
  }
}

TEST(NcclCheckReduceOp, AvgNeedsTheCapability) {
  NcclCaps old;
  old.avg = false;
  ExpectInvalid(CheckReduceOp(Group(0, 2), "all_reduce", DType::kFloat32, ReduceOp::kAvg, old),
                "'avg' needs NCCL >= 2.10");
  EXPECT_TRUE(CheckReduceOp(Group(0, 2), "all_reduce", DType::kFloat32, ReduceOp::kSum, old).ok());
}

TEST(NcclCheckRootAndPeer, Ranges) {
  const GroupView g = Group(1, 3);
  EXPECT_TRUE(CheckRoot(g, "broadcast", 0).ok());
  EXPECT_TRUE(CheckRoot(g, "broadcast", 1).ok());  // The caller may be the root.
  EXPECT_TRUE(CheckRoot(g, "broadcast", 2).ok());
  ExpectInvalid(CheckRoot(g, "broadcast", 3), "root 3 is not a group rank (0..2)");
  ExpectInvalid(CheckRoot(g, "reduce", -1), "root -1");
  EXPECT_TRUE(CheckPeer(g, "send", 0).ok());
  EXPECT_TRUE(CheckPeer(g, "send", 2).ok());
  ExpectInvalid(CheckPeer(g, "send", 1), "this rank itself");
  ExpectInvalid(CheckPeer(g, "recv", 3), "peer 3 is not a group rank");
  ExpectInvalid(CheckPeer(g, "recv", -2), "peer -2");
}

TEST(NcclCheckSizes, AllGatherAndReduceScatter) {
  const GroupView g = Group(0, 4);
  EXPECT_TRUE(CheckAllGatherSizes(g, View(DType::kFloat32, {3}), View(DType::kFloat32, {12})).ok());
  // Shapes are not checked beyond numel.
  EXPECT_TRUE(
      CheckAllGatherSizes(g, View(DType::kFloat32, {3}), View(DType::kFloat32, {4, 3})).ok());
  EXPECT_TRUE(CheckAllGatherSizes(g, View(DType::kFloat32, {0}), View(DType::kFloat32, {0})).ok());
  ExpectInvalid(CheckAllGatherSizes(g, View(DType::kFloat32, {3}), View(DType::kFloat32, {11})),
                "output has 11 elements; it needs group size (4) x input elements (3)");
  EXPECT_TRUE(
      CheckReduceScatterSizes(g, View(DType::kFloat32, {8}), View(DType::kFloat32, {2})).ok());
  ExpectInvalid(CheckReduceScatterSizes(g, View(DType::kFloat32, {9}), View(DType::kFloat32, {2})),
                "input has 9 elements; it needs group size (4) x output elements (2)");
  ExpectInvalid(
      CheckSameDType(g, "all_gather", View(DType::kFloat32, {1}), View(DType::kInt32, {4})),
      "input is float32 but output is int32");
}

TEST(NcclPlanAllToAll, EqualSplitsCountRowsOfDimZero) {
  const GroupView g = Group(0, 3);
  absl::StatusOr<AllToAllPlan> plan =
      PlanAllToAll(g, View(DType::kFloat32, {6, 2}, kCuda0, g_buffer),
                   View(DType::kFloat32, {6, 2}, kCuda0, g_other), {}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->send_counts, ElementsAre(4, 4, 4));
  EXPECT_THAT(plan->send_offsets, ElementsAre(0, 4, 8));
  EXPECT_THAT(plan->recv_counts, ElementsAre(4, 4, 4));
  EXPECT_THAT(plan->recv_offsets, ElementsAre(0, 4, 8));
}

TEST(NcclPlanAllToAll, UnevenSplitsAllowEmptyChunks) {
  const GroupView g = Group(1, 3);
  const std::vector<int64_t> in_splits = {0, 3, 1};
  const std::vector<int64_t> out_splits = {2, 0, 5};
  absl::StatusOr<AllToAllPlan> plan =
      PlanAllToAll(g, View(DType::kInt64, {4, 5}, kCuda0, g_buffer),
                   View(DType::kInt64, {7, 5}, kCuda0, g_other), in_splits, out_splits);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->send_counts, ElementsAre(0, 15, 5));
  EXPECT_THAT(plan->send_offsets, ElementsAre(0, 0, 15));
  EXPECT_THAT(plan->recv_counts, ElementsAre(10, 0, 25));
  EXPECT_THAT(plan->recv_offsets, ElementsAre(0, 10, 10));
}

TEST(NcclPlanAllToAll, OneSideMayUseEqualSplits) {
  const std::vector<int64_t> out_splits = {1, 3};
  absl::StatusOr<AllToAllPlan> plan =
      PlanAllToAll(Group(0, 2), View(DType::kUInt8, {4}, kCuda0, g_buffer),
                   View(DType::kUInt8, {4}, kCuda0, g_other), {}, out_splits);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->send_counts, ElementsAre(2, 2));
  EXPECT_THAT(plan->recv_counts, ElementsAre(1, 3));
}

TEST(NcclPlanAllToAll, RejectsBadSplitsAndShapes) {
  const GroupView g = Group(0, 3);
  const Tensor in = View(DType::kFloat32, {6, 2}, kCuda0, g_buffer);
  const Tensor out = View(DType::kFloat32, {6, 2}, kCuda0, g_other);
  ExpectInvalid(
      PlanAllToAll(g, View(DType::kFloat32, {5, 2}, kCuda0, g_buffer), out, {}, {}).status(),
      "input dim 0 (5) is not divisible by the group size (3)");
  const std::vector<int64_t> two = {3, 3};
  ExpectInvalid(PlanAllToAll(g, in, out, two, {}).status(),
                "input_splits has 2 entries; it needs one per member (3)");
  const std::vector<int64_t> negative = {3, -1, 4};
  ExpectInvalid(PlanAllToAll(g, in, out, {}, negative).status(), "output_splits[1] is negative");
  const std::vector<int64_t> short_sum = {1, 2, 2};
  ExpectInvalid(PlanAllToAll(g, in, out, short_sum, {}).status(), "sum to 5, not input dim 0 (6)");
  const std::vector<int64_t> long_sum = {4, 4, 0};
  ExpectInvalid(PlanAllToAll(g, in, out, long_sum, {}).status(), "sum to more than input dim 0");
  ExpectInvalid(PlanAllToAll(g, View(DType::kFloat32, {}, kCuda0, g_buffer), out, {}, {}).status(),
                "at least one dimension");
  ExpectInvalid(
      PlanAllToAll(g, in, View(DType::kFloat32, {4, 3}, kCuda0, g_other), {}, {}).status(),
      "input rows have 2 elements but output rows 3");
}

TEST(NcclPlanAllToAll, RejectsOverlappingInputAndOutput) {
  const GroupView g = Group(0, 2);
  Tensor whole = View(DType::kFloat32, {8});
  ExpectInvalid(PlanAllToAll(g, whole, whole, {}, {}).status(), "overlap");
  ExpectInvalid(PlanAllToAll(g, *whole.Narrow(0, 0, 4), *whole.Narrow(0, 2, 4), {}, {}).status(),
                "overlap");
  // Adjacent halves do not overlap.
  EXPECT_TRUE(PlanAllToAll(g, *whole.Narrow(0, 0, 4), *whole.Narrow(0, 4, 4), {}, {}).ok());
}

GroupSpec Spec(std::string family, int color, std::vector<int> ranks) {
  GroupSpec spec;
  spec.family = std::move(family);
  spec.color = color;
  spec.global_ranks = std::move(ranks);
  return spec;
}

TEST(NcclCheckGroupSpecs, ReturnsTheCallersGroupRankPerSpec) {
  // Rank 5 of a (2, 4) mesh: replicate group {1, 5}, shard group {4..7}.
  const std::vector<GroupSpec> specs = {Spec("mesh/dp", 1, {1, 5}),
                                        Spec("mesh/tp", 1, {4, 5, 6, 7})};
  absl::StatusOr<std::vector<int>> ranks = CheckGroupSpecs(specs, 5, 8);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  EXPECT_THAT(*ranks, ElementsAre(1, 1));
  EXPECT_TRUE(CheckGroupSpecs({}, 0, 1).ok());
}

TEST(NcclCheckGroupSpecs, RejectsBadSpecs) {
  auto check = [](std::vector<GroupSpec> specs) { return CheckGroupSpecs(specs, 2, 4).status(); };
  ExpectInvalid(check({Spec("a", 0, {1, 3})}), "do not include this rank (2)");
  ExpectInvalid(check({Spec("a", 0, {2, 2})}), "rank 2 is listed twice");
  ExpectInvalid(check({Spec("a", 0, {2, 4})}), "rank 4 is outside the world (0..3)");
  ExpectInvalid(check({Spec("a", 0, {-1, 2})}), "rank -1 is outside");
  ExpectInvalid(check({Spec("a", -1, {2})}), "color must be >= 0");
  ExpectInvalid(check({Spec("", 0, {2})}), "family name is empty");
  ExpectInvalid(check({Spec("a", 0, {})}), "no members");
  ExpectInvalid(check({Spec("a", 0, {2}), Spec("a", 1, {2, 3})}), "family 'a' appears twice");
}

NcclProcessGroupFactoryOptions GoodOptions() {
  NcclProcessGroupFactoryOptions options;
  options.world_rank = 1;
  options.world_size = 2;
  options.world_unique_id.assign(kNcclUniqueIdBytes, '\x7f');
  return options;
}

TEST(NcclCheckFactoryOptions, AcceptsSensibleOptions) {
  EXPECT_TRUE(CheckFactoryOptions(GoodOptions()).ok());
}

TEST(NcclCheckFactoryOptions, RejectsEachBadField) {
  auto with = [](auto change) {
    NcclProcessGroupFactoryOptions options = GoodOptions();
    change(options);
    return CheckFactoryOptions(options);
  };
  ExpectInvalid(with([](auto& o) { o.world_size = 0; }), "world_size is 0");
  ExpectInvalid(with([](auto& o) { o.world_rank = 2; }), "world_rank 2 is outside the world");
  ExpectInvalid(with([](auto& o) { o.world_rank = -1; }), "world_rank -1");
  ExpectInvalid(with([](auto& o) { o.world_unique_id.pop_back(); }), "has 127 bytes");
  ExpectInvalid(with([](auto& o) { o.world_unique_id.clear(); }), "has 0 bytes");
  ExpectInvalid(with([](auto& o) { o.device = Device::Cpu(); }), "device is cpu");
  ExpectInvalid(with([](auto& o) { o.init_timeout = absl::ZeroDuration(); }), "init_timeout");
  ExpectInvalid(with([](auto& o) { o.init_timeout = absl::InfiniteDuration(); }), "init_timeout");
  ExpectInvalid(with([](auto& o) { o.group_options.timeout = absl::Seconds(-1); }),
                "group_options.timeout");
  ExpectInvalid(with([](auto& o) { o.watchdog_interval = absl::ZeroDuration(); }),
                "watchdog_interval");
  ExpectInvalid(with([](auto& o) { o.destroy_timeout = absl::Seconds(-1); }), "destroy_timeout");
  EXPECT_TRUE(with([](auto& o) { o.destroy_timeout = absl::ZeroDuration(); }).ok());
}

}  // namespace nccl_checks_test
}  // namespace mesh::nccl
