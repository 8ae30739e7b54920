// What NcclProcessGroupFactory and friends do before (or without) a GPU:
// option validation, the no-device and no-NCCL answers, unique-id
// generation, and SynchronizeWork over a fake Work. Runs on every machine;
// the GPU behaviour is in process_group_nccl_gpu_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>

#include "mesh/build_info.h"
#include "mesh/process_group_nccl.h"
#include "mesh/runtime.h"

namespace mesh {
namespace nccl_factory_test {

using ::testing::HasSubstr;

NcclProcessGroupFactoryOptions Options() {
  NcclProcessGroupFactoryOptions options;
  options.world_rank = 0;
  options.world_size = 1;
  options.world_unique_id.assign(kNcclUniqueIdBytes, '\0');
  options.init_timeout = absl::Seconds(5);
  return options;
}

TEST(NcclFactoryCreate, RejectsBadOptionsBeforeTouchingCuda) {
  NcclProcessGroupFactoryOptions options = Options();
  options.world_unique_id = "short";
  auto factory = NcclProcessGroupFactory::Create(options);
  ASSERT_FALSE(factory.ok());
  if (!GetBuildInfo().has_nccl) {
    EXPECT_EQ(factory.status().code(), absl::StatusCode::kUnimplemented) << factory.status();
    return;
  }
  EXPECT_EQ(factory.status().code(), absl::StatusCode::kInvalidArgument) << factory.status();
  EXPECT_THAT(std::string(factory.status().message()), HasSubstr("world_unique_id has 5 bytes"));
}

TEST(NcclFactoryCreate, NeedsAVisibleDevice) {
  if (GetBuildInfo().has_nccl && CudaDeviceCount() > 0) {
    GTEST_SKIP() << "a CUDA device is visible; the GPU tests cover creation";
  }
  auto factory = NcclProcessGroupFactory::Create(Options());
  ASSERT_FALSE(factory.ok());
  if (!GetBuildInfo().has_nccl) {
    EXPECT_EQ(factory.status().code(), absl::StatusCode::kUnimplemented) << factory.status();
    EXPECT_THAT(std::string(factory.status().message()), HasSubstr("built without NCCL"));
    return;
  }
  EXPECT_EQ(factory.status().code(), absl::StatusCode::kFailedPrecondition) << factory.status();
  EXPECT_THAT(std::string(factory.status().message()), HasSubstr("none is visible"));
}

TEST(NcclDefaultDeviceIndex, OwnGpusUnderTheAgentEveryGpuUnderTorchrun) {
  // The agent's CUDA_VISIBLE_DEVICES shows each of 4 local ranks its own GPU.
  for (int local_rank = 0; local_rank < 4; ++local_rank) {
    EXPECT_EQ(NcclDefaultDeviceIndex(local_rank, 4, 1), 0) << local_rank;
  }
  // Two GPUs each (gpus_per_proc 2): still only the rank's own.
  EXPECT_EQ(NcclDefaultDeviceIndex(3, 4, 2), 0);
  // Every GPU visible, one per local rank (torchrun): cuda:<local rank>.
  for (int local_rank = 0; local_rank < 8; ++local_rank) {
    EXPECT_EQ(NcclDefaultDeviceIndex(local_rank, 8, 8), local_rank) << local_rank;
  }
  // One worker with the whole node.
  EXPECT_EQ(NcclDefaultDeviceIndex(0, 1, 8), 0);
  // No device at all: cuda:0, which the factory then reports as missing.
  EXPECT_EQ(NcclDefaultDeviceIndex(2, 4, 0), 0);
}

TEST(GenerateNcclUniqueId, GivesFreshOneHundredTwentyEightByteIds) {
  absl::StatusOr<std::string> a = GenerateNcclUniqueId();
  if (!GetBuildInfo().has_nccl) {
    EXPECT_EQ(a.status().code(), absl::StatusCode::kUnimplemented) << a.status();
    return;
  }
  // Needs no GPU: only NCCL's bootstrap network (a socket).
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::string> b = GenerateNcclUniqueId();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->size(), kNcclUniqueIdBytes);
  EXPECT_EQ(b->size(), kNcclUniqueIdBytes);
  EXPECT_NE(*a, *b);
}

// A Work that completes after a set number of IsCompleted polls (or never).
class FakeWork final : public Work {
 public:
  FakeWork(int polls_until_done, absl::Status result)
      : remaining_(polls_until_done), result_(std::move(result)) {}

  absl::Status Wait(absl::Duration) override { return absl::UnimplementedError("not used"); }
  bool IsCompleted() const override {
    polls_.fetch_add(1);
    return remaining_ >= 0 && polls_.load() > remaining_;
  }
  absl::Status status() const override {
    if (!IsCompleted()) return absl::FailedPreconditionError("still pending");
    return result_;
  }
  void Abort(absl::Status) override {}
  int polls() const { return polls_.load(); }

 protected:
  absl::Duration default_timeout() const override { return absl::Seconds(1); }

 private:
  const int remaining_;  // < 0: never completes.
  const absl::Status result_;
  mutable std::atomic<int> polls_{0};
};

TEST(SynchronizeWork, ReturnsTheStatusOnceCompleted) {
  FakeWork ok(/*polls_until_done=*/10, absl::OkStatus());
  EXPECT_TRUE(SynchronizeWork(ok, absl::Seconds(10)).ok());
  EXPECT_GE(ok.polls(), 10);

  FakeWork failed(/*polls_until_done=*/0, absl::UnavailableError("peer 3 died"));
  absl::Status s = SynchronizeWork(failed, absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "peer 3 died");
}

TEST(SynchronizeWork, GivesUpAtTheTimeout) {
  FakeWork never(/*polls_until_done=*/-1, absl::OkStatus());
  const absl::Time start = absl::Now();
  absl::Status s = SynchronizeWork(never, absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_GT(never.polls(), 1);
}

}  // namespace nccl_factory_test
}  // namespace mesh
