// Label gpu: the NCCL process group on real devices. Every test skips
// cleanly without NCCL or without a CUDA device.
//
// One GPU allows a world of one rank (NCCL refuses two ranks of one
// communicator on the same device), where every collective's expected value
// is its input; the tests still prove that the op ran (outputs are filled
// with garbage first), that streams are ordered, and the Work, abort and
// watchdog semantics. With two or more GPUs, TwoRanks runs real two-rank
// collectives (ranks as threads, one device each).
#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mesh/build_info.h"
#include "mesh/cuda_stream.h"
#include "mesh/device_mesh.h"
#include "mesh/dlpack.h"
#include "mesh/float16.h"
#include "mesh/in_memory_store.h"
#include "mesh/process_group_nccl.h"
#include "mesh/tensor.h"
#include "tests/libmesh/nccl_gpu_test_util.h"

namespace mesh {
namespace process_group_nccl_gpu_test {

using nccl_gpu_test::Download;
using nccl_gpu_test::HaveNcclAndDevice;
using nccl_gpu_test::Iota;
using nccl_gpu_test::kCuda0;
using nccl_gpu_test::kSync;
using nccl_gpu_test::Upload;

using ::testing::HasSubstr;

// ---- World of one on cuda:0. -------------------------------------------------

class NcclGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!GetBuildInfo().has_nccl) GTEST_SKIP() << "built without NCCL";
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    MakeFactory(DefaultOptions());
  }

  NcclProcessGroupFactoryOptions DefaultOptions() {
    NcclProcessGroupFactoryOptions options;
    options.world_rank = 0;
    options.world_size = 1;
    options.device = kCuda0;
    absl::StatusOr<std::string> id = GenerateNcclUniqueId();
    EXPECT_TRUE(id.ok()) << id.status();
    if (id.ok()) options.world_unique_id = *id;
    options.init_timeout = absl::Seconds(60);
    options.group_options.timeout = absl::Seconds(60);
    options.watchdog_interval = absl::Milliseconds(20);
    options.destroy_timeout = absl::Seconds(10);
    return options;
  }

  void MakeFactory(NcclProcessGroupFactoryOptions options) {
    world_.reset();
    factory_.reset();
    auto factory = NcclProcessGroupFactory::Create(std::move(options));
    ASSERT_TRUE(factory.ok()) << factory.status();
    factory_ = *std::move(factory);
    auto world = factory_->World();
    ASSERT_TRUE(world.ok()) << world.status();
    world_ = *world;
  }

  std::unique_ptr<NcclProcessGroupFactory> factory_;
  std::shared_ptr<ProcessGroup> world_;
};

TEST_F(NcclGpuTest, WorldDescribesItself) {
  EXPECT_EQ(world_->backend(), "nccl");
  EXPECT_EQ(world_->name(), "world");
  EXPECT_EQ(world_->rank(), 0);
  EXPECT_EQ(world_->size(), 1);
  EXPECT_TRUE(world_->health().ok());
  auto* nccl = dynamic_cast<ProcessGroupNccl*>(world_.get());
  ASSERT_NE(nccl, nullptr);
  EXPECT_EQ(nccl->device(), kCuda0);
  EXPECT_NE(nccl->stream(), nullptr);
  EXPECT_EQ(factory_->device(), kCuda0);
}

constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kInt32,
                             DType::kUInt8,   DType::kFloat64,  DType::kInt8,    DType::kInt64};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kProd};

TEST_F(NcclGpuTest, AllReduceOfOneRankIsTheInputForEveryDTypeAndOp) {
  for (DType dtype : kDTypes) {
    for (ReduceOp op : kOps) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " op ", static_cast<int>(op)));
      const std::vector<double> values = Iota(37);  // 1..37: exact in every dtype.
      absl::StatusOr<Tensor> t = Upload(dtype, {37}, values);
      ASSERT_TRUE(t.ok()) << t.status();
      auto work = world_->AllReduce(*t, op);
      ASSERT_TRUE(work.ok()) << work.status();
      ASSERT_OK((*work)->Wait());
      EXPECT_EQ(Download(*t), values);
      ASSERT_OK(SynchronizeWork(**work, kSync));
      EXPECT_TRUE((*work)->IsCompleted());
      EXPECT_TRUE((*work)->status().ok());
    }
  }
}

