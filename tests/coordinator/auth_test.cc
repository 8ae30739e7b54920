// Authenticator (token file, worker tokens, reload) and the authorization
// rules of coordinator/auth.h.
#include "coordinator/auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace mesh::coordinator {
namespace auth_test {

using ::testing::HasSubstr;

constexpr char kAliceToken[] = "a-user-token-of-alice";

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mesh-auth-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    tokens_ = dir_ + "/tokens.yaml";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& path, const std::string& content) {
    // Write-then-rename: a new inode, as an editor or a Secret update does.
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp) << content;
    std::filesystem::rename(tmp, path);
  }

  absl::StatusOr<std::unique_ptr<Authenticator>> Create(const std::string& content) {
    Write(tokens_, content);
    return Authenticator::Create({tokens_, dir_ + "/worker.key"});
  }

  static std::string Basic() {
    return R"(tokens:
  - name: ops
    role: admin
    token: "an-admin-token-0123"
  - name: alice
    role: user
    token: "a-user-token-of-alice"
  - name: node-1
    role: agent
    token: "agent-token-node-one"
)";
  }

  std::string dir_;
  std::string tokens_;
};

TEST_F(AuthTest, TokensMapToTheirPrincipals) {
  auto auth = Create(Basic());
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->token_count(), 3u);
  auto ops = (*auth)->Authenticate("an-admin-token-0123");
  ASSERT_TRUE(ops.ok());
  EXPECT_EQ(ops->role, Role::kAdmin);
  EXPECT_EQ(ops->name, "ops");
  auto alice = (*auth)->Authenticate(kAliceToken);
  ASSERT_TRUE(alice.ok());
  EXPECT_EQ(alice->role, Role::kUser);
  EXPECT_EQ(alice->name, "alice");
  auto agent = (*auth)->Authenticate("agent-token-node-one");
  ASSERT_TRUE(agent.ok());
  EXPECT_EQ(agent->role, Role::kAgent);
  EXPECT_EQ(agent->name, "node-1");
}

TEST_F(AuthTest, UnknownAndEmptyTokensAreUnauthenticated) {
  auto auth = Create(Basic());
  ASSERT_TRUE(auth.ok());
  EXPECT_EQ((*auth)->Authenticate("").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*auth)->Authenticate("an-admin-token-0124").status().code(),
            absl::StatusCode::kUnauthenticated);
  // A prefix of a valid token is not the token.
  EXPECT_EQ((*auth)->Authenticate("an-admin-token-012").status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(AuthTest, HashedTokensAreAccepted) {
  // The digest of alice's token from coreutils' sha256sum, an independent
  // implementation, written in upper case (accepted as well).
  const std::string hex = [] {
    FILE* pipe = ::popen("printf %s a-user-token-of-alice | sha256sum", "r");
    char buf[65] = {};
    if (pipe == nullptr || std::fread(buf, 1, 64, pipe) != 64) return std::string();
    ::pclose(pipe);
    return std::string(buf, 64);
  }();
  ASSERT_EQ(hex.size(), 64u) << "sha256sum is part of coreutils";
  std::string upper = hex;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  auto auth =
      Create(absl::StrCat("tokens:\n  - {name: alice, role: user, token_sha256: ", upper, "}\n"));
  ASSERT_TRUE(auth.ok()) << auth.status();
  auto alice = (*auth)->Authenticate(kAliceToken);
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->name, "alice");
}

