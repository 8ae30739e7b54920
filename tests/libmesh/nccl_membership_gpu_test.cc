// Label gpu: in-place recovery's memberships on real devices. Every test
// skips cleanly without NCCL or without enough CUDA devices.
//
// A world of one proves the membership communicator and the groups split
// from it; a shrink needs a rank to exclude, so it needs two GPUs (NCCL
// refuses two ranks of one communicator on one device), ranks as threads.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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

// Two ranks make a membership and a group from it; rank 1 then leaves (as a
// lost rank would), and rank 0 alone shrinks the membership
// (ncclCommShrink, NCCL_SHRINK_ABORT) and runs a collective on a group
// split from the shrunk one.
TEST(NcclMembershipGpuTest, TheSurvivorShrinksTheMembershipAndCarriesOn) {
  if (!HaveNcclAndDevice(2)) GTEST_SKIP() << "needs NCCL and two CUDA devices";
  absl::StatusOr<std::string> id = GenerateNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::string> failures(2);
  std::atomic<bool> rank1_gone{false};
  auto rank_main = [&](int r) {
    auto fail = [&](const std::string& what, const absl::Status& s) {
      failures[r] = absl::StrCat(what, ": ", s.ToString());
    };
    auto factory = MakeFactory(r, 2, *id, store);
    if (!factory.ok()) return fail("Create", factory.status());
    auto both = (*factory)->NewMembership(Spec("e1/m", {0, 1}), nullptr);
    if (!both.ok()) return fail("NewMembership", both.status());
    auto groups = (*factory)->NewGroupsWithin(**both, {Spec("e1/dp", {0, 1})});
    if (!groups.ok()) return fail("NewGroupsWithin", groups.status());
    auto sum = SumOn(*(*groups)[0], {1.0 + r, 1.0 + r}, Device::Cuda(r));
    if (!sum.ok()) return fail("all_reduce of two", sum.status());
    if (*sum != std::vector<double>{3, 3}) failures[r] = "the sum of two is wrong";
    if (r == 1) {
      groups->clear();
      both->reset();
      factory->reset();
      return;
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!rank1_gone && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    if (!rank1_gone) return fail("rank 1", absl::DeadlineExceededError("never left"));
    auto alone = (*factory)->NewMembership(Spec("e2/m", {0}), *both);
    if (!alone.ok()) return fail("the shrink", alone.status());
    both->reset();
    auto solo = (*factory)->NewGroupsWithin(**alone, {Spec("e2/dp", {0})});
    if (!solo.ok()) return fail("a split of the shrunk membership", solo.status());
    sum = SumOn(*(*solo)[0], {5, 6}, Device::Cuda(0));
    if (!sum.ok()) return fail("all_reduce of one", sum.status());
    if (*sum != std::vector<double>{5, 6}) failures[r] = "the sum of one is wrong";
  };
  std::thread rank1([&] {
    rank_main(1);
    rank1_gone = true;  // Gone, whether it got there or failed.
  });
  rank_main(0);
  rank1.join();
  EXPECT_EQ(failures[0], "");
  EXPECT_EQ(failures[1], "");
}

}  // namespace
}  // namespace nccl_membership_gpu_test
}  // namespace mesh