TEST_F(NcclGpuTest, OutOfPlaceAllReduceOfOneRankCopiesAndLeavesTheInput) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    SCOPED_TRACE(DTypeName(dtype));
    const std::vector<double> values = Iota(37);
    absl::StatusOr<Tensor> in = Upload(dtype, {37}, values);
    absl::StatusOr<Tensor> out = Upload(dtype, {37}, std::vector<double>(37, 77));
    ASSERT_TRUE(in.ok() && out.ok());
    auto work = world_->AllReduce(*in, *out, ReduceOp::kSum);
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_OK(SynchronizeWork(**work, kSync));
    EXPECT_EQ(Download(*out), values);
    EXPECT_EQ(Download(*in), values);
    // The same tensor is the in-place form.
    auto same = world_->AllReduce(*in, *in, ReduceOp::kMax);
    ASSERT_TRUE(same.ok()) << same.status();
    ASSERT_OK(SynchronizeWork(**same, kSync));
    EXPECT_EQ(Download(*in), values);
  }
  absl::StatusOr<Tensor> big = Upload(DType::kFloat32, {8}, Iota(8));
  ASSERT_TRUE(big.ok());
  auto low = big->Narrow(0, 0, 4);
  auto high = big->Narrow(0, 2, 4);
  ASSERT_TRUE(low.ok() && high.ok());
  EXPECT_EQ(world_->AllReduce(*low, *high, ReduceOp::kSum).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(world_->AllReduce(*low, *big, ReduceOp::kSum).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(world_->health().ok());
}

TEST_F(NcclGpuTest, BoolReducesWithMinAndMaxOnly) {
  absl::StatusOr<Tensor> t = Upload(DType::kBool, {4}, {1, 0, 1, 1});
  ASSERT_TRUE(t.ok()) << t.status();
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    auto work = world_->AllReduce(*t, op);
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_OK((*work)->Wait());
    EXPECT_EQ(Download(*t), (std::vector<double>{1, 0, 1, 1}));
  }
  auto sum = world_->AllReduce(*t, ReduceOp::kSum);
  ASSERT_FALSE(sum.ok());
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(world_->health().ok()) << "a rejected op must not hurt the group";
}

TEST_F(NcclGpuTest, BroadcastAndReduceOfOneRank) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt32}) {
    const std::vector<double> values = Iota(9, 3);
    absl::StatusOr<Tensor> t = Upload(dtype, {3, 3}, values);
    ASSERT_TRUE(t.ok()) << t.status();
    auto b = world_->Broadcast(*t, 0);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_OK((*b)->Wait());
    EXPECT_EQ(Download(*t), values);
    auto r = world_->Reduce(*t, 0, ReduceOp::kSum);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_OK((*r)->Wait());
    EXPECT_EQ(Download(*t), values);
  }
  EXPECT_EQ(world_->Broadcast(*Upload(DType::kFloat32, {1}, {1}), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(NcclGpuTest, AllGatherAndReduceScatterOfOneRankCopyIntoGarbage) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kUInt8}) {
    const std::vector<double> values = Iota(10);
    absl::StatusOr<Tensor> in = Upload(dtype, {10}, values);
    absl::StatusOr<Tensor> out = Upload(dtype, {2, 5}, std::vector<double>(10, 77));
    ASSERT_TRUE(in.ok() && out.ok());
    auto g = world_->AllGather(*in, *out);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_OK((*g)->Wait());
    EXPECT_EQ(Download(*out), values);

    absl::StatusOr<Tensor> scattered = Upload(dtype, {10}, std::vector<double>(10, 77));
    ASSERT_TRUE(scattered.ok());
    auto rs = world_->ReduceScatter(*in, *scattered, ReduceOp::kSum);
    ASSERT_TRUE(rs.ok()) << rs.status();
    ASSERT_OK((*rs)->Wait());
    EXPECT_EQ(Download(*scattered), values);
  }
}

TEST_F(NcclGpuTest, AllToAllOfOneRankEqualAndUneven) {
  const std::vector<double> values = Iota(12);
  absl::StatusOr<Tensor> in = Upload(DType::kInt64, {4, 3}, values);
  ASSERT_TRUE(in.ok());
  for (bool uneven : {false, true}) {
    absl::StatusOr<Tensor> out = Upload(DType::kInt64, {4, 3}, std::vector<double>(12, -5));
    ASSERT_TRUE(out.ok());
    auto work = uneven ? world_->AllToAll(*in, *out, {4}, {4}) : world_->AllToAll(*in, *out);
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_OK((*work)->Wait());
    EXPECT_EQ(Download(*out), values) << (uneven ? "uneven" : "equal");
  }
}

