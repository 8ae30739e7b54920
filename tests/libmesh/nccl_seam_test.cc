// The NCCL backend's state machines, driven through a scripted NcclApi
// (fake_nccl_api.h) on machines without a GPU: communicator creation,
// ncclCommSplit with the orders a real NCCL publishes its child in, aborts
// that must wait for a split job, the watchdog, and teardown.
//
// Each case scripts what NCCL reports, runs the real factory and groups
// (CreateNcclFactory over the fake), and asserts both the result the caller
// sees and the calls the backend made, in order. The fake records as a
// violation every call a real NCCL would punish: using a communicator after
// ncclCommAbort, aborting a parent while its split child is unpublished (the
// heap corruption seen on an H200), and calling into a communicator that is
// still in progress.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/nccl/nccl_factory.h"
#include "mesh/cuda_stream.h"
#include "mesh/process_group_nccl.h"
#include "tests/libmesh/fake_nccl_api.h"
#include "tests/libmesh/nccl_seam_test_util.h"

namespace mesh::nccl {
namespace nccl_seam_test {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using testing::FakeNcclApi;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

std::vector<GroupSpec> DpSpec() { return {GroupSpec{"mesh/dp", 0, {0}}}; }

class NcclSeamTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> Create(
      NcclProcessGroupFactoryOptions options = Options()) {
    return CreateNcclFactory(std::move(options), nullptr, api_);
  }

  // Teardown of a factory SplitDp kept is checked too.
  void TearDown() override {
    factory_.reset();
    EXPECT_THAT(api_.violations(), IsEmpty());
  }

  // Creates the factory (kept until TearDown) and splits mesh/dp/0 from the
  // world as scripted; null, with the test failed, unless both succeed.
  std::shared_ptr<ProcessGroup> SplitDp() {
    auto factory = Create();
    EXPECT_TRUE(factory.ok()) << factory.status();
    if (!factory.ok()) return nullptr;
    factory_ = *std::move(factory);
    auto groups = factory_->NewGroups(DpSpec());
    EXPECT_TRUE(groups.ok()) << groups.status();
    if (!groups.ok() || groups->size() != 1) return nullptr;
    EXPECT_EQ((*groups)[0]->name(), "mesh/dp/0");
    return (*groups)[0];
  }

  // Index of `entry` in the fake's log; fails the test when absent.
  int At(const std::string& entry) {
    const int index = api_.LogIndex(entry);
    EXPECT_GE(index, 0) << entry << " is not in the log";
    return index;
  }

