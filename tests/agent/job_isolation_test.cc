// JobIsolation's decisions: which account a LAUNCH's workers run as, and
// what is refused; the directories it hands over; limits without cgroups.
// The account cases need root (they look up real accounts and chown);
// they skip without it.
#include "agent/job_isolation.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/util/proc.h"

namespace mesh::agent {
namespace job_isolation_test {

using ::testing::HasSubstr;

v1::Assignment Launch(const std::string& owner, const std::string& unix_user,
                      bool allow_root = false) {
  v1::Assignment order;
  order.set_job_id("job-7");
  order.set_owner(owner);
  order.set_unix_user(unix_user);
  order.set_allow_root(allow_root);
  return order;
}

// The account's groups as the C library lists them, its primary one included.
std::vector<gid_t> GroupsOf(const char* name) {
  const struct passwd* pw = getpwnam(name);
  if (pw == nullptr) return {};
  const gid_t primary = pw->pw_gid;
  int count = 256;
  std::vector<gid_t> groups(count);
  if (getgrouplist(name, primary, groups.data(), &count) < 0) return {};
  groups.resize(count);
  return groups;
}

struct stat StatOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << path;
  return st;
}

std::unique_ptr<JobIsolation> Make(JobIsolationOptions options) {
  auto made = JobIsolation::Create(std::move(options), nullptr);
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? *std::move(made) : nullptr;
}

class JobIsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "running workers as other accounts needs root";
    if (getpwnam("nobody") == nullptr) GTEST_SKIP() << "no account \"nobody\" here";
  }
};

TEST_F(JobIsolationTest, OwnersRunAsTheirAccountWithItsGroupsAndHome) {
  auto isolation = Make({});
  ASSERT_NE(isolation, nullptr);
  EXPECT_TRUE(isolation->runs_as_owner());
  auto run_as = isolation->RunAs(Launch("alice", "nobody"));
  ASSERT_TRUE(run_as.ok()) << run_as.status();
  ASSERT_TRUE(run_as->has_value());
  const struct passwd* nobody = getpwnam("nobody");
  EXPECT_EQ((*run_as)->uid, nobody->pw_uid);
  EXPECT_EQ((*run_as)->gid, nobody->pw_gid);
  EXPECT_THAT((*run_as)->groups, ::testing::UnorderedElementsAreArray(GroupsOf("nobody")));
  EXPECT_EQ((*run_as)->user, "nobody");
  EXPECT_EQ((*run_as)->home, nobody->pw_dir);
}

TEST_F(JobIsolationTest, RefusalsSayWhyAndNeverPickAnotherAccount) {
  auto isolation = Make({});
  ASSERT_NE(isolation, nullptr);
  auto unmapped = isolation->RunAs(Launch("alice", ""));
  EXPECT_EQ(unmapped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(unmapped.status().message()),
              HasSubstr("alice has no unix_user in the coordinator's token file"));
  auto unknown = isolation->RunAs(Launch("alice", "mesh-no-such-user"));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("there is no account \"mesh-no-such-user\" on this node"));
  auto root = isolation->RunAs(Launch("alice", "root"));
  EXPECT_EQ(root.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(root.status().message()), HasSubstr("allow_root: true"));
  auto allowed = isolation->RunAs(Launch("alice", "root", true));
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_EQ((*allowed)->uid, 0u);
  auto unowned = isolation->RunAs(Launch("", ""));
  EXPECT_EQ(unowned.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(unowned.status().message()), HasSubstr("--unowned-job-user"));
}