TEST_F(NcclGpuTest, ZeroElementOpsComplete) {
  absl::StatusOr<Tensor> empty = Tensor::Empty(DType::kFloat32, {0}, kCuda0);
  ASSERT_TRUE(empty.ok());
  for (auto work : {world_->AllReduce(*empty, ReduceOp::kSum), world_->Broadcast(*empty, 0),
                    world_->AllGather(*empty, *empty), world_->AllToAll(*empty, *empty)}) {
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_OK(SynchronizeWork(**work, kSync));
  }
}

TEST_F(NcclGpuTest, SendToSelfAndForeignTensorsAreRejectedUpFront) {
  absl::StatusOr<Tensor> t = Upload(DType::kFloat32, {4}, Iota(4));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(world_->Send(*t, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(world_->Recv(*t, 0).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Tensor> cpu = Tensor::Zeros(DType::kFloat32, {4});
  ASSERT_TRUE(cpu.ok());
  auto on_cpu = world_->AllReduce(*cpu, ReduceOp::kSum);
  ASSERT_FALSE(on_cpu.ok());
  EXPECT_THAT(std::string(on_cpu.status().message()), HasSubstr("is on cpu"));
  absl::StatusOr<Tensor> matrix = Upload(DType::kFloat32, {2, 2}, Iota(4));
  ASSERT_TRUE(matrix.ok());
  const int64_t shape[] = {2, 2};
  const int64_t strides[] = {1, 2};
  Tensor transposed(matrix->data(), DType::kFloat32, shape, strides, kCuda0);
  EXPECT_EQ(world_->AllReduce(transposed, ReduceOp::kSum).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(world_->health().ok());
}

TEST_F(NcclGpuTest, BarrierCompletes) {
  for (int i = 0; i < 3; ++i) {
    auto work = world_->Barrier();
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_OK(SynchronizeWork(**work, kSync));
  }
}

// A host function that holds a stream until released (bounded, so a broken
// test cannot hang the device forever).
struct StreamGate {
  std::atomic<bool> open{false};
  static void CUDART_CB Hold(void* arg) {
    auto* gate = static_cast<StreamGate*>(arg);
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (!gate->open.load() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  }
};

TEST_F(NcclGpuTest, OpsWaitForTheCallersCurrentStreamAndWaitOrdersItAfterThem) {
  cudaStream_t user = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking), cudaSuccess);
  absl::StatusOr<Tensor> in = Upload(DType::kInt32, {256}, std::vector<double>(256, 1));
  absl::StatusOr<Tensor> out = Upload(DType::kInt32, {256}, std::vector<double>(256, 0));
  ASSERT_TRUE(in.ok() && out.ok());
  StreamGate gate;
  {
    CudaStreamGuard guard(kCuda0, user);
    // On `user`: hold, then overwrite the input with 0x07 bytes (memset is
    // asynchronous whatever the memory, unlike pageable copies). The gather
    // sees them only if the group stream waited for `user`.
    ASSERT_EQ(cudaLaunchHostFunc(user, &StreamGate::Hold, &gate), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(in->data(), 0x07, in->nbytes(), user), cudaSuccess);
    auto work = world_->AllGather(*in, *out);
    ASSERT_TRUE(work.ok()) << work.status();
    EXPECT_FALSE((*work)->IsCompleted()) << "the op ran before the caller's stream allowed it";
    ASSERT_OK((*work)->Wait());  // `user` now waits for the gather...
    // ...so zeroing the input behind it on `user` cannot reach the gather.
    ASSERT_EQ(cudaMemsetAsync(in->data(), 0, in->nbytes(), user), cudaSuccess);
    gate.open = true;
    ASSERT_EQ(cudaStreamSynchronize(user), cudaSuccess);
    EXPECT_TRUE((*work)->IsCompleted());
  }
  EXPECT_EQ(Download(*out), std::vector<double>(256, 0x07070707));
  EXPECT_EQ(Download(*in), std::vector<double>(256, 0));
  ASSERT_EQ(cudaStreamDestroy(user), cudaSuccess);
}

TEST_F(NcclGpuTest, WatchdogAbortsAnOpPendingPastTheTimeout) {
  NcclProcessGroupFactoryOptions options = DefaultOptions();
  options.group_options.timeout = absl::Milliseconds(300);
  MakeFactory(options);
  cudaStream_t user = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking), cudaSuccess);
  absl::StatusOr<Tensor> t = Upload(DType::kFloat32, {8}, Iota(8));
  ASSERT_TRUE(t.ok());
  StreamGate gate;
  ProcessGroup::WorkPtr work;
  {
    CudaStreamGuard guard(kCuda0, user);
    ASSERT_EQ(cudaLaunchHostFunc(user, &StreamGate::Hold, &gate), cudaSuccess);
    auto issued = world_->AllReduce(*t, ReduceOp::kSum);
    ASSERT_TRUE(issued.ok()) << issued.status();
    work = *issued;
  }
  // Keep the gate shut until the abort has settled the op: opened earlier,
  // the op could complete first and rightly count as a success.
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (!work->IsCompleted() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(10));
  gate.open = true;  // Let the stream drain whatever the abort left.
  const absl::Status health = world_->health();
  EXPECT_EQ(health.code(), absl::StatusCode::kDeadlineExceeded) << health;
  EXPECT_THAT(std::string(health.message()), HasSubstr("NCCL group 'world'"));
  EXPECT_THAT(std::string(health.message()), HasSubstr("all_reduce #0"));
  const absl::Status result = SynchronizeWork(*work, kSync);
  EXPECT_EQ(result, health);
  // Later ops fail at once with the same reason.
  EXPECT_EQ(world_->Barrier().status(), health);
  ASSERT_EQ(cudaStreamSynchronize(user), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(user), cudaSuccess);
}

TEST_F(NcclGpuTest, AbortFailsPendingWorkAndLaterOps) {
  cudaStream_t user = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking), cudaSuccess);
  absl::StatusOr<Tensor> t = Upload(DType::kFloat32, {8}, Iota(8));
  ASSERT_TRUE(t.ok());
  StreamGate gate;
  ProcessGroup::WorkPtr pending;
  {
    CudaStreamGuard guard(kCuda0, user);
    ASSERT_EQ(cudaLaunchHostFunc(user, &StreamGate::Hold, &gate), cudaSuccess);
    auto issued = world_->AllReduce(*t, ReduceOp::kSum);
    ASSERT_TRUE(issued.ok()) << issued.status();
    pending = *issued;
  }
  const absl::Status reason = absl::UnavailableError("rank 3 (host-b) exited with signal 9");
  // Open the gate from another thread once the abort has settled the op
  // (earlier, the op could complete first and rightly count as a success),
  // in case ncclCommAbort waits for the streams NCCL used.
  std::thread opener([&] {
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (!pending->IsCompleted() && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    gate.open = true;
  });
  pending->Abort(reason);  // A Work's abort aborts its group.
  opener.join();
  EXPECT_EQ(world_->health(), reason);
  EXPECT_TRUE(pending->IsCompleted());
  EXPECT_EQ(pending->status(), reason);
  EXPECT_EQ(pending->Wait(), reason);
  EXPECT_EQ(world_->AllReduce(*t, ReduceOp::kSum).status(), reason);
  // Idempotent: the first reason stays.
  world_->Abort(absl::AbortedError("second"));
  EXPECT_EQ(world_->health(), reason);
  ASSERT_EQ(cudaStreamSynchronize(user), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(user), cudaSuccess);
}