  FakeNcclApi api_;  // Declared first: outlives the factory.
  std::unique_ptr<NcclProcessGroupFactory> factory_;
};

// ---- Creation (ncclCommInitRankConfig) ------------------------------------

TEST_F(NcclSeamTest, InitInProgressThenSuccessGivesAWorkingWorld) {
  api_.ScriptInit({.init_polls = 5});
  auto factory = Create();
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto world = (*factory)->World();
  ASSERT_TRUE(world.ok()) << world.status();
  FakeDeviceBuffer buffer;
  auto work = (*world)->AllReduce(buffer.tensor(), ReduceOp::kSum);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_TRUE((*work)->IsCompleted());
  EXPECT_TRUE((*work)->status().ok()) << (*work)->status();
  EXPECT_GE(At("AllReduce(world)"), 0);
}

TEST_F(NcclSeamTest, InitAsyncErrorIsUnavailableAndAbortsTheCommunicator) {
  api_.ScriptInit({.init_polls = 3, .init_result = ncclRemoteError});
  auto factory = Create();
  ASSERT_FALSE(factory.ok());
  EXPECT_EQ(factory.status().code(), absl::StatusCode::kUnavailable) << factory.status();
  EXPECT_THAT(std::string(factory.status().message()), HasSubstr("group 'world'"));
  EXPECT_TRUE(api_.aborted("world"));
}

TEST_F(NcclSeamTest, InitPastItsDeadlineIsDeadlineExceededAndAborted) {
  api_.ScriptInit({.init_polls = -1});
  NcclProcessGroupFactoryOptions options = Options();
  options.init_timeout = absl::Milliseconds(50);
  auto factory = Create(options);
  ASSERT_FALSE(factory.ok());
  EXPECT_EQ(factory.status().code(), absl::StatusCode::kDeadlineExceeded) << factory.status();
  EXPECT_TRUE(api_.aborted("world"));
}

TEST_F(NcclSeamTest, NoVisibleDeviceIsFailedPreconditionBeforeAnyNcclCall) {
  api_.set_device_count(0);
  auto factory = Create();
  ASSERT_FALSE(factory.ok());
  EXPECT_EQ(factory.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(api_.log(), IsEmpty());
}

// ---- ncclCommSplit: the orders a real NCCL publishes in --------------------

TEST_F(NcclSeamTest, SplitInTheDocumentedOrderSucceeds) {
  // The call says ncclInProgress, the parent reads in progress while the
  // job runs, and the child is published before the parent reads done.
  api_.ScriptSplit(
      {.call_result = ncclInProgress, .parent_polls = 4, .publish_after_parent_polls = 3});
  std::shared_ptr<ProcessGroup> dp = SplitDp();
  ASSERT_NE(dp, nullptr);
  FakeDeviceBuffer buffer;
  auto work = dp->AllReduce(buffer.tensor(), ReduceOp::kSum);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_TRUE((*work)->status().ok());
  EXPECT_LT(At("Publish(mesh/dp/0)"), At("AllReduce(mesh/dp/0)"));
}

TEST_F(NcclSeamTest, SplitThatReturnsSuccessBeforeTheChildIsPublishedWaitsForTheChild) {
  // What NCCL 2.28.9 does, and what broke on an H200: ncclCommSplit returns
  // ncclSuccess on a non-blocking communicator while its job still runs,
  // and the child appears in the slot later. Taking the return for done
  // read an empty slot and freed it, and NCCL then wrote into freed memory.
  api_.ScriptSplit(
      {.call_result = ncclSuccess, .parent_polls = 2, .publish_after_parent_polls = 6});
  std::shared_ptr<ProcessGroup> dp = SplitDp();
  ASSERT_NE(dp, nullptr);
  EXPECT_TRUE(dp->health().ok());
  EXPECT_FALSE(api_.aborted("world"));
}

TEST_F(NcclSeamTest, SplitWhoseParentReadsDoneBeforeTheChildIsPublishedWaitsForTheChild) {
  // Neither the return code nor the parent's state says the child exists:
  // only the slot does.
  api_.ScriptSplit(
      {.call_result = ncclInProgress, .parent_polls = 0, .publish_after_parent_polls = 6});
  std::shared_ptr<ProcessGroup> dp = SplitDp();
  ASSERT_NE(dp, nullptr);
  EXPECT_TRUE(dp->health().ok());
}

TEST_F(NcclSeamTest, SplitWaitsUntilThePublishedChildIsReady) {
  api_.ScriptSplit({.child = {.init_polls = 5}});
  std::shared_ptr<ProcessGroup> dp = SplitDp();
  ASSERT_NE(dp, nullptr);
  // An op on a child still in progress would be a violation (TearDown).
  FakeDeviceBuffer buffer;
  ASSERT_TRUE(dp->AllReduce(buffer.tensor(), ReduceOp::kSum).ok());
}

TEST_F(NcclSeamTest, SplitOfAWiderWorldChecksTheChildsShape) {
  api_.ScriptInit({.count = 4, .rank = 0});
  api_.ScriptSplit({.child = {.count = 2, .rank = 0}});
  auto factory = Create(Options(4));
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto groups = (*factory)->NewGroups({GroupSpec{"mesh/tp", 0, {0, 1}}});
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ((*groups)[0]->size(), 2);

  // A child whose shape disagrees with the spec: the members passed
  // different specs. The child is aborted; the world stays usable.
  api_.ScriptSplit({.child = {.count = 3, .rank = 1}});
  auto bad = (*factory)->NewGroups({GroupSpec{"mesh/pp", 0, {0, 1}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("members passed different specs"));
  EXPECT_TRUE(api_.aborted("mesh/pp/0"));
  EXPECT_FALSE(api_.aborted("world"));
}

TEST_F(NcclSeamTest, ChildThatFailsToComeUpAbortsParentThenChild) {
  api_.ScriptSplit({.parent_polls = 2,
                    .publish_after_parent_polls = 1,
                    .child = {.init_polls = 2, .init_result = ncclSystemError}});
  auto factory = Create();
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto groups = (*factory)->NewGroups(DpSpec());
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kUnavailable) << groups.status();
  EXPECT_THAT(std::string(groups.status().message()), HasSubstr("mesh/dp/0"));
  EXPECT_LT(At("CommAbort(world)"), At("CommAbort(mesh/dp/0)"));
  auto world = (*factory)->World();
  ASSERT_TRUE(world.ok());
  EXPECT_FALSE((*world)->health().ok());
}

TEST_F(NcclSeamTest, SynchronousSplitFailureAbortsTheParentAtOnce) {
  api_.ScriptSplit({.call_result = ncclInvalidUsage});
  auto factory = Create();
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto groups = (*factory)->NewGroups(DpSpec());
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kFailedPrecondition) << groups.status();
  EXPECT_TRUE(api_.aborted("world"));
  EXPECT_EQ(api_.unpublished_splits(), 0);
}

// ---- ncclCommSplit: giving up while the child is unpublished --------------

// After a split that gave up with the child unpublished: the world group is
// failed at once, but its ncclCommAbort waits for NCCL to publish the child;
// then the watchdog aborts the parent first and the late child after it.
void ExpectDeferredAbort(FakeNcclApi& api, NcclProcessGroupFactory& factory,
                         const std::function<int(const std::string&)>& at) {
  auto world = factory.World();
  ASSERT_TRUE(world.ok());
  EXPECT_FALSE((*world)->health().ok());
  FakeDeviceBuffer buffer;
  EXPECT_FALSE((*world)->AllReduce(buffer.tensor(), ReduceOp::kSum).ok());
  absl::SleepFor(absl::Milliseconds(30));  // Several watchdog passes.
  EXPECT_FALSE(api.aborted("world")) << "aborted while the split child was unpublished";
  EXPECT_EQ(api.unpublished_splits(), 1);

  api.PublishPendingSplits();  // NCCL's job finishes late.
  ASSERT_TRUE(Eventually([&] { return api.aborted("world"); }));
  EXPECT_LT(at("CommAbort(world)"), at("CommAbort(mesh/dp/0)"));
}

TEST_F(NcclSeamTest, SplitPastItsDeadlineDefersTheParentsAbortUntilTheChildIsPublished) {
  api_.ScriptSplit({.parent_polls = 0, .publish_after_parent_polls = -1});
  NcclProcessGroupFactoryOptions options = Options();
  options.init_timeout = absl::Milliseconds(80);
  auto factory = Create(options);
  ASSERT_TRUE(factory.ok()) << factory.status();
  const absl::Time start = absl::Now();
  auto groups = (*factory)->NewGroups(DpSpec());
  ASSERT_FALSE(groups.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kDeadlineExceeded) << groups.status();
  EXPECT_THAT(std::string(groups.status().message()),
              HasSubstr("the new communicator had not been created yet"));
  ExpectDeferredAbort(api_, **factory, [this](const std::string& e) { return At(e); });
}

TEST_F(NcclSeamTest, ParentErrorDuringTheSplitDefersTheAbortToo) {
  api_.ScriptSplit(
      {.parent_polls = 3, .parent_result = ncclRemoteError, .publish_after_parent_polls = -1});
  auto factory = Create();
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto groups = (*factory)->NewGroups(DpSpec());
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kUnavailable) << groups.status();
  EXPECT_THAT(std::string(groups.status().message()), HasSubstr("parent communicator failed"));
  ExpectDeferredAbort(api_, **factory, [this](const std::string& e) { return At(e); });
}

TEST_F(NcclSeamTest, AbortAllCancelsAWaitingSplitPromptly) {
  api_.ScriptSplit({.parent_polls = -1, .publish_after_parent_polls = -1});
  auto factory = Create();
  ASSERT_TRUE(factory.ok()) << factory.status();
  std::thread aborter([&] {
    // Once the split is under way (then NewGroups is waiting in it).
    Eventually([&] { return api_.LogIndex("CommSplit(world)") >= 0; });
    absl::SleepFor(absl::Milliseconds(20));
    (*factory)->AbortAll(absl::AbortedError("rank 3 (host-b) failed: exit code 1"));
  });
  auto groups = (*factory)->NewGroups(DpSpec());
  aborter.join();
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kAborted) << groups.status();
  EXPECT_THAT(std::string(groups.status().message()), HasSubstr("rank 3 (host-b) failed"));
  // The parent's split job is still running: a parent stuck in progress and
  // an unpublished child. Neither may be aborted or freed yet.
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_FALSE(api_.aborted("world"));
  api_.PublishPendingSplits();
  ASSERT_TRUE(Eventually([&] { return api_.aborted("world"); }));
  EXPECT_LT(At("CommAbort(world)"), At("CommAbort(mesh/dp/0)"));
  // Groups asked for after AbortAll fail with its reason.
  auto later = (*factory)->NewGroups(DpSpec());
  EXPECT_EQ(later.status().code(), absl::StatusCode::kAborted);
}

