// Label gpu: in-place recovery's memberships on real devices. Every test
// skips cleanly without NCCL or without enough CUDA devices.
//
// A world of one proves the membership communicator and the groups split
// from it; a shrink needs a rank to exclude and two to keep, so it needs
// three GPUs (NCCL refuses two ranks of one communicator on one device),
// ranks as threads.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/build_info.h"
#include "mesh/in_memory_store.h"
#include "mesh/process_group_nccl.h"
#include "mesh/tensor.h"
#include "tests/libmesh/nccl_gpu_test_util.h"

namespace mesh {
namespace nccl_membership_gpu_test {
namespace {

using nccl_gpu_test::Download;
using nccl_gpu_test::HaveNcclAndDevice;
using nccl_gpu_test::Iota;
using nccl_gpu_test::kSync;
using nccl_gpu_test::Upload;

// Rank `rank` of a world of `size` on cuda:`rank`, brokering over `store`.
absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> MakeFactory(int rank, int size,
                                                                     const std::string& world_id,
                                                                     std::shared_ptr<Store> store) {
  NcclProcessGroupFactoryOptions options;
  options.world_rank = rank;
  options.world_size = size;
  options.device = Device::Cuda(rank);
  options.world_unique_id = world_id;
  options.init_timeout = absl::Seconds(60);
  options.group_options.timeout = absl::Seconds(60);
  options.destroy_timeout = absl::Seconds(10);
  options.store = std::move(store);
  return NcclProcessGroupFactory::Create(std::move(options));
}

// An all-reduce (sum) of `values` on `group`, read back.
absl::StatusOr<std::vector<double>> SumOn(ProcessGroup& group, const std::vector<double>& values,
                                          Device device) {
  absl::StatusOr<Tensor> t =
      Upload(DType::kFloat32, {static_cast<int64_t>(values.size())}, values, device);
  if (!t.ok()) return t.status();
  auto work = group.AllReduce(*t, ReduceOp::kSum);
  if (!work.ok()) return work.status();
  if (absl::Status s = SynchronizeWork(**work, kSync); !s.ok()) return s;
  return Download(*t);
}

GroupSpec Spec(std::string family, std::vector<int> ranks) {
  return GroupSpec{std::move(family), 0, std::move(ranks)};
}

TEST(NcclMembershipGpuTest, AWorldOfOnesMembershipSplitsWorkingGroupsAndIsShared) {
  if (!HaveNcclAndDevice(1)) GTEST_SKIP() << "needs NCCL and a CUDA device";
  absl::StatusOr<std::string> id = GenerateNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto factory = MakeFactory(0, 1, *id, std::make_shared<InMemoryStore>());
  ASSERT_TRUE(factory.ok()) << factory.status();
  if (!(*factory)->splits_communicators()) GTEST_SKIP() << "NCCL < 2.19: no ncclCommSplit";
  auto first = (*factory)->NewMembership(Spec("e1/m", {0}), nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = (*factory)->NewMembership(Spec("e2/m", {0}), *first);
  ASSERT_TRUE(second.ok()) << second.status();
  first->reset();
  auto groups = (*factory)->NewGroupsWithin(**second, {Spec("e2/dp", {0})});
  ASSERT_TRUE(groups.ok()) << groups.status();
  auto sum = SumOn(*(*groups)[0], Iota(6), Device::Cuda(0));
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, Iota(6));
  second->reset();  // ncclCommAbort of the membership; its split child stays usable.
  sum = SumOn(*(*groups)[0], Iota(6), Device::Cuda(0));
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, Iota(6));
}

// Three ranks make a membership and a group from it; rank 2 then leaves
// (its process is gone, as a lost rank's would be), and ranks 0 and 1
// derive their membership from the three's: ncclCommShrink with
// NCCL_SHRINK_ABORT, which exchanges no unique ID (the store gets no key for
// it, where a new membership of two would need one), then a group split from
// the shrunk communicator runs a collective.
TEST(NcclMembershipGpuTest, TheSurvivorsShrinkTheMembershipAndCarryOn) {
  if (!HaveNcclAndDevice(3)) GTEST_SKIP() << "needs NCCL and three CUDA devices";
  absl::StatusOr<int> version = NcclRuntimeVersion();
  ASSERT_TRUE(version.ok()) << version.status();
  if (*version < 22700) GTEST_SKIP() << "ncclCommShrink needs NCCL >= 2.27, not " << *version;
  absl::StatusOr<std::string> id = GenerateNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::string> failures(3);
  std::atomic<bool> rank2_gone{false};
  auto rank_main = [&](int r) {
    auto fail = [&](const std::string& what, const absl::Status& s) {
      failures[r] = absl::StrCat(what, ": ", s.ToString());
    };
    auto factory = MakeFactory(r, 3, *id, store);
    if (!factory.ok()) return fail("Create", factory.status());
    auto all = (*factory)->NewMembership(Spec("e1/m", {0, 1, 2}), nullptr);
    if (!all.ok()) return fail("NewMembership", all.status());
    auto groups = (*factory)->NewGroupsWithin(**all, {Spec("e1/dp", {0, 1, 2})});
    if (!groups.ok()) return fail("NewGroupsWithin", groups.status());
    auto sum = SumOn(*(*groups)[0], {1.0 + r, 1.0 + r}, Device::Cuda(r));
    if (!sum.ok()) return fail("all_reduce of three", sum.status());
    if (*sum != std::vector<double>{6, 6}) failures[r] = "the sum of three is wrong";
    if (r == 2) {
      groups->clear();
      all->reset();
      factory->reset();
      return;
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!rank2_gone && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    if (!rank2_gone) return fail("rank 2", absl::DeadlineExceededError("never left"));
    groups->clear();
    auto two = (*factory)->NewMembership(Spec("e2/m", {0, 1}), *all);
    if (!two.ok()) return fail("the shrink", two.status());
    all->reset();
    auto pair = (*factory)->NewGroupsWithin(**two, {Spec("e2/dp", {0, 1})});
    if (!pair.ok()) return fail("a split of the shrunk membership", pair.status());
    sum = SumOn(*(*pair)[0], {5.0 + r, 6}, Device::Cuda(r));
    if (!sum.ok()) return fail("all_reduce of two", sum.status());
    if (*sum != std::vector<double>{11, 12}) failures[r] = "the sum of two is wrong";
  };
  std::thread rank2([&] {
    rank_main(2);
    rank2_gone = true;  // Gone, whether it got there or failed.
  });
  std::thread rank1(rank_main, 1);
  rank_main(0);
  rank1.join();
  rank2.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
  // A brokered membership of two would have left its unique ID here.
  EXPECT_FALSE(store->TryGet("nccl/uid/members/e2/m/0").ok()) << "not a shrink";
}

}  // namespace
}  // namespace nccl_membership_gpu_test
}  // namespace mesh