GroupSpec Spec(std::string family, int color, std::vector<int> ranks) {
  GroupSpec spec;
  spec.family = std::move(family);
  spec.color = color;
  spec.global_ranks = std::move(ranks);
  return spec;
}

TEST_F(NcclGpuTest, NewGroupsSplitsTheWorld) {
  if (!factory_->splits_communicators()) GTEST_SKIP() << "NCCL < 2.19: no ncclCommSplit";
  auto groups = factory_->NewGroups({Spec("mesh/dp", 0, {0}), Spec("mesh/tp", 0, {0})});
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 2u);
  EXPECT_EQ((*groups)[0]->name(), "mesh/dp/0");
  EXPECT_EQ((*groups)[1]->name(), "mesh/tp/0");
  for (const auto& group : *groups) {
    absl::StatusOr<Tensor> t = Upload(DType::kFloat32, {5}, Iota(5));
    ASSERT_TRUE(t.ok());
    auto work = group->AllReduce(*t, ReduceOp::kSum);
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_OK(SynchronizeWork(**work, kSync));
    EXPECT_EQ(Download(*t), Iota(5));
  }
  // The world is still usable after splitting.
  auto barrier = world_->Barrier();
  ASSERT_TRUE(barrier.ok()) << barrier.status();
  ASSERT_OK(SynchronizeWork(**barrier, kSync));
}

