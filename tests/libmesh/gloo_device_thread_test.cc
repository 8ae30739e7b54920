// The scheduling policy of gloo's TCP device thread
// (libmesh/src/backends/gloo/gloo_device_thread.h).
//
// This is the regression guard for small TCP collectives taking 3-10 ms
// (docs/performance.md, "Small messages"): it checks the mechanism, not a
// timing. Where the device thread runs SCHED_OTHER, its wake-ups preempt the
// collective's thread while that thread holds a connection's lock, and gloo
// spins on the lock until the next scheduler tick.
#include <dirent.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <memory>
#include <string>

#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>

#include "backends/gloo/gloo_device_thread.h"
#include "mesh/in_memory_store.h"
#include "mesh/process_group_gloo.h"

namespace mesh {
namespace gloo_device_thread_test {

pid_t ThisThread() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// Threads of this process whose policy is SCHED_BATCH.
int BatchThreads() {
  int count = 0;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (struct dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const pid_t tid = static_cast<pid_t>(std::stoi(entry->d_name));
    if (::sched_getscheduler(tid) == SCHED_BATCH) ++count;
  }
  ::closedir(dir);
  return count;
}

std::shared_ptr<::gloo::transport::Device> LoopbackDevice() {
  ::gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  return ::gloo::transport::tcp::CreateDevice(attr);
}

TEST(GlooDeviceThread, SwitchesTheDeviceThreadAndNotTheCaller) {
  auto device = LoopbackDevice();
  ASSERT_NE(device, nullptr);
  absl::StatusOr<pid_t> tid = gloo_backend::SetDeviceThreadBatchPolicy(device);
  ASSERT_TRUE(tid.ok()) << tid.status();
  EXPECT_NE(*tid, ThisThread());
  // A thread of this process...
  EXPECT_EQ(::access(("/proc/self/task/" + std::to_string(*tid)).c_str(), F_OK), 0);
  // ...now batch, while the caller keeps its policy.
  EXPECT_EQ(::sched_getscheduler(*tid), SCHED_BATCH);
  EXPECT_EQ(::sched_getscheduler(0), SCHED_OTHER);
  // Idempotent, and the same thread answers again.
  absl::StatusOr<pid_t> again = gloo_backend::SetDeviceThreadBatchPolicy(device);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *tid);
}

TEST(GlooDeviceThread, RejectsANullDevice) {
  EXPECT_EQ(gloo_backend::SetDeviceThreadBatchPolicy(nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

std::unique_ptr<GlooProcessGroupFactory> MakeFactory(bool batch_device_thread) {
  InMemoryStoreOptions store_options;
  store_options.timeout = absl::Seconds(30);
  GlooOptions options;
  options.hostname = "127.0.0.1";
  options.batch_device_thread = batch_device_thread;
  auto factory = GlooProcessGroupFactory::Create(std::make_shared<InMemoryStore>(store_options),
                                                 /*world_rank=*/0, /*world_size=*/1, options);
  EXPECT_TRUE(factory.ok()) << factory.status();
  return factory.ok() ? *std::move(factory) : nullptr;
}

TEST(GlooDeviceThread, FactoryRunsItsDeviceThreadUnderSchedBatchByDefault) {
  const int before = BatchThreads();
  ASSERT_GE(before, 0);
  {
    std::unique_ptr<GlooProcessGroupFactory> factory =
        MakeFactory(GlooOptions{}.batch_device_thread);
    ASSERT_NE(factory, nullptr);
    EXPECT_EQ(BatchThreads(), before + 1);
  }
  // The device (and its thread) went with the factory.
  EXPECT_EQ(BatchThreads(), before);
}

TEST(GlooDeviceThread, FactoryLeavesThePolicyAloneWhenAskedTo) {
  const int before = BatchThreads();
  std::unique_ptr<GlooProcessGroupFactory> factory = MakeFactory(false);
  ASSERT_NE(factory, nullptr);
  EXPECT_EQ(BatchThreads(), before);
}

}  // namespace gloo_device_thread_test
}  // namespace mesh
