// The coordinator's state directory on a full filesystem (reliability suite,
// scenario 10; docs/failure-semantics.md), two ways: a 2 MiB tmpfs mounted
// for the test and filled to the brim by a filler file; and, on any
// machine, an injected ENOSPC: the coordinator runs with LD_PRELOAD of
// mesh_enospc_preload (tests/fault/enospc_preload.c), whose writes under
// the state directory fail with ENOSPC while a trigger file exists.
//
// Asserts: submits are refused with RESOURCE_EXHAUSTED naming the full disk,
// and store nothing; GetJob and ListJobs keep answering; once the filler is
// deleted, submits succeed again without a restart (including a retry of a
// refused submit with its idempotency key, which makes exactly one job);
// nothing acknowledged before, during or after is lost, across a kill -9 and
// restart.
//
// The tmpfs case needs mount(2) (root, or CAP_SYS_ADMIN) and is skipped
// where it is refused; the injected case always runs.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/v1/job.grpc.pb.h"
#include "tests/util/mesh_cluster.h"
#include "tests/util/proc.h"

namespace mesh {
namespace disk_full_test {

using ::mesh::testing::ContextWithDeadline;
using ::mesh::testing::MeshCluster;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using namespace mesh::v1;  // NOLINT

// A tmpfs of `size` at a fresh directory, unmounted and removed on
// destruction (after the coordinator using it is gone: declare it first).
class TmpfsMount {
 public:
  explicit TmpfsMount(const std::string& size) {
    char pattern[] = "/tmp/mesh-fault-tmpfs-XXXXXX";
    const char* dir = mkdtemp(pattern);
    if (dir == nullptr) {
      error_ = absl::StrCat("mkdtemp: ", std::strerror(errno));
      return;
    }
    dir_ = dir;
    if (mount("tmpfs", dir_.c_str(), "tmpfs", 0, absl::StrCat("size=", size).c_str()) != 0) {
      error_ = absl::StrCat("mount -t tmpfs -o size=", size, " ", dir_, ": ", std::strerror(errno));
      return;
    }
    mounted_ = true;
  }
  ~TmpfsMount() {
    if (mounted_ && umount2(dir_.c_str(), MNT_DETACH) != 0) {
      std::fprintf(stderr, "umount %s: %s\n", dir_.c_str(), std::strerror(errno));
    }
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::string error_;
  bool mounted_ = false;
};

// Writes `path` until the filesystem refuses (ENOSPC); returns the bytes
// written, or -1 when it failed otherwise.
int64_t FillUp(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return -1;
  std::string block(4096, 'x');
  int64_t written = 0;
  // Bounded: a 2 MiB filesystem holds at most 512 blocks.
  for (int i = 0; i < 100'000; ++i) {
    const ssize_t n = write(fd, block.data(), block.size());
    if (n < 0) {
      const bool full = errno == ENOSPC;
      close(fd);
      return full ? written : -1;
    }
    written += n;
  }
  close(fd);
  return -1;
}

class DiskFullTest : public ::testing::Test {
 protected:
  DiskFullTest()
      : mount_("2m"), cluster_({MESH_COORDINATOR_BIN, MESH_AGENT_BIN}, "mesh-fault-disk") {}

  JobSpec Spec(const std::string& key) {
    JobSpec spec;
    spec.set_name(key.empty() ? "job" : key);
    spec.add_command("/bin/true");
    spec.mutable_nodes()->set_min(1);
    spec.set_nproc_per_node(1);
    spec.set_idempotency_key(key);
    return spec;
  }

  grpc::Status Submit(const JobSpec& spec, SubmitJobResponse* response) {
    SubmitJobRequest request;
    *request.mutable_spec() = spec;
    return cluster_.jobs().SubmitJob(ContextWithDeadline(absl::Seconds(20)).get(), request,
                                     response);
  }