TEST_F(NcclSeamTest, TeardownWhileTheChildStaysUnpublishedLeavesBothAllocated) {
  api_.ScriptSplit({.parent_polls = 0, .publish_after_parent_polls = -1});
  NcclProcessGroupFactoryOptions options = Options();
  options.init_timeout = absl::Milliseconds(30);
  options.destroy_timeout = absl::Milliseconds(30);
  {
    auto factory = Create(options);
    ASSERT_TRUE(factory.ok()) << factory.status();
    EXPECT_FALSE((*factory)->NewGroups(DpSpec()).ok());
  }  // ~NcclGroup of the world: Close waits 30 ms for the child, then gives up.
  EXPECT_FALSE(api_.aborted("world"));
  EXPECT_FALSE(api_.destroyed("world"));
  // The communicator was not aborted, so its kernels may still use the
  // group's stream and barrier buffer: they stay allocated too.
  EXPECT_EQ(api_.live_streams(), 1);
  // NCCL finishing after teardown writes into a slot that is still there
  // (the sanitizer build would flag a freed one).
  api_.PublishPendingSplits();
}

TEST_F(NcclSeamTest, TeardownAbortsChildThenParentWhenTheChildArrivesInTime) {
  api_.ScriptSplit({.parent_polls = 0, .publish_after_parent_polls = -1});
  NcclProcessGroupFactoryOptions options = Options();
  options.init_timeout = absl::Milliseconds(30);
  options.watchdog_interval = absl::Seconds(3600);  // Close, not the watchdog.
  std::thread publisher;
  {
    auto factory = Create(options);
    ASSERT_TRUE(factory.ok()) << factory.status();
    EXPECT_FALSE((*factory)->NewGroups(DpSpec()).ok());
    publisher = std::thread([&] {
      absl::SleepFor(absl::Milliseconds(50));
      api_.PublishPendingSplits();
    });
  }
  publisher.join();
  EXPECT_LT(At("CommAbort(world)"), At("CommAbort(mesh/dp/0)"));
  EXPECT_EQ(api_.live_streams(), 0);
  EXPECT_EQ(api_.live_events(), 0);
}

// ---- Streams: where an op runs and what orders it --------------------------

// The fake's stream calls from index `from` on.
std::vector<FakeNcclApi::StreamCall> CallsSince(const FakeNcclApi& api, size_t from) {
  std::vector<FakeNcclApi::StreamCall> calls = api.stream_calls();
  calls.erase(calls.begin(), calls.begin() + static_cast<std::ptrdiff_t>(from));
  return calls;
}

cudaStream_t GroupStream(const std::shared_ptr<ProcessGroup>& group) {
  auto nccl = std::dynamic_pointer_cast<ProcessGroupNccl>(group);
  return nccl == nullptr ? nullptr : static_cast<cudaStream_t>(nccl->stream());
}