TEST_F(NcclGpuTest, SplitsAfterOpsAfterGroupsDieAndManyAtOnce) {
  if (!factory_->splits_communicators()) GTEST_SKIP() << "NCCL < 2.19: no ncclCommSplit";
  // The world has connected (an op ran) before it is split.
  absl::StatusOr<Tensor> t = Upload(DType::kFloat32, {8}, Iota(8));
  ASSERT_TRUE(t.ok());
  auto warm = world_->AllReduce(*t, ReduceOp::kSum);
  ASSERT_TRUE(warm.ok()) << warm.status();
  ASSERT_OK(SynchronizeWork(**warm, kSync));
  {
    auto once = factory_->NewGroups({Spec("mesh/a", 0, {0})});
    ASSERT_TRUE(once.ok()) << once.status();
  }  // The child is finalized and destroyed; the parent lives on.
  // Three children in one call, then the same family names again: NCCL
  // numbers each split of the parent, so names may repeat.
  for (int round = 0; round < 2; ++round) {
    auto groups = factory_->NewGroups(
        {Spec("mesh/a", 0, {0}), Spec("mesh/b", 0, {0}), Spec("mesh/c", 0, {0})});
    ASSERT_TRUE(groups.ok()) << "round " << round << ": " << groups.status();
    ASSERT_EQ(groups->size(), 3u);
    // Issue on every group before waiting for any: they run on their own
    // streams and may overlap.
    std::vector<Tensor> tensors;
    std::vector<ProcessGroup::WorkPtr> works;
    for (const auto& group : *groups) {
      absl::StatusOr<Tensor> x = Upload(DType::kInt32, {3}, Iota(3, 10));
      ASSERT_TRUE(x.ok());
      auto work = group->AllReduce(*x, ReduceOp::kMax);
      ASSERT_TRUE(work.ok()) << group->name() << ": " << work.status();
      tensors.push_back(*x);
      works.push_back(*work);
    }
    for (size_t i = 0; i < works.size(); ++i) {
      ASSERT_OK(SynchronizeWork(*works[i], kSync));
      EXPECT_EQ(Download(tensors[i]), Iota(3, 10));
      EXPECT_TRUE((*groups)[i]->health().ok());
    }
  }
  EXPECT_TRUE(world_->health().ok());
}

TEST_F(NcclGpuTest, AbortAllReachesSplitGroupsAndTheWorld) {
  auto groups = factory_->NewGroups({Spec("mesh/dp", 0, {0}), Spec("mesh/tp", 0, {0})});
  ASSERT_TRUE(groups.ok()) << groups.status();
  factory_->AbortAll(absl::AbortedError("rank 1 (host-b) exited with code 3"));
  absl::StatusOr<Tensor> t = Upload(DType::kFloat32, {4}, Iota(4));
  ASSERT_TRUE(t.ok());
  for (const auto& group : *groups) {
    EXPECT_EQ(group->health().code(), absl::StatusCode::kAborted) << group->name();
    EXPECT_EQ(group->AllReduce(*t, ReduceOp::kSum).status().code(), absl::StatusCode::kAborted);
  }
  EXPECT_EQ(world_->health().code(), absl::StatusCode::kAborted);
}

