// Internals of the Gloo backend that need no peers: the host-completed Work
// and the reduction kernels.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "backends/gloo/gloo_reduce.h"
#include "mesh/float16.h"
#include "work_impl.h"

namespace mesh {
namespace process_group_gloo_internal_test {

using internal::HostWork;

TEST(HostWork, WaitReturnsTheCompletionStatusAndTheFirstCompletionWins) {
  HostWork work(absl::Seconds(5), nullptr);
  EXPECT_FALSE(work.IsCompleted());
  EXPECT_EQ(work.status().code(), absl::StatusCode::kFailedPrecondition);
  std::thread completer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    EXPECT_TRUE(work.Complete(absl::DataLossError("first")));
  });
  EXPECT_EQ(work.Wait(), absl::DataLossError("first"));
  completer.join();
  EXPECT_FALSE(work.Complete(absl::OkStatus()));
  EXPECT_EQ(work.status(), absl::DataLossError("first"));
  EXPECT_TRUE(work.IsCompleted());
}

TEST(HostWork, WaitTimesOutWithoutCompleting) {
  HostWork work(absl::Seconds(5), nullptr);
  const absl::Time start = absl::Now();
  EXPECT_EQ(work.Wait(absl::Milliseconds(30)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(30));
  EXPECT_EQ(work.Wait(absl::ZeroDuration()).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(work.Wait(-absl::Seconds(1)).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(work.IsCompleted());
}

TEST(HostWork, AbortHandsTheReasonToTheOwnerAndNeverAnOkStatus) {
  std::vector<absl::Status> reasons;
  HostWork work(absl::Seconds(5), [&](absl::Status reason) { reasons.push_back(reason); });
  work.Abort(absl::UnavailableError("rank 3 died"));
  work.Abort(absl::OkStatus());
  ASSERT_EQ(reasons.size(), 2u);
  EXPECT_EQ(reasons[0], absl::UnavailableError("rank 3 died"));
  EXPECT_EQ(reasons[1].code(), absl::StatusCode::kAborted);
  // The owner decides when the op is over.
  EXPECT_FALSE(work.IsCompleted());
  work.Complete(reasons[0]);
  work.Abort(absl::InternalError("after completion: ignored"));
  EXPECT_EQ(reasons.size(), 2u);
}

TEST(HostWork, AbortWithoutAnOwnerCompletesTheWork) {
  HostWork work(absl::Seconds(5), nullptr);
  work.Abort(absl::CancelledError("stop"));
  EXPECT_EQ(work.Wait(absl::ZeroDuration()), absl::CancelledError("stop"));
}

// ---- Reduction kernels -----------------------------------------------------

template <typename T>
std::vector<T> Apply(DType dtype, ReduceOp op, std::vector<T> a, const std::vector<T>& b) {
  auto fn = gloo_backend::MakeReduceFn(dtype, op);
  EXPECT_TRUE(fn.ok()) << fn.status();
  (*fn)(a.data(), a.data(), b.data(), a.size());  // In place, as gloo calls it.
  return a;
}

TEST(GlooReduceKernels, IntegersWrapInsteadOfOverflowing) {
  EXPECT_EQ(Apply<int8_t>(DType::kInt8, ReduceOp::kSum, {127, -128}, {1, -1}),
            (std::vector<int8_t>{-128, 127}));
  EXPECT_EQ(
      Apply<int32_t>(DType::kInt32, ReduceOp::kSum, {std::numeric_limits<int32_t>::max()}, {1}),
      (std::vector<int32_t>{std::numeric_limits<int32_t>::min()}));
  EXPECT_EQ(Apply<int64_t>(DType::kInt64, ReduceOp::kProd, {int64_t{1} << 62}, {4}),
            (std::vector<int64_t>{0}));
  EXPECT_EQ(Apply<uint8_t>(DType::kUInt8, ReduceOp::kProd, {255, 16}, {255, 16}),
            (std::vector<uint8_t>{1, 0}));
}

TEST(GlooReduceKernels, BoolIsLogicalAndOrAndOthersAreRejected) {
  EXPECT_EQ(Apply<uint8_t>(DType::kBool, ReduceOp::kMin, {0, 1, 1, 7}, {1, 0, 1, 1}),
            (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_EQ(Apply<uint8_t>(DType::kBool, ReduceOp::kMax, {0, 1, 0, 0}, {0, 0, 9, 0}),
            (std::vector<uint8_t>{0, 1, 1, 0}));
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd}) {
    EXPECT_EQ(gloo_backend::MakeReduceFn(DType::kBool, op).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(GlooReduceKernels, HalfTypesCombineInFloatAndRoundToNearestEven) {
  const auto h = [](float f) { return Float16(f); };
  auto sum = Apply<Float16>(DType::kFloat16, ReduceOp::kSum, {h(2048), h(1), h(65504)},
                            {h(1), h(0x1p-24f), h(32)});
  EXPECT_EQ(static_cast<float>(sum[0]), 2048.0f);  // 2049 ties to even.
  EXPECT_EQ(static_cast<float>(sum[1]), 1.0f);
  EXPECT_TRUE(std::isinf(static_cast<float>(sum[2])));  // Overflows to inf.
  const auto b = [](float f) { return BFloat16(f); };
  auto prod = Apply<BFloat16>(DType::kBFloat16, ReduceOp::kProd, {b(3), b(-0.5f)}, {b(7), b(8)});
  EXPECT_EQ(static_cast<float>(prod[0]), 21.0f);
  EXPECT_EQ(static_cast<float>(prod[1]), -4.0f);
  auto max = Apply<BFloat16>(DType::kBFloat16, ReduceOp::kMax, {b(NAN), b(1)}, {b(2), b(NAN)});
  EXPECT_TRUE(std::isnan(static_cast<float>(max[0])));
  EXPECT_TRUE(std::isnan(static_cast<float>(max[1])));
}

TEST(GlooReduceKernels, AverageDividesInTheDTypeAndTruncatesIntegers) {
  std::vector<int32_t> ints = {7, -7, 6};
  gloo_backend::DivideInPlace(DType::kInt32, ints.data(), ints.size(), 2);
  EXPECT_EQ(ints, (std::vector<int32_t>{3, -3, 3}));
  std::vector<float> floats = {1, 2};
  gloo_backend::DivideInPlace(DType::kFloat32, floats.data(), floats.size(), 3);
  EXPECT_EQ(floats[0], 1.0f / 3.0f);
  std::vector<Float16> halves = {Float16(1.0f)};
  gloo_backend::DivideInPlace(DType::kFloat16, halves.data(), halves.size(), 3);
  EXPECT_EQ(halves[0], Float16(1.0f / 3.0f));
}

}  // namespace process_group_gloo_internal_test
}  // namespace mesh