TEST_F(NcclSeamTest, GroupStreamOrdersTheOpAfterTheCallerAndWaitOrdersTheCallerAfterIt) {
  auto factory = Create();
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto world = (*factory)->World();
  ASSERT_TRUE(world.ok()) << world.status();
  const cudaStream_t group = GroupStream(*world);
  ASSERT_NE(group, nullptr);
  auto* caller = reinterpret_cast<cudaStream_t>(0x5100);
  CudaStreamGuard current(Device::Cuda(0), caller);
  const size_t from = api_.stream_calls().size();
  FakeDeviceBuffer buffer;
  auto work = (*world)->AllReduce(buffer.tensor(), ReduceOp::kSum);
  ASSERT_TRUE(work.ok()) << work.status();
  ASSERT_TRUE((*work)->Wait().ok());

  const std::vector<FakeNcclApi::StreamCall> calls = CallsSince(api_, from);
  ASSERT_EQ(calls.size(), 5u);
  // The caller's earlier work, then the op on the group stream...
  EXPECT_EQ(calls[0].call, "EventRecord");
  EXPECT_EQ(calls[0].stream, caller);
  EXPECT_EQ(calls[1].call, "StreamWaitEvent");
  EXPECT_EQ(calls[1].stream, group);
  EXPECT_EQ(calls[1].event, calls[0].event);
  EXPECT_EQ(calls[2].call, "AllReduce");
  EXPECT_EQ(calls[2].stream, group);
  // ...its completion event there, and Wait orders the caller after it.
  EXPECT_EQ(calls[3].call, "EventRecord");
  EXPECT_EQ(calls[3].stream, group);
  EXPECT_NE(calls[3].event, calls[0].event);
  EXPECT_EQ(calls[4].call, "StreamWaitEvent");
  EXPECT_EQ(calls[4].stream, caller);
  EXPECT_EQ(calls[4].event, calls[3].event);
}

TEST_F(NcclSeamTest, CurrentStreamRunsTheOpOnTheCallersStreamWithoutOrderingEvents) {
  NcclProcessGroupFactoryOptions options = Options();
  options.stream_mode = NcclStreamMode::kCurrentStream;
  auto factory = Create(options);
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto world = (*factory)->World();
  ASSERT_TRUE(world.ok()) << world.status();
  auto* caller = reinterpret_cast<cudaStream_t>(0x5100);
  auto* other = reinterpret_cast<cudaStream_t>(0x5200);
  FakeDeviceBuffer buffer;
  std::shared_ptr<Work> work;
  size_t from = 0;
  {
    CudaStreamGuard current(Device::Cuda(0), caller);
    from = api_.stream_calls().size();
    auto issued = (*world)->AllReduce(buffer.tensor(), ReduceOp::kSum);
    ASSERT_TRUE(issued.ok()) << issued.status();
    work = *issued;
    // Already ordered before the caller's later work: nothing to enqueue.
    ASSERT_TRUE(work->Wait().ok());
  }
  std::vector<FakeNcclApi::StreamCall> calls = CallsSince(api_, from);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].call, "AllReduce");
  EXPECT_EQ(calls[0].stream, caller);
  EXPECT_EQ(calls[1].call, "EventRecord");
  EXPECT_EQ(calls[1].stream, caller);
  const cudaEvent_t done = calls[1].event;

  // Waiting from another stream still orders that stream after the op.
  {
    CudaStreamGuard current(Device::Cuda(0), other);
    ASSERT_TRUE(work->Wait().ok());
  }
  calls = CallsSince(api_, from);
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[2].call, "StreamWaitEvent");
  EXPECT_EQ(calls[2].stream, other);
  EXPECT_EQ(calls[2].event, done);
  EXPECT_TRUE(work->IsCompleted());
  EXPECT_TRUE(work->status().ok());
}

TEST_F(NcclSeamTest, ManyOpsInFlightAreRetiredAndTheirEventsReused) {
  auto factory = Create();
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto world = (*factory)->World();
  ASSERT_TRUE(world.ok()) << world.status();
  FakeDeviceBuffer buffer;
  // The device lags: ops pile up past the point where issuing retires them.
  api_.set_events_complete(false);
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 600; ++i) {
    auto work = (*world)->AllReduce(buffer.tensor(), ReduceOp::kSum);
    ASSERT_TRUE(work.ok()) << work.status();
    works.push_back(*work);
  }
  EXPECT_FALSE(works.back()->IsCompleted());
  const int events_in_flight = api_.live_events();
  EXPECT_GE(events_in_flight, 600);
  // The device catches up; every op completes, and later ops reuse the
  // completion events instead of creating new ones. (The first batch's
  // events return to the pool as the watchdog retires its ops, within a
  // tick or two, so a few new events may be made meanwhile: far fewer than
  // one per op.)
  api_.set_events_complete(true);
  for (const std::shared_ptr<Work>& work : works) EXPECT_TRUE(work->status().ok());
  works.clear();
  for (int i = 0; i < 600; ++i) {
    auto work = (*world)->AllReduce(buffer.tensor(), ReduceOp::kSum);
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_TRUE((*work)->Wait().ok());
  }
  EXPECT_LT(api_.live_events(), events_in_flight + 100);
}

// ---- Operations, the watchdog, teardown ------------------------------------