// DeviceMesh over NCCL on 1-, 2- and 3-D meshes of one rank: a dim that
// spans the whole world reuses the world group (only smaller dims are
// splits, which NewGroups above covers), and each per-dim group runs its
// collectives on the device, as does a flattened mesh.
TEST_F(NcclGpuTest, DeviceMeshPerDimGroupsRunCollectives) {
  std::shared_ptr<ProcessGroup> world = world_;
  world_.reset();
  std::shared_ptr<ProcessGroupFactory> shared(factory_.release());
  const std::vector<std::vector<std::string>> names = {{"dp"}, {"dp", "tp"}, {"pp", "dp", "tp"}};
  for (size_t m = 0; m < names.size(); ++m) {
    DeviceMeshOptions options;
    options.name = absl::StrCat("mesh", m);
    auto mesh =
        DeviceMesh::Init(shared, std::vector<int64_t>(names[m].size(), 1), names[m], options);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    for (const std::string& dim : names[m]) {
      auto group = mesh->GetGroup(dim);
      ASSERT_TRUE(group.ok()) << dim << ": " << group.status();
      EXPECT_EQ((*group)->backend(), "nccl");
      EXPECT_EQ(group->get(), world.get()) << "a dim of the whole world reuses its group";
      absl::StatusOr<Tensor> x = Upload(DType::kFloat32, {6}, Iota(6));
      absl::StatusOr<Tensor> gathered = Upload(DType::kFloat32, {6}, std::vector<double>(6, -1));
      absl::StatusOr<Tensor> scattered = Upload(DType::kFloat32, {6}, std::vector<double>(6, -1));
      ASSERT_TRUE(x.ok() && gathered.ok() && scattered.ok());
      auto sum = (*group)->AllReduce(*x, ReduceOp::kSum);
      ASSERT_TRUE(sum.ok()) << sum.status();
      ASSERT_OK(SynchronizeWork(**sum, kSync));
      auto gather = (*group)->AllGather(*x, *gathered);
      ASSERT_TRUE(gather.ok()) << gather.status();
      ASSERT_OK(SynchronizeWork(**gather, kSync));
      auto scatter = (*group)->ReduceScatter(*gathered, *scattered, ReduceOp::kSum);
      ASSERT_TRUE(scatter.ok()) << scatter.status();
      ASSERT_OK(SynchronizeWork(**scatter, kSync));
      auto bcast = (*group)->Broadcast(*scattered, 0);
      ASSERT_TRUE(bcast.ok()) << bcast.status();
      ASSERT_OK(SynchronizeWork(**bcast, kSync));
      EXPECT_EQ(Download(*scattered), Iota(6)) << options.name << "/" << dim;
    }
    if (names[m].size() > 1) {
      auto flat = mesh->Flatten();
      ASSERT_TRUE(flat.ok()) << flat.status();
      auto group = flat->GetGroup();
      ASSERT_TRUE(group.ok()) << group.status();
      auto barrier = (*group)->Barrier();
      ASSERT_TRUE(barrier.ok()) << barrier.status();
      ASSERT_OK(SynchronizeWork(**barrier, kSync));
    }
  }
}

TEST_F(NcclGpuTest, NewGroupsFromUniqueIdsOverAStore) {
  NcclProcessGroupFactoryOptions options = DefaultOptions();
  options.group_creation = NcclGroupCreation::kUniqueIds;
  auto store = std::make_shared<InMemoryStore>();
  options.store = store;
  MakeFactory(options);
  EXPECT_FALSE(factory_->splits_communicators());
  auto groups = factory_->NewGroups({Spec("mesh/tp", 0, {0})});
  ASSERT_TRUE(groups.ok()) << groups.status();
  absl::StatusOr<Tensor> t = Upload(DType::kBFloat16, {6}, Iota(6));
  ASSERT_TRUE(t.ok());
  auto work = (*groups)[0]->AllReduce(*t, ReduceOp::kAvg);
  ASSERT_TRUE(work.ok()) << work.status();
  ASSERT_OK(SynchronizeWork(**work, kSync));
  EXPECT_EQ(Download(*t), Iota(6));
  EXPECT_EQ(*store->NumKeys(), 0) << "a group of one needs no brokering";
}

TEST_F(NcclGpuTest, NewGroupsErrors) {
  auto bad = factory_->NewGroups({Spec("mesh/tp", 0, {1})});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();

  NcclProcessGroupFactoryOptions options = DefaultOptions();
  options.group_creation = NcclGroupCreation::kUniqueIds;  // ...and no store.
  MakeFactory(options);
  auto no_store = factory_->NewGroups({Spec("mesh/tp", 0, {0})});
  EXPECT_EQ(no_store.status().code(), absl::StatusCode::kFailedPrecondition) << no_store.status();

  factory_->AbortAll(absl::AbortedError("job failed: rank 2 died"));
  EXPECT_EQ(world_->health().message(), "job failed: rank 2 died");
  auto after = factory_->NewGroups({Spec("mesh/tp", 0, {0})});
  EXPECT_EQ(after.status().message(), "job failed: rank 2 died");
}