TEST_F(AuthTest, BadFilesAreRejectedWithTheEntryNamed) {
  struct Case {
    const char* content;
    const char* message;
  };
  for (const Case& c : {
           Case{"tokens: 3\n", "expected a `tokens:` list"},
           Case{"tokens:\n  - {role: user, token: abcdefghijklmnopq}\n", "`name` is required"},
           Case{"tokens:\n  - {name: a, role: root, token: abcdefghijklmnopq}\n",
                "not one of admin, user, agent"},
           Case{"tokens:\n  - {name: a, role: user, token: short}\n", "shorter than 16"},
           Case{"tokens:\n  - {name: a, role: user}\n", "exactly one of"},
           Case{"tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq, token_sha256: "
                "00}\n",
                "exactly one of"},
           Case{"tokens:\n  - {name: a, role: user, token_sha256: xyz}\n", "64 hex digits"},
           Case{"tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq, extra: 1}\n",
                "unknown field \"extra\""},
           Case{"tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq}\n"
                "  - {name: b, role: admin, token: abcdefghijklmnopq}\n",
                "the same token appears twice"},
           Case{"tokens:\n  - {name: a, role: user, token: mw1_abcdefghijklmnopq}\n",
                "worker tokens"},
           Case{"tokens: [\n", ""},
       }) {
    auto auth = Create(c.content);
    ASSERT_FALSE(auth.ok()) << c.content;
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument) << c.content;
    EXPECT_THAT(std::string(auth.status().message()), HasSubstr(c.message)) << c.content;
    EXPECT_THAT(std::string(auth.status().message()), HasSubstr(tokens_)) << c.content;
  }
  EXPECT_EQ(Authenticator::Create({dir_ + "/missing.yaml", ""}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Authenticator::Create({"", ""}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(AuthTest, WorkerTokensNameTheirJobAndCannotBeForged) {
  auto auth = Create(Basic());
  ASSERT_TRUE(auth.ok());
  const std::string token = (*auth)->MintWorkerToken("job-7");
  auto worker = (*auth)->Authenticate(token);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->role, Role::kWorker);
  EXPECT_EQ(worker->name, "job-7");
  EXPECT_NE((*auth)->MintWorkerToken("job-8"), token);

  // Re-targeting the MAC at another job, or flipping one hex digit, fails.
  std::string other_job = token.substr(0, token.rfind('_') + 1) + "job-8";
  EXPECT_EQ((*auth)->Authenticate(other_job).status().code(), absl::StatusCode::kUnauthenticated);
  std::string flipped = token;
  flipped[5] = flipped[5] == '0' ? '1' : '0';
  EXPECT_EQ((*auth)->Authenticate(flipped).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*auth)->Authenticate("mw1_").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(AuthTest, WorkerTokensSurviveARestartWithTheSameKeyFile) {
  std::string token;
  {
    auto first = Create(Basic());
    ASSERT_TRUE(first.ok());
    token = (*first)->MintWorkerToken("job-1");
  }
  struct stat st;
  ASSERT_EQ(::stat((dir_ + "/worker.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the key file must be private";
  auto second = Authenticator::Create({tokens_, dir_ + "/worker.key"});
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE((*second)->Authenticate(token).ok());
  // Another key (here: one kept in memory) does not accept it.
  auto other = Authenticator::Create({tokens_, ""});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->Authenticate(token).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(AuthTest, ShortKeyFileIsRejected) {
  std::ofstream(dir_ + "/worker.key") << "short";
  Write(tokens_, Basic());
  auto auth = Authenticator::Create({tokens_, dir_ + "/worker.key"});
  EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(AuthTest, UnixAccountsMapUsersAndAdminsAndReload) {
  auto auth = Create(R"(tokens:
  - {name: ops, role: admin, token: "an-admin-token-0123", unix_user: mesh-ops}
  - {name: alice, role: user, token: "a-user-token-of-alice", unix_user: alice}
  - {name: alice, role: user, token: "alice-second-token-x", unix_user: alice}
  - {name: rooty, role: user, token: "a-user-token-of-root", unix_user: root, allow_root: true}
  - {name: bob, role: user, token: "a-user-token-of-bob-"}
)");
  ASSERT_TRUE(auth.ok()) << auth.status();
  auto alice = (*auth)->UnixAccountOf("alice");
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->unix_user, "alice");
  EXPECT_FALSE(alice->allow_root);
  EXPECT_EQ((*auth)->UnixAccountOf("ops")->unix_user, "mesh-ops");
  EXPECT_TRUE((*auth)->UnixAccountOf("rooty")->allow_root);
  EXPECT_FALSE((*auth)->UnixAccountOf("bob").has_value());
  EXPECT_FALSE((*auth)->UnixAccountOf("nobody-here").has_value());

  Write(tokens_, R"(tokens:
  - {name: alice, role: user, token: "a-user-token-of-alice", unix_user: alice2}
)");
  ASSERT_TRUE((*auth)->ReloadIfChanged().ok());
  EXPECT_EQ((*auth)->UnixAccountOf("alice")->unix_user, "alice2");
  EXPECT_FALSE((*auth)->UnixAccountOf("ops").has_value());
}

TEST_F(AuthTest, BadUnixAccountsAreRejectedNamingTheEntry) {
  struct Case {
    const char* content;
    const char* message;
  };
  for (const Case& c : {
           Case{"tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq, unix_user: root}\n",
                "add `allow_root: true` if that is intended"},
           Case{"tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq, unix_user: 'a b'}\n",
                "is not a Unix user name"},
           Case{"tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq, unix_user: 9lives}\n",
                "is not a Unix user name"},
           Case{"tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq, allow_root: true}\n",
                "allow_root needs a unix_user"},
           Case{"tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq, unix_user: x, "
                "allow_root: maybe}\n",
                "allow_root must be true or false"},
           Case{"tokens:\n  - {name: n, role: agent, token: abcdefghijklmnopq, unix_user: x}\n",
                "are for users and admins"},
           Case{"tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq, unix_user: x}\n"
                "  - {name: a, role: user, token: bbcdefghijklmnopq, unix_user: y}\n",
                "must give the same unix_user and allow_root"},
       }) {
    auto auth = Create(c.content);
    ASSERT_FALSE(auth.ok()) << c.content;
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument) << c.content;
    EXPECT_THAT(std::string(auth.status().message()), HasSubstr(c.message)) << c.content;
    EXPECT_THAT(std::string(auth.status().message()), HasSubstr("tokens[")) << c.content;
  }
}

TEST_F(AuthTest, UnixUserNamesFollowThePortableForm) {
  const std::string longest(32, 'u');
  for (const std::string& good :
       {std::string("_svc"), std::string("a.b-c_9"), std::string("machine$"), longest}) {
    auto auth = Create(absl::StrCat(
        "tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq, unix_user: '", good, "'}\n"));
    ASSERT_TRUE(auth.ok()) << good << ": " << auth.status();
    EXPECT_EQ((*auth)->UnixAccountOf("a")->unix_user, good);
  }
  for (const std::string& bad :
       {std::string(""), std::string("-x"), std::string(".x"), std::string("a$b"),
        std::string("a/b"), std::string("a:b"), longest + "u"}) {
    auto auth = Create(absl::StrCat(
        "tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq, unix_user: '", bad, "'}\n"));
    ASSERT_FALSE(auth.ok()) << "'" << bad << "'";
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(auth.status().message()), HasSubstr("is not a Unix user name")) << bad;
  }
}

TEST_F(AuthTest, EntriesOfOneNameMustAgreeEvenWhenOneGivesNoAccount) {
  for (const char* content : {
           // The second token of alice would run her jobs as nobody known.
           "tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq, unix_user: x}\n"
           "  - {name: a, role: user, token: bbcdefghijklmnopq}\n",
           "tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq}\n"
           "  - {name: a, role: user, token: bbcdefghijklmnopq, unix_user: x}\n",
           "tokens:\n  - {name: a, role: admin, token: abcdefghijklmnopq, unix_user: x}\n"
           "  - {name: a, role: admin, token: bbcdefghijklmnopq, unix_user: x, "
           "allow_root: true}\n",
       }) {
    auto auth = Create(content);
    ASSERT_FALSE(auth.ok()) << content;
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument) << content;
    EXPECT_THAT(std::string(auth.status().message()), HasSubstr("tokens[1] (a)")) << content;
  }
  // Explicit `allow_root: false` is the default, so these agree.
  auto agree = Create(
      "tokens:\n  - {name: a, role: user, token: abcdefghijklmnopq, unix_user: x}\n"
      "  - {name: a, role: user, token: bbcdefghijklmnopq, unix_user: x, allow_root: false}\n");
  ASSERT_TRUE(agree.ok()) << agree.status();
  // And root refused even when `allow_root: false` is spelled out.
  auto root = Create(
      "tokens:\n  - {name: a, role: admin, token: abcdefghijklmnopq, unix_user: root, "
      "allow_root: false}\n");
  EXPECT_EQ(root.status().code(), absl::StatusCode::kInvalidArgument);
  // Agents may carry neither field, allow_root alone included.
  auto agent = Create(
      "tokens:\n  - {name: n, role: agent, token: abcdefghijklmnopq, "
      "allow_root: false}\n");
  EXPECT_THAT(std::string(agent.status().message()), HasSubstr("are for users and admins"));
}

TEST_F(AuthTest, ABadAccountEditKeepsTheOldMappingAndAFixIsPickedUp) {
  auto auth = Create(R"(tokens:
  - {name: alice, role: user, token: "a-user-token-of-alice", unix_user: alice}
)");
  ASSERT_TRUE(auth.ok()) << auth.status();
  Write(tokens_, R"(tokens:
  - {name: alice, role: user, token: "a-user-token-of-alice", unix_user: root}
)");
  const absl::Status refused = (*auth)->ReloadIfChanged();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("allow_root: true"));
  ASSERT_TRUE((*auth)->UnixAccountOf("alice").has_value());
  EXPECT_EQ((*auth)->UnixAccountOf("alice")->unix_user, "alice");
  EXPECT_FALSE((*auth)->UnixAccountOf("alice")->allow_root);

  Write(tokens_, R"(tokens:
  - {name: alice, role: user, token: "a-user-token-of-alice", unix_user: root, allow_root: true}
)");
  ASSERT_TRUE((*auth)->ReloadIfChanged().ok());
  EXPECT_EQ((*auth)->UnixAccountOf("alice")->unix_user, "root");
  EXPECT_TRUE((*auth)->UnixAccountOf("alice")->allow_root);

  // Removing the field removes the mapping.
  Write(tokens_, R"(tokens:
  - {name: alice, role: user, token: "a-user-token-of-alice"}
)");
  ASSERT_TRUE((*auth)->ReloadIfChanged().ok());
  EXPECT_FALSE((*auth)->UnixAccountOf("alice").has_value());
  EXPECT_TRUE((*auth)->Authenticate(kAliceToken).ok());
}

TEST_F(AuthTest, ReloadPicksUpEditsAndKeepsTheOldSetOnErrors) {
  auto auth = Create(Basic());
  ASSERT_TRUE(auth.ok());
  EXPECT_TRUE((*auth)->ReloadIfChanged().ok()) << "no change: a no-op";

  // Revoke alice, add bob.
  Write(tokens_, R"(tokens:
  - {name: ops, role: admin, token: "an-admin-token-0123"}
  - {name: bob, role: user, token: "a-user-token-of-bob-"}
)");
  ASSERT_TRUE((*auth)->ReloadIfChanged().ok());
  EXPECT_EQ((*auth)->Authenticate(kAliceToken).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE((*auth)->Authenticate("a-user-token-of-bob-").ok());

  // A broken edit is reported and changes nothing.
  Write(tokens_, "tokens: [\n");
  EXPECT_EQ((*auth)->ReloadIfChanged().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*auth)->Authenticate("a-user-token-of-bob-").ok());
  EXPECT_EQ((*auth)->token_count(), 2u);
}

// ---- Authorization -------------------------------------------------------

const Principal kAdmin{Role::kAdmin, "ops"};
const Principal kAlice{Role::kUser, "alice"};
const Principal kBob{Role::kUser, "bob"};
const Principal kAgent{Role::kAgent, "node-1"};
const Principal kWorkerA{Role::kWorker, "job-a"};

TEST(AuthorizeTest, JobDataIsTheWorkersOwnJobOnly) {
  EXPECT_TRUE(AuthorizeJobData(kWorkerA, "job-a", "alice").ok());
  const absl::Status denied = AuthorizeJobData(kWorkerA, "job-b", "alice");
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(denied.message()), HasSubstr("a worker of job job-a"));
  EXPECT_THAT(std::string(denied.message()), HasSubstr("job-b"));
  // Ad-hoc jobs have no owner: still only the worker's own.
  EXPECT_EQ(AuthorizeJobData(kWorkerA, "adhoc-1", std::nullopt).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(AuthorizeTest, UsersReachTheirOwnAndAdHocJobs) {
  EXPECT_TRUE(AuthorizeJobData(kAlice, "job-a", "alice").ok());
  EXPECT_TRUE(AuthorizeJobData(kAlice, "adhoc-1", std::nullopt).ok());
  EXPECT_EQ(AuthorizeJobData(kBob, "job-a", "alice").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(AuthorizeJobData(kAlice, "job-x", "").code(), absl::StatusCode::kPermissionDenied)
      << "a job submitted without authentication is an admin's";
  EXPECT_TRUE(AuthorizeJobData(kAdmin, "job-a", "alice").ok());
  EXPECT_EQ(AuthorizeJobData(kAgent, "job-a", "alice").code(), absl::StatusCode::kPermissionDenied);
}

// CreateJob with no id asks for a new ad-hoc job: the refusal says so
// rather than naming an empty job.
TEST(AuthorizeTest, RefusedNewAdHocJobIsWordedAsSuch) {
  for (const Principal& caller : {kWorkerA, kAgent}) {
    const absl::Status denied = AuthorizeJobData(caller, "", std::nullopt);
    EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(std::string(denied.message()), HasSubstr("may not create an ad-hoc job"));
    EXPECT_THAT(std::string(denied.message()), ::testing::Not(HasSubstr("data of job ")));
  }
}

// Regression: a user could create (or join) "job-<n>" ad hoc before
// JobService handed that id out, and JobManager then reused that rendezvous,
// KV keys included, for the other user's job.
TEST(AuthorizeTest, UsersMayNotSquatOnJobServiceIds) {
  const absl::Status denied = AuthorizeJobData(kAlice, "job-7", std::nullopt);
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(denied.message()), HasSubstr("job-<number>"));
  EXPECT_TRUE(AuthorizeJobData(kAlice, "job-7", "alice").ok()) << "her own submitted job";
  EXPECT_TRUE(AuthorizeJobData(kAdmin, "job-7", std::nullopt).ok());
  // Ids that merely look alike stay usable for ad-hoc jobs.
  for (const char* id : {"job-", "job-a", "job-7x", "my-job-7", "adhoc-7", "job7"}) {
    EXPECT_TRUE(AuthorizeJobData(kAlice, id, std::nullopt).ok()) << id;
  }
}

TEST(AuthorizeTest, OnlyOwnersAndAdminsControlAJob) {
  EXPECT_TRUE(AuthorizeJobControl(kAlice, "job-a", "alice").ok());
  EXPECT_TRUE(AuthorizeJobControl(kAdmin, "job-a", "alice").ok());
  const absl::Status denied = AuthorizeJobControl(kBob, "job-a", "alice");
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(denied.message()), HasSubstr("owner: alice"));
  EXPECT_EQ(AuthorizeJobControl(kWorkerA, "job-a", "alice").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(AuthorizeJobControl(kAlice, "job-z", std::nullopt).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(AuthorizeTest, JobServiceIsForPeople) {
  EXPECT_TRUE(AuthorizeJobClient(kAdmin).ok());
  EXPECT_TRUE(AuthorizeJobClient(kAlice).ok());
  EXPECT_EQ(AuthorizeJobClient(kAgent).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(AuthorizeJobClient(kWorkerA).code(), absl::StatusCode::kPermissionDenied);
}

TEST(AuthorizeTest, AgentsActOnlyForTheirNode) {
  EXPECT_TRUE(AuthorizeNode(kAgent, "node-1").ok());
  EXPECT_TRUE(AuthorizeNode(kAdmin, "node-1").ok());
  const absl::Status denied = AuthorizeNode(kAgent, "node-2");
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(denied.message()), HasSubstr("the agent of node node-1"));
  EXPECT_EQ(AuthorizeNode(kAlice, "node-1").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(AuthorizeNode(kWorkerA, "node-1").code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace auth_test
}  // namespace mesh::coordinator
