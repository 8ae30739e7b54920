// Smoke only: small sizes, asserts the harness works and reports what it
// should; never asserts a time.
#include "bench/waiters_bench.h"

#include <gtest/gtest.h>

namespace mesh::bench {
namespace waiters_bench_smoke_test {

TEST(WaitersBenchSmoke, HoldsAndReleasesEveryKind) {
  WaitersBenchOptions options;
  options.ranks = 200;
  options.channels = 2;
  options.timeout = absl::Seconds(30);
  auto result = RunWaitersBench(options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->kinds.size(), 3u);
  const WaitKind expected[] = {WaitKind::kJoin, WaitKind::kBarrier, WaitKind::kGet};
  for (size_t i = 0; i < 3; ++i) {
    const WaitersResult& k = result->kinds[i];
    SCOPED_TRACE(WaitKindName(k.kind));
    EXPECT_EQ(k.kind, expected[i]);
    EXPECT_EQ(k.ranks, 200);
    // The coordinator saw all of them waiting at once...
    EXPECT_EQ(k.pending, 200);
    // ...and every one, plus the releasing call, completed OK.
    EXPECT_EQ(k.completed, 201);
    EXPECT_GT(k.before.threads, 0);
    EXPECT_GT(k.holding.threads, 0);
    EXPECT_GT(k.holding.rss_bytes, 0);
    EXPECT_GE(k.release_s, 0);
    EXPECT_GT(k.hold_s, 0);
  }
  const nlohmann::json json = ToJson(*result);
  EXPECT_EQ(json["benchmark"], "waiters");
  ASSERT_EQ(json["kinds"].size(), 3u);
  EXPECT_EQ(json["kinds"][1]["kind"], "barrier");
  EXPECT_EQ(json["kinds"][2]["pending"], 200);
  EXPECT_TRUE(json["kinds"][0]["holding"].contains("threads"));
}

TEST(WaitersBenchSmoke, RunsOneKind) {
  WaitersBenchOptions options;
  options.ranks = 50;
  options.kinds = {WaitKind::kGet};
  auto result = RunWaitersBench(options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->kinds.size(), 1u);
  EXPECT_EQ(result->kinds[0].kind, WaitKind::kGet);
  EXPECT_EQ(result->kinds[0].pending, 50);
  EXPECT_EQ(result->kinds[0].completed, 51);
}

TEST(WaitersBenchSmoke, ParsesKindsAndRejectsBadOptions) {
  EXPECT_EQ(*ParseWaitKind("join"), WaitKind::kJoin);
  EXPECT_EQ(*ParseWaitKind("barrier"), WaitKind::kBarrier);
  EXPECT_EQ(*ParseWaitKind("get"), WaitKind::kGet);
  EXPECT_EQ(ParseWaitKind("sleep").status().code(), absl::StatusCode::kInvalidArgument);

  WaitersBenchOptions bad;
  bad.ranks = 0;
  EXPECT_EQ(RunWaitersBench(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.ranks = 10;
  bad.kinds.clear();
  EXPECT_EQ(RunWaitersBench(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace waiters_bench_smoke_test
}  // namespace mesh::bench