TEST_F(NcclGpuTest, WorkOutlivesItsGroup) {
  absl::StatusOr<Tensor> t = Upload(DType::kFloat32, {1024}, Iota(1024));
  ASSERT_TRUE(t.ok());
  auto work = world_->AllReduce(*t, ReduceOp::kMax);
  ASSERT_TRUE(work.ok()) << work.status();
  ProcessGroup::WorkPtr kept = *work;
  world_.reset();
  factory_.reset();  // Finalizes the world communicator.
  ASSERT_OK(SynchronizeWork(*kept, kSync));
  ASSERT_OK(kept->Wait());
  EXPECT_EQ(Download(*t), Iota(1024));
}

TEST_F(NcclGpuTest, DLPackTensorsGoThroughAllReduceWithoutCopies) {
  absl::StatusOr<Tensor> owner = Upload(DType::kFloat32, {2, 8}, Iota(16));
  ASSERT_TRUE(owner.ok());
  DLManagedTensor* exported = ToDLPack(*owner);
  ASSERT_EQ(exported->dl_tensor.device.device_type, kDLCUDA);
  absl::StatusOr<Tensor> imported = FromDLPack(exported);  // Consumes `exported`.
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->data(), owner->data());
  EXPECT_EQ(imported->device(), kCuda0);
  auto work = world_->AllReduce(*imported, ReduceOp::kSum);
  ASSERT_TRUE(work.ok()) << work.status();
  ASSERT_OK((*work)->Wait());
  EXPECT_EQ(Download(*owner), Iota(16));
}

// ---- Two ranks, one GPU each. ------------------------------------------------