  // The scenario: `fill` makes the state filesystem full, `free_space`
  // frees it again (each false on failure); at most
  // `max_accepted_while_full` submits may still fit once it is full.
  void RunScenario(const std::function<bool()>& fill, const std::function<bool()>& free_space,
                   int max_accepted_while_full) {
    ASSERT_TRUE(cluster_.StartCoordinator().ok());

    std::map<std::string, std::string> acked;  // id -> key
    auto submit_ok = [&](const std::string& key) {
      SubmitJobResponse response;
      const grpc::Status status = Submit(Spec(key), &response);
      EXPECT_TRUE(status.ok()) << key << ": " << status.error_message();
      if (status.ok()) acked[response.job().id()] = key;
      return status.ok();
    };
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(submit_ok(absl::StrCat("before-", i)));

    ASSERT_TRUE(fill()) << "could not fill the state filesystem";

    // SQLite may still fit a few commits in pages it already has (the WAL is
    // reused): submit until one is refused, counting those acknowledged.
    grpc::Status refused;
    std::string refused_key;
    int accepted_while_full = 0;
    // Bounded by what may fit, plus the one that must be refused.
    for (int i = 0; i <= max_accepted_while_full && refused.ok(); ++i) {
      refused_key = absl::StrCat("full-", i);
      SubmitJobResponse response;
      refused = Submit(Spec(refused_key), &response);
      if (refused.ok()) {
        acked[response.job().id()] = refused_key;
        ++accepted_while_full;
      }
    }
    ASSERT_FALSE(refused.ok()) << accepted_while_full << " submits fit on a full filesystem";
    std::printf("[ scenario 10 ] %d submit(s) still fit; then refused: %d %s\n",
                accepted_while_full, static_cast<int>(refused.error_code()),
                refused.error_message().c_str());
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << refused.error_message();
    EXPECT_THAT(refused.error_message(), AnyOf(HasSubstr("disk is full"), HasSubstr("disk full")));

    // Still full: refused again, the same way, and nothing half-stored.
    SubmitJobResponse again;
    const grpc::Status second = Submit(Spec("full-again"), &again);
    EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << second.error_message();

    // A cancel commits a transition: refused the same way, and the job is as
    // it was (PENDING), in memory and on disk.
    const std::string first_id = acked.begin()->first;
    CancelJobRequest cancel;
    cancel.set_job_id(first_id);
    CancelJobResponse cancelled;
    const grpc::Status cancel_full =
        cluster_.jobs().CancelJob(ContextWithDeadline(absl::Seconds(10)).get(), cancel, &cancelled);
    EXPECT_EQ(cancel_full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << cancel_full.error_message();
    EXPECT_EQ(cluster_.GetJob(first_id)->state(), JOB_STATE_PENDING);

    // Reads keep working, and show exactly what was acknowledged.
    auto expect_exactly_acked = [&](const char* when) {
      SCOPED_TRACE(when);
      absl::StatusOr<std::vector<Job>> all = cluster_.ListAllJobs();
      ASSERT_TRUE(all.ok()) << all.status();
      std::map<std::string, std::string> listed;
      for (const Job& job : *all) listed[job.id()] = job.spec().idempotency_key();
      EXPECT_EQ(listed, acked);
      for (const auto& [id, key] : acked) {
        absl::StatusOr<Job> job = cluster_.GetJob(id);
        ASSERT_TRUE(job.ok()) << id << ": " << job.status();
        EXPECT_EQ(job->spec().idempotency_key(), key);
      }
    };
    expect_exactly_acked("while full");

    // Space again: no restart needed.
    ASSERT_TRUE(free_space()) << "could not free space";
    // The refused submit, retried with its key: one job.
    ASSERT_TRUE(submit_ok(refused_key));
    SubmitJobResponse retried;
    ASSERT_TRUE(Submit(Spec(refused_key), &retried).ok());
    EXPECT_TRUE(retried.deduplicated());
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(submit_ok(absl::StrCat("after-", i)));
    // The refused cancel, again: now it commits.
    const grpc::Status cancel_status =
        cluster_.jobs().CancelJob(ContextWithDeadline(absl::Seconds(10)).get(), cancel, &cancelled);
    ASSERT_TRUE(cancel_status.ok()) << cancel_status.error_message();
    EXPECT_EQ(cancelled.job().state(), JOB_STATE_CANCELLED);
    expect_exactly_acked("after freeing space");

    // And all of it is durable.
    ASSERT_TRUE(cluster_.KillCoordinator().ok());
    ASSERT_TRUE(cluster_.StartCoordinator(cluster_.port()).ok());
    expect_exactly_acked("after kill -9 and restart");
    EXPECT_EQ(cluster_.GetJob(acked.begin()->first)->state(), JOB_STATE_CANCELLED);
  }

  TmpfsMount mount_;  // Outlives the coordinator (destroyed after cluster_).
  MeshCluster cluster_;
};

TEST_F(DiskFullTest, SubmitsAreRefusedReadsWorkAndFreeingSpaceRecoversWithoutRestart) {
  if (!mount_.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here: " << mount_.error();
  cluster_.set_state_dir(mount_.dir() + "/state");
  const std::string filler = mount_.dir() + "/filler";
  RunScenario(
      [&] {
        const int64_t filled = FillUp(filler);
        std::printf("[ scenario 10 ] filled the 2 MiB tmpfs with %lld bytes\n",
                    static_cast<long long>(filled));
        return filled >= 0;
      },
      [&] { return unlink(filler.c_str()) == 0; },
      // SQLite may still fit a few commits in pages it already has.
      /*max_accepted_while_full=*/2000);
}

// The same, with the full disk injected: runs where mount(2) is refused.
TEST_F(DiskFullTest, InjectedEnospcRefusesSubmitsReadsWorkAndRemovingItRecovers) {
  // The library compares against readlink(/proc/self/fd/N): canonical paths.
  char* real_dir = realpath(cluster_.dir().c_str(), nullptr);
  ASSERT_NE(real_dir, nullptr) << cluster_.dir() << ": " << std::strerror(errno);
  const std::string dir = real_dir;
  free(real_dir);
  const std::string trigger = dir + "/enospc-trigger";  // Outside the state directory.
  cluster_.set_state_dir(dir + "/state");
  // ASan (MESH_SANITIZE=address) insists on being first in the library
  // list; the preloaded library is not instrumented, so let it be.
  const char* asan = std::getenv("ASAN_OPTIONS");
  cluster_.set_coordinator_env(
      {absl::StrCat("LD_PRELOAD=", MESH_ENOSPC_PRELOAD_LIB),
       absl::StrCat("MESH_TEST_ENOSPC_DIR=", dir, "/state"),
       absl::StrCat("MESH_TEST_ENOSPC_TRIGGER=", trigger),
       absl::StrCat("ASAN_OPTIONS=", asan == nullptr ? "" : asan,
                    asan == nullptr || *asan == '\0' ? "" : ":", "verify_asan_link_order=0")});
  RunScenario(
      [&] {
        const int fd = open(trigger.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0) return false;
        close(fd);
        return true;
      },
      [&] { return unlink(trigger.c_str()) == 0; },
      // Every write under the state directory fails: the first submit is
      // refused.
      /*max_accepted_while_full=*/0);
}

}  // namespace disk_full_test
}  // namespace mesh