TEST_F(JobIsolationTest, UnownedJobsRunAsTheAccountTheOperatorNamed) {
  JobIsolationOptions options;
  options.unowned_job_user = "root";  // The operator's explicit choice.
  auto isolation = Make(options);
  ASSERT_NE(isolation, nullptr);
  auto run_as = isolation->RunAs(Launch("", ""));
  ASSERT_TRUE(run_as.ok()) << run_as.status();
  EXPECT_EQ((*run_as)->uid, 0u);
  EXPECT_THAT(isolation->Describe().users(), HasSubstr("jobs without an owner as root"));
  options.unowned_job_user = "mesh-no-such-user";
  EXPECT_EQ(JobIsolation::Create(options, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(JobIsolationTest, DirectoriesGoToTheAccountAndOnlyIt) {
  const std::string work = testing::MakeTempDir("mesh-isolation-dirs");
  const std::string gen = work + "/jobs/job-7/gen-0";
  auto isolation = Make({});
  ASSERT_NE(isolation, nullptr);
  auto account = isolation->RunAs(Launch("alice", "nobody"));
  ASSERT_TRUE(account.ok());
  ASSERT_TRUE(isolation->PrepareDirectory(gen, *account).ok());
  for (const std::string& dir : {gen, work + "/jobs/job-7"}) {
    struct stat st;
    ASSERT_EQ(stat(dir.c_str(), &st), 0) << dir;
    EXPECT_EQ(st.st_uid, (*account)->uid) << dir;
    EXPECT_EQ(st.st_gid, (*account)->gid) << dir;
    EXPECT_EQ(st.st_mode & 0777, 0700u) << dir;
  }
  struct stat jobs;
  ASSERT_EQ(stat((work + "/jobs").c_str(), &jobs), 0);
  EXPECT_EQ(jobs.st_mode & 0777, 0711u);
  std::filesystem::remove_all(work);
}

TEST_F(JobIsolationTest, AnOwnerWithoutAnAccountNeverGetsTheUnownedJobsOne) {
  JobIsolationOptions options;
  options.unowned_job_user = "nobody";
  auto isolation = Make(options);
  ASSERT_NE(isolation, nullptr);
  auto owned = isolation->RunAs(Launch("alice", ""));
  EXPECT_EQ(owned.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(owned.status().message()), HasSubstr("job job-7 of alice"));
  auto unowned = isolation->RunAs(Launch("", ""));
  ASSERT_TRUE(unowned.ok()) << unowned.status();
  EXPECT_EQ((*unowned)->user, "nobody");
  EXPECT_EQ((*unowned)->uid, getpwnam("nobody")->pw_uid);
  // An owner whose account is root still needs allow_root, whatever the
  // operator allows for unowned jobs.
  options.unowned_job_user = "root";
  isolation = Make(options);
  ASSERT_NE(isolation, nullptr);
  EXPECT_EQ(isolation->RunAs(Launch("alice", "root")).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobIsolationTest, AnUnknownUnownedJobUserIsNamedAtCreate) {
  JobIsolationOptions options;
  options.unowned_job_user = "mesh-no-such-user";
  auto made = JobIsolation::Create(options, nullptr);
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(made.status().message()), HasSubstr("--unowned-job-user"));
  EXPECT_THAT(std::string(made.status().message()), HasSubstr("mesh-no-such-user"));
}

TEST_F(JobIsolationTest, WithoutAnAccountTheDirectoryStaysTheAgents) {
  const std::string work = testing::MakeTempDir("mesh-isolation-own");
  const std::string gen = work + "/jobs/job-7/gen-0";
  auto isolation = Make({});
  ASSERT_NE(isolation, nullptr);
  ASSERT_TRUE(isolation->PrepareDirectory(gen, std::nullopt).ok());
  EXPECT_EQ(StatOf(gen).st_uid, geteuid());
  EXPECT_EQ(StatOf(work + "/jobs/job-7").st_uid, geteuid());
  std::filesystem::remove_all(work);
}

// The job directory is the account's, so a worker of generation 0 can put a
// symlink where generation 1's directory goes. Following it would give the
// target (here a directory standing for /etc) to the account.
TEST_F(JobIsolationTest, APlantedSymlinkIsRefusedAndItsTargetUntouched) {
  const std::string work = testing::MakeTempDir("mesh-isolation-planted");
  const std::string target = work + "/etc";
  ASSERT_EQ(mkdir(target.c_str(), 0755), 0);
  auto isolation = Make({});
  ASSERT_NE(isolation, nullptr);
  auto account = isolation->RunAs(Launch("alice", "nobody"));
  ASSERT_TRUE(account.ok());
  ASSERT_TRUE(isolation->PrepareDirectory(work + "/jobs/job-7/gen-0", *account).ok());
  const std::string gen1 = work + "/jobs/job-7/gen-1";
  ASSERT_EQ(symlink(target.c_str(), gen1.c_str()), 0);
  const absl::Status refused = isolation->PrepareDirectory(gen1, *account);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr(gen1));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("symlink"));
  const struct stat st = StatOf(target);
  EXPECT_EQ(st.st_uid, 0u) << "the symlink's target was given to the account";
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  std::filesystem::remove_all(work);
}

TEST(JobIsolationOffTest, OffRunsAsTheAgentAndSaysSo) {
  JobIsolationOptions options;
  options.run_as_owner = false;
  auto isolation = Make(options);
  ASSERT_NE(isolation, nullptr);
  EXPECT_FALSE(isolation->runs_as_owner());
  auto run_as = isolation->RunAs(Launch("alice", ""));
  ASSERT_TRUE(run_as.ok());
  EXPECT_FALSE(run_as->has_value());
  const v1::NodeIsolation described = isolation->Describe();
  EXPECT_FALSE(described.run_as_owner());
  EXPECT_THAT(described.users(), HasSubstr("off"));
  EXPECT_EQ(described.cgroup_version(), "none");
  EXPECT_EQ(described.kill_mechanism(), "process group + environment scan");
}

TEST(JobIsolationOffTest, LimitsWithoutCgroupsAreRefusedNamingThem) {
  auto isolation = Make({});
  ASSERT_NE(isolation, nullptr);
  v1::Assignment order = Launch("alice", "nobody");
  auto none = isolation->CreateCgroup(order);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);
  order.set_memory_per_proc_bytes(int64_t{1} << 30);
  auto memory = isolation->CreateCgroup(order);
  EXPECT_EQ(memory.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(memory.status().message()), HasSubstr("memory_per_proc"));
  order.set_memory_per_proc_bytes(0);
  order.set_max_pids(64);
  EXPECT_THAT(std::string(isolation->CreateCgroup(order).status().message()),
              HasSubstr("max_pids"));
}

TEST(FormatBytesTest, LargestUnitThatDivides) {
  EXPECT_EQ(FormatBytes(int64_t{8} << 30), "8 GiB");
  EXPECT_EQ(FormatBytes(int64_t{512} << 20), "512 MiB");
  EXPECT_EQ(FormatBytes(1536 << 10), "1536 KiB");
  EXPECT_EQ(FormatBytes(100), "100 B");
  EXPECT_EQ(FormatBytes(0), "0 B");
}

TEST(JobIsolationOffTest, DescribeSaysWhyThereAreNoCgroups) {
  JobIsolationOptions options;
  options.no_cgroups_reason = "not usable: no cgroup v2 hierarchy at /x";
  auto isolation = Make(options);
  ASSERT_NE(isolation, nullptr);
  EXPECT_EQ(isolation->Describe().cgroups(), "none (not usable: no cgroup v2 hierarchy at /x)");
  auto plain = Make({});
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->Describe().cgroups(), "none (mesh-agent --cgroups=none)");
}

}  // namespace job_isolation_test
}  // namespace mesh::agent