TEST_F(NcclSeamTest, OpThatConnectsLazilyIsIssuedOnceNcclIsDone) {
  auto factory = Create();
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto world = (*factory)->World();
  ASSERT_TRUE(world.ok());
  api_.ScriptOp({.call_result = ncclInProgress, .polls = 4});
  FakeDeviceBuffer buffer;
  auto work = (*world)->AllReduce(buffer.tensor(), ReduceOp::kSum);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_TRUE((*work)->status().ok()) << (*work)->status();
  // The next op found the communicator ready (else: a violation).
  ASSERT_TRUE((*world)->Broadcast(buffer.tensor(), 0).ok());
}

TEST_F(NcclSeamTest, AsyncErrorWhileIssuingFailsTheWorkAndAbortsTheGroup) {
  auto factory = Create();
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto world = (*factory)->World();
  ASSERT_TRUE(world.ok());
  api_.ScriptOp({.call_result = ncclInProgress, .polls = 2, .after = ncclRemoteError});
  FakeDeviceBuffer buffer;
  auto work = (*world)->AllReduce(buffer.tensor(), ReduceOp::kSum);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_EQ((*work)->status().code(), absl::StatusCode::kUnavailable) << (*work)->status();
  EXPECT_THAT(std::string((*work)->status().message()),
              HasSubstr("failed while being issued, so the group was aborted"));
  EXPECT_TRUE(api_.aborted("world"));
  EXPECT_EQ((*world)->AllReduce(buffer.tensor(), ReduceOp::kSum).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(NcclSeamTest, WatchdogAbortsOnAnAsyncErrorAndFailsThePendingOp) {
  auto factory = Create();
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto world = (*factory)->World();
  ASSERT_TRUE(world.ok());
  api_.set_events_complete(false);
  FakeDeviceBuffer buffer;
  auto work = (*world)->AllReduce(buffer.tensor(), ReduceOp::kSum);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_FALSE((*work)->IsCompleted());
  api_.SetAsyncError("world", ncclRemoteError);
  // The watchdog marks the group unhealthy, then fails the pending op, then
  // aborts the communicator: wait for the last step before looking.
  ASSERT_TRUE(Eventually([&] { return api_.aborted("world"); }));
  EXPECT_EQ((*world)->health().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string((*world)->health().message()), HasSubstr("all_reduce #0"));
  EXPECT_TRUE((*work)->IsCompleted());
  EXPECT_EQ((*work)->status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(NcclSeamTest, WatchdogTimesOutAStuckOp) {
  NcclProcessGroupFactoryOptions options = Options();
  options.group_options.timeout = absl::Milliseconds(40);
  auto factory = Create(options);
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto world = (*factory)->World();
  ASSERT_TRUE(world.ok());
  api_.set_events_complete(false);
  FakeDeviceBuffer buffer;
  auto work = (*world)->AllReduce(buffer.tensor(), ReduceOp::kSum);
  ASSERT_TRUE(work.ok());
  ASSERT_TRUE(Eventually([&] { return (*work)->IsCompleted(); }));
  EXPECT_EQ((*work)->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string((*work)->status().message()), HasSubstr("has not completed after"));
}

TEST_F(NcclSeamTest, TeardownFinalizesThenDestroys) {
  api_.set_finalize_polls(3);
  {
    auto factory = Create();
    ASSERT_TRUE(factory.ok()) << factory.status();
    auto groups = (*factory)->NewGroups(DpSpec());
    ASSERT_TRUE(groups.ok()) << groups.status();
  }
  EXPECT_LT(At("CommFinalize(world)"), At("CommDestroy(world)"));
  EXPECT_LT(At("CommFinalize(mesh/dp/0)"), At("CommDestroy(mesh/dp/0)"));
  EXPECT_FALSE(api_.aborted("world"));
  EXPECT_EQ(api_.live_streams(), 0);
  EXPECT_EQ(api_.live_events(), 0);
}

TEST_F(NcclSeamTest, TeardownThatCannotDrainAborts) {
  api_.set_finalize_polls(-1);
  NcclProcessGroupFactoryOptions options = Options();
  options.destroy_timeout = absl::Milliseconds(30);
  {
    auto factory = Create(options);
    ASSERT_TRUE(factory.ok()) << factory.status();
  }
  EXPECT_LT(At("CommFinalize(world)"), At("CommAbort(world)"));
  EXPECT_FALSE(api_.destroyed("world"));
}

// ---- The world from several roots (ncclCommInitRankScalable) -----------------------

class NcclScalableInitTest : public NcclSeamTest {
 protected:
  NcclProcessGroupFactoryOptions LargeWorld(int rank) {
    NcclProcessGroupFactoryOptions options = Options(/*world_size=*/2500);
    options.world_rank = rank;
    options.ranks_per_root = 1024;  // Roots: ranks 0, 1024 and 2048.
    return options;
  }
  absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> CreateWith(
      NcclProcessGroupFactoryOptions options, std::unique_ptr<MapBroker> broker) {
    return CreateNcclFactory(std::move(options), std::move(broker), api_);
  }
};

TEST_F(NcclScalableInitTest, ARankOutsideTheRootsFetchesEveryRootsIdInRootOrder) {
  auto broker = std::make_unique<MapBroker>();
  broker->map[WorldRootKey(1)] = IdBytes('\x11');
  broker->map[WorldRootKey(2)] = IdBytes('\x22');
  MapBroker* seen = broker.get();
  auto factory = CreateWith(LargeWorld(5), std::move(broker));
  ASSERT_TRUE(factory.ok()) << factory.status();
  EXPECT_GE(api_.LogIndex("CommInitRankScalable(world, 3 ids)"), 0);
  EXPECT_LT(api_.LogIndex("CommInitRankConfig(world)"), 0);
  EXPECT_TRUE(seen->published.empty()) << "rank 5 is no root";
  const std::vector<ncclUniqueId> ids = api_.scalable_ids();
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(IdOf(ids[0]), std::string(kNcclUniqueIdBytes, '\x5a')) << "root 0: the world ID";
  EXPECT_EQ(IdOf(ids[1]), IdBytes('\x11'));
  EXPECT_EQ(IdOf(ids[2]), IdBytes('\x22'));
}

TEST_F(NcclScalableInitTest, ARootPublishesTheIdItMadeAndInitsWithIt) {
  auto broker = std::make_unique<MapBroker>();
  broker->map[WorldRootKey(1)] = IdBytes('\x11');
  MapBroker* seen = broker.get();
  auto factory = CreateWith(LargeWorld(2048), std::move(broker));
  ASSERT_TRUE(factory.ok()) << factory.status();
  ASSERT_EQ(seen->published, std::vector<std::string>{WorldRootKey(2)});
  const std::vector<ncclUniqueId> ids = api_.scalable_ids();
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(IdOf(ids[2]), seen->map[WorldRootKey(2)]) << "its own ID, in its place";
  EXPECT_EQ(seen->map[WorldRootKey(2)].size(), kNcclUniqueIdBytes);
}

TEST_F(NcclScalableInitTest, AMissingRootIdFailsNamingItAndStartsNoCommunicator) {
  auto broker = std::make_unique<MapBroker>();
  broker->map[WorldRootKey(1)] = IdBytes('\x11');  // Root 2 never publishes.
  auto factory = CreateWith(LargeWorld(7), std::move(broker));
  ASSERT_FALSE(factory.ok());
  EXPECT_EQ(factory.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(factory.status().message()),
              AllOf(HasSubstr("3 roots"), HasSubstr(WorldRootKey(2))));
  EXPECT_LT(api_.LogIndex("CommInitRankScalable(world, 3 ids)"), 0);
}

TEST_F(NcclScalableInitTest, SeveralRootsWithoutABrokerIsAFailedPrecondition) {
  auto factory = CreateNcclFactory(LargeWorld(7), nullptr, api_);
  ASSERT_FALSE(factory.ok());
  EXPECT_EQ(factory.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(factory.status().message()), HasSubstr("broker"));
}

TEST_F(NcclScalableInitTest, AutoUsesOneRootForASmallWorldOrAnOldNccl) {
  {
    NcclProcessGroupFactoryOptions options = Options(/*world_size=*/1024);
    options.ranks_per_root = 1024;
    auto factory = CreateWith(options, std::make_unique<MapBroker>());
    ASSERT_TRUE(factory.ok()) << factory.status();
    EXPECT_GE(api_.LogIndex("CommInitRankConfig(world)"), 0);
  }
  FakeNcclApi old;
  old.set_version(NCCL_VERSION(2, 22, 3));
  auto broker = std::make_unique<MapBroker>();
  auto factory = CreateNcclFactory(LargeWorld(5), std::move(broker), old);
  ASSERT_TRUE(factory.ok()) << factory.status();
  EXPECT_GE(old.LogIndex("CommInitRankConfig(world)"), 0);
  EXPECT_LT(old.LogIndex("CommInitRankScalable(world, 3 ids)"), 0);
  EXPECT_THAT(old.violations(), IsEmpty());
}

TEST_F(NcclScalableInitTest, ForcedScalableNeedsNccl223AndWorksForAWorldOfOne) {
  NcclProcessGroupFactoryOptions options = Options();
  options.world_init = NcclWorldInit::kScalable;
  {
    // The world-of-one path a GPU run takes: one root, the world ID.
    auto factory = CreateNcclFactory(options, nullptr, api_);
    ASSERT_TRUE(factory.ok()) << factory.status();
    EXPECT_GE(api_.LogIndex("CommInitRankScalable(world, 1 ids)"), 0);
  }
  FakeNcclApi old;
  old.set_version(NCCL_VERSION(2, 22, 3));
  auto factory = CreateNcclFactory(options, nullptr, old);
  ASSERT_FALSE(factory.ok());
  EXPECT_EQ(factory.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(factory.status().message()), HasSubstr("2.23"));
}

TEST_F(NcclScalableInitTest, AScalableInitInProgressIsAwaitedAndAFailedOneAborted) {
  NcclProcessGroupFactoryOptions options = Options();
  options.world_init = NcclWorldInit::kScalable;
  FakeNcclApi::CommScript slow;
  slow.init_polls = 3;
  api_.ScriptInit(slow);
  {
    auto factory = CreateNcclFactory(options, nullptr, api_);
    ASSERT_TRUE(factory.ok()) << factory.status();
  }
  FakeNcclApi failing;
  FakeNcclApi::CommScript broken;
  broken.init_polls = 2;
  broken.init_result = ncclSystemError;
  failing.ScriptInit(broken);
  auto factory = CreateNcclFactory(options, nullptr, failing);
  ASSERT_FALSE(factory.ok());
  EXPECT_EQ(factory.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(failing.aborted("world"));
}

TEST_F(NcclScalableInitTest, RanksPerRootMustBePositive) {
  NcclProcessGroupFactoryOptions options = Options();
  options.ranks_per_root = 0;
  auto factory = CreateNcclFactory(options, nullptr, api_);
  ASSERT_FALSE(factory.ok());
  EXPECT_EQ(factory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(factory.status().message()), HasSubstr("ranks_per_root"));
}

// ---- NewGroupsAmongMembers: brokered init, never a split --------------------

// In-place recovery rebuilds groups over the live ranks only, so a group
// can never be split from the world communicator (that needs every world
// rank): each is initialized from a unique ID its first member publishes
// under a key without the NewGroups call number, which a replacement
// process (that made none of the earlier calls) would not know.
constexpr char kMembersKey[] = "nccl/uid/members/elastic/r1/dp/0";

// Ranks 0, 1 and 3 of a world of 4 (rank 2 was lost).
GroupSpec SurvivorsSpec(const std::string& family = "elastic/r1/dp") {
  return GroupSpec{family, 0, {0, 1, 3}};
}

// Rank `rank` of a world of 4.
NcclProcessGroupFactoryOptions WorldOfFour(int rank,
                                           NcclGroupCreation creation = NcclGroupCreation::kSplit) {
  NcclProcessGroupFactoryOptions options = Options(/*world_size=*/4);
  options.world_rank = rank;
  options.group_creation = creation;
  return options;
}

class NcclMembersOnlyTest : public NcclSeamTest {};

class NcclMembersOnlySplitTest : public NcclSeamTest,
                                 public ::testing::WithParamInterface<NcclGroupCreation> {};

TEST_P(NcclMembersOnlySplitTest, NeverSplitsAndInitsEachGroupFromABrokeredId) {
  auto broker = std::make_unique<MapBroker>();
  broker->map[kMembersKey] = IdBytes('\x31');
  MapBroker* seen = broker.get();
  auto factory = CreateNcclFactory(WorldOfFour(/*rank=*/1, GetParam()), std::move(broker), api_);
  ASSERT_TRUE(factory.ok()) << factory.status();
  ASSERT_TRUE((*factory)->splits_communicators()) << "NCCL 2.28 can split";

  // Rank 1 is a member of the dp group (led by rank 0) and leads tp.
  auto groups =
      (*factory)->NewGroupsAmongMembers({SurvivorsSpec(), GroupSpec{"elastic/r1/tp", 1, {1, 3}}});
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 2u);
  EXPECT_EQ((*groups)[0]->name(), "elastic/r1/dp/0");
  EXPECT_EQ((*groups)[0]->rank(), 1);
  EXPECT_EQ((*groups)[0]->size(), 3);
  EXPECT_EQ((*groups)[1]->name(), "elastic/r1/tp/1");
  EXPECT_EQ((*groups)[1]->rank(), 0);
  EXPECT_THAT(api_.log(), Not(Contains(StartsWith("CommSplit("))));
  EXPECT_GE(At("CommInitRankConfig(elastic/r1/dp/0)"), 0);
  EXPECT_GE(At("CommInitRankConfig(elastic/r1/tp/1)"), 0);
  EXPECT_EQ(seen->fetched, std::vector<std::string>{kMembersKey});
  EXPECT_EQ(seen->published, std::vector<std::string>{"nccl/uid/members/elastic/r1/tp/1"});
  FakeDeviceBuffer buffer;
  ASSERT_TRUE((*groups)[0]->AllReduce(buffer.tensor(), ReduceOp::kSum).ok());

  // NewGroups on the same factory still splits: the split was available and
  // NewGroupsAmongMembers chose not to use it.
  auto split = (*factory)->NewGroups({GroupSpec{"mesh/solo", 1, {1}}});
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_GE(At("CommSplit(world)"), 0);
}

INSTANTIATE_TEST_SUITE_P(SplitAvailable, NcclMembersOnlySplitTest,
                         ::testing::Values(NcclGroupCreation::kSplit, NcclGroupCreation::kAuto),
                         [](const ::testing::TestParamInfo<NcclGroupCreation>& info) {
                           return info.param == NcclGroupCreation::kSplit ? "Split" : "Auto";
                         });

TEST_F(NcclMembersOnlyTest, TheFirstMemberPublishesTheIdAndTheOthersFetchIt) {
  std::string published_id;
  {
    auto broker = std::make_unique<MapBroker>();
    MapBroker* seen = broker.get();
    auto leader = CreateNcclFactory(WorldOfFour(/*rank=*/0), std::move(broker), api_);
    ASSERT_TRUE(leader.ok()) << leader.status();
    auto groups = (*leader)->NewGroupsAmongMembers({SurvivorsSpec()});
    ASSERT_TRUE(groups.ok()) << groups.status();
    EXPECT_EQ(seen->published, std::vector<std::string>{kMembersKey});
    EXPECT_THAT(seen->fetched, IsEmpty()) << "the leader fetches nothing";
    published_id = seen->map[kMembersKey];
    EXPECT_EQ(published_id.size(), kNcclUniqueIdBytes);
  }
  // A member that is not first fetches exactly that key, and publishes
  // nothing.
  FakeNcclApi member_api;
  {
    auto broker = std::make_unique<MapBroker>();
    broker->map[kMembersKey] = published_id;
    MapBroker* seen = broker.get();
    auto member = CreateNcclFactory(WorldOfFour(/*rank=*/1), std::move(broker), member_api);
    ASSERT_TRUE(member.ok()) << member.status();
    auto groups = (*member)->NewGroupsAmongMembers({SurvivorsSpec()});
    ASSERT_TRUE(groups.ok()) << groups.status();
    EXPECT_EQ(seen->fetched, std::vector<std::string>{kMembersKey});
    EXPECT_THAT(seen->published, IsEmpty());
    EXPECT_GE(member_api.LogIndex("CommInitRankConfig(elastic/r1/dp/0)"), 0);
  }
  // Until the leader has published, the member's Get fails naming the key,
  // and no communicator is started.
  FakeNcclApi early_api;
  {
    auto member =
        CreateNcclFactory(WorldOfFour(/*rank=*/3), std::make_unique<MapBroker>(), early_api);
    ASSERT_TRUE(member.ok()) << member.status();
    auto groups = (*member)->NewGroupsAmongMembers({SurvivorsSpec()});
    ASSERT_FALSE(groups.ok());
    EXPECT_EQ(groups.status().code(), absl::StatusCode::kDeadlineExceeded) << groups.status();
    EXPECT_THAT(std::string(groups.status().message()), HasSubstr(kMembersKey));
    EXPECT_LT(early_api.LogIndex("CommInitRankConfig(elastic/r1/dp/0)"), 0);
  }
  EXPECT_THAT(member_api.violations(), IsEmpty());
  EXPECT_THAT(early_api.violations(), IsEmpty());
}

TEST_F(NcclMembersOnlyTest, WithoutABrokerIsAFailedPreconditionNamingTheCall) {
  auto factory = CreateNcclFactory(WorldOfFour(/*rank=*/1), nullptr, api_);
  ASSERT_TRUE(factory.ok()) << factory.status();
  auto groups = (*factory)->NewGroupsAmongMembers({SurvivorsSpec()});
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kFailedPrecondition) << groups.status();
  EXPECT_THAT(std::string(groups.status().message()),
              AllOf(HasSubstr("NewGroupsAmongMembers"), HasSubstr("store")));
  // Not a split as a fallback either.
  EXPECT_THAT(api_.log(), Not(Contains(StartsWith("CommSplit("))));
  EXPECT_LT(api_.LogIndex("CommInitRankConfig(elastic/r1/dp/0)"), 0);
}

TEST_F(NcclMembersOnlyTest, FamiliesNotTheNewGroupsCallCountKeyTheIds) {
  // The leader has made no NewGroups call before; the member (say a
  // survivor) has made two, whose brokered keys carry their call numbers.
  auto leader_broker = std::make_unique<MapBroker>();
  MapBroker* led = leader_broker.get();
  auto leader = CreateNcclFactory(WorldOfFour(/*rank=*/0), std::move(leader_broker), api_);
  ASSERT_TRUE(leader.ok()) << leader.status();
  ASSERT_TRUE((*leader)->NewGroupsAmongMembers({SurvivorsSpec("elastic/a")}).ok());
  ASSERT_TRUE((*leader)->NewGroupsAmongMembers({SurvivorsSpec("elastic/b")}).ok());
  EXPECT_EQ(led->published, (std::vector<std::string>{"nccl/uid/members/elastic/a/0",
                                                      "nccl/uid/members/elastic/b/0"}));

  FakeNcclApi member_api;
  {
    auto member_broker = std::make_unique<MapBroker>();
    member_broker->map = led->map;
    MapBroker* seen = member_broker.get();
    auto member = CreateNcclFactory(WorldOfFour(/*rank=*/1, NcclGroupCreation::kUniqueIds),
                                    std::move(member_broker), member_api);
    ASSERT_TRUE(member.ok()) << member.status();
    for (int i = 0; i < 2; ++i) {
      auto earlier = (*member)->NewGroups({GroupSpec{"mesh/pp", 0, {1, 3}}});
      ASSERT_TRUE(earlier.ok()) << earlier.status();
    }
    ASSERT_EQ(seen->published,
              (std::vector<std::string>{"nccl/uid/0/mesh/pp/0", "nccl/uid/1/mesh/pp/0"}));
    auto a = (*member)->NewGroupsAmongMembers({SurvivorsSpec("elastic/a")});
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = (*member)->NewGroupsAmongMembers({SurvivorsSpec("elastic/b")});
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(seen->fetched, led->published);
    // And a later NewGroups call is numbered 2: members-only calls do not
    // take a number either.
    ASSERT_TRUE((*member)->NewGroups({GroupSpec{"mesh/pp", 0, {1, 3}}}).ok());
    EXPECT_EQ(seen->published.back(), "nccl/uid/2/mesh/pp/0");
  }
  EXPECT_THAT(member_api.violations(), IsEmpty());
}

TEST_F(NcclMembersOnlyTest, AfterAbortAllReturnsTheAbortReason) {
  auto broker = std::make_unique<MapBroker>();
  broker->map[kMembersKey] = IdBytes('\x31');
  MapBroker* seen = broker.get();
  auto factory = CreateNcclFactory(WorldOfFour(/*rank=*/1), std::move(broker), api_);
  ASSERT_TRUE(factory.ok()) << factory.status();
  (*factory)->AbortAll(absl::AbortedError("rank 2 (host-b) lost: missed heartbeats"));
  auto groups = (*factory)->NewGroupsAmongMembers({SurvivorsSpec()});
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kAborted) << groups.status();
  EXPECT_THAT(std::string(groups.status().message()), HasSubstr("rank 2 (host-b) lost"));
  // Nothing was exchanged or started.
  EXPECT_THAT(seen->fetched, IsEmpty());
  EXPECT_LT(api_.LogIndex("CommInitRankConfig(elastic/r1/dp/0)"), 0);
}

}  // namespace nccl_seam_test
}  // namespace mesh::nccl