TEST(NcclTwoRanksGpuTest, CollectivesSplitsAndUniqueIdGroups) {
  if (!HaveNcclAndDevice(2)) GTEST_SKIP() << "needs NCCL and two CUDA devices";
  absl::StatusOr<std::string> id = GenerateNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::string> failures(2);
  auto rank_main = [&](int r) {
    auto fail = [&](absl::string_view what, const absl::Status& s) {
      failures[r] = absl::StrCat(what, ": ", s.ToString());
    };
    NcclProcessGroupFactoryOptions options;
    options.world_rank = r;
    options.world_size = 2;
    options.device = Device::Cuda(r);
    options.world_unique_id = *id;
    options.init_timeout = absl::Seconds(60);
    options.group_options.timeout = absl::Seconds(60);
    options.store = store;
    auto factory = NcclProcessGroupFactory::Create(options);
    if (!factory.ok()) return fail("Create", factory.status());
    std::shared_ptr<ProcessGroup> world = *(*factory)->World();
    const Device dev = Device::Cuda(r);

    // all_reduce: [r+1, ...] summed over ranks = 3; avg = 1.5.
    absl::StatusOr<Tensor> t = Upload(DType::kFloat32, {4}, std::vector<double>(4, r + 1), dev);
    auto w = world->AllReduce(*t, ReduceOp::kSum);
    if (!w.ok()) return fail("AllReduce", w.status());
    if (auto s = SynchronizeWork(**w, kSync); !s.ok()) return fail("AllReduce wait", s);
    if (Download(*t) != std::vector<double>(4, 3)) failures[r] = "all_reduce sum is wrong";

    // broadcast from rank 1.
    absl::StatusOr<Tensor> b = Upload(DType::kInt32, {3}, std::vector<double>(3, 10 * r), dev);
    w = world->Broadcast(*b, 1);
    if (!w.ok() || !SynchronizeWork(**w, kSync).ok()) return fail("Broadcast", w.status());
    if (Download(*b) != std::vector<double>(3, 10)) failures[r] = "broadcast is wrong";

    // all_gather and reduce_scatter.
    absl::StatusOr<Tensor> in = Upload(DType::kBFloat16, {2}, {2.0 * r, 2.0 * r + 1}, dev);
    absl::StatusOr<Tensor> out = Upload(DType::kBFloat16, {4}, std::vector<double>(4, -1), dev);
    w = world->AllGather(*in, *out);
    if (!w.ok() || !SynchronizeWork(**w, kSync).ok()) return fail("AllGather", w.status());
    if (Download(*out) != Iota(4, 0)) failures[r] = "all_gather is wrong";
    absl::StatusOr<Tensor> half = Upload(DType::kBFloat16, {2}, {-1, -1}, dev);
    w = world->ReduceScatter(*out, *half, ReduceOp::kSum);
    if (!w.ok() || !SynchronizeWork(**w, kSync).ok()) return fail("ReduceScatter", w.status());
    if (Download(*half) != std::vector<double>{4.0 * r, 4.0 * r + 2}) {
      failures[r] = "reduce_scatter is wrong";
    }

    // Uneven all_to_all: rank 0 sends 1 row to 0 and 2 to 1; rank 1 sends
    // 3 rows to 0 and 0 to 1.
    const std::vector<int64_t> send =
        r == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{3, 0};
    const std::vector<int64_t> recv =
        r == 0 ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{2, 0};
    const int64_t rows_in = send[0] + send[1];
    const int64_t rows_out = recv[0] + recv[1];
    absl::StatusOr<Tensor> a_in =
        Upload(DType::kInt64, {rows_in, 2}, Iota(static_cast<int>(rows_in * 2), 100 * r), dev);
    absl::StatusOr<Tensor> a_out =
        Upload(DType::kInt64, {rows_out, 2}, std::vector<double>(rows_out * 2, -7), dev);
    w = world->AllToAll(*a_in, *a_out, send, recv);
    if (!w.ok() || !SynchronizeWork(**w, kSync).ok()) return fail("AllToAll", w.status());
    const std::vector<double> expected_a2a =
        r == 0 ? std::vector<double>{0, 1, 100, 101, 102, 103, 104, 105}
               : std::vector<double>{2, 3, 4, 5};
    if (Download(*a_out) != expected_a2a) failures[r] = "all_to_all is wrong";

    // send / recv.
    absl::StatusOr<Tensor> p =
        Upload(DType::kUInt8, {5}, std::vector<double>(5, r == 0 ? 9 : 0), dev);
    w = r == 0 ? world->Send(*p, 1) : world->Recv(*p, 0);
    if (!w.ok() || !SynchronizeWork(**w, kSync).ok()) return fail("Send/Recv", w.status());
    if (Download(*p) != std::vector<double>(5, 9)) failures[r] = "send/recv is wrong";

    // A split group and a unique-id group, both of the two ranks.
    for (NcclGroupCreation how : {NcclGroupCreation::kAuto, NcclGroupCreation::kUniqueIds}) {
      std::unique_ptr<NcclProcessGroupFactory> f2;
      NcclProcessGroupFactory* f = factory->get();
      if (how == NcclGroupCreation::kUniqueIds) {
        // A second world for this mode; rank 0 publishes its id in the store.
        options.group_creation = how;
        if (r == 0) {
          absl::StatusOr<std::string> id2 = GenerateNcclUniqueId();
          if (!id2.ok() || !store->Set("test/world2", *id2).ok()) return fail("id2", id2.status());
        }
        absl::StatusOr<std::string> id2 = store->Get("test/world2", absl::Seconds(30));
        if (!id2.ok()) return fail("id2 get", id2.status());
        options.world_unique_id = *id2;
        auto made = NcclProcessGroupFactory::Create(options);
        if (!made.ok()) return fail("Create 2", made.status());
        f2 = *std::move(made);
        f = f2.get();
      }
      auto groups = f->NewGroups({Spec("pair", 0, {1, 0})});  // Reversed: rank 1 leads.
      if (!groups.ok()) return fail("NewGroups", groups.status());
      std::shared_ptr<ProcessGroup> g = (*groups)[0];
      if (g->rank() != 1 - r) failures[r] = "group rank is not the spec's order";
      absl::StatusOr<Tensor> x = Upload(DType::kInt32, {2}, {double(g->rank()), 5}, dev);
      w = g->AllReduce(*x, ReduceOp::kMax);
      if (!w.ok() || !SynchronizeWork(**w, kSync).ok()) return fail("group op", w.status());
      if (Download(*x) != std::vector<double>{1, 5}) failures[r] = "group all_reduce is wrong";
    }
  };
  std::thread r0(rank_main, 0);
  std::thread r1(rank_main, 1);
  r0.join();
  r1.join();
  EXPECT_EQ(failures[0], "");
  EXPECT_EQ(failures[1], "");
}

}  // namespace process_group_nccl_gpu_test
}  // namespace mesh
