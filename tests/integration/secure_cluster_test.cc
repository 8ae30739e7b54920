// A secured cluster with the real binaries on 127.0.0.1 (docs/security.md):
// a mesh-coordinator with TLS, mTLS (--tls-client-ca) and bearer tokens
// (--auth-tokens), a mesh-agent that registers with an agent token and a
// client certificate, meshctl as users `alice` and `bob` and admin `ops`,
// and libmesh workers (examples/allreduce_2d) that join, all-reduce and
// barrier through the coordinator with the worker token and TLS files their
// agent passed down (MESH_TOKEN, MESH_TLS_*).
//
// Covers: a job's owner is its submitter; another user can
// neither cancel it nor read its logs, the owner and an admin can; no token
// is UNAUTHENTICATED; no (or a foreign) client certificate fails the
// handshake; health stays open to probes without a token; an agent token
// cannot register another node; the coordinator refuses flag combinations
// that would leave it open or leak tokens.
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/util/proc.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_pki.h"

namespace mesh {
namespace secure_cluster_test {

using ::mesh::testing::ExitCode;
using ::mesh::testing::MakeTempDir;
using ::mesh::testing::Subprocess;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr absl::Duration kStartTimeout = absl::Seconds(20);
constexpr absl::Duration kCommandTimeout = absl::Seconds(90);
constexpr char kBanner[] = "mesh-coordinator listening on ";

// meshctl's exit codes (cli/meshctl.h).
constexpr int kExitOk = 0;
constexpr int kExitUnreachable = 3;
constexpr int kExitRefused = 4;

// Tokens of the principals in the token file; long enough (>= 16 chars).
constexpr char kOpsToken[] = "ops-token-0123456789abcdef";
constexpr char kAliceToken[] = "alice-token-0123456789abcdef";
constexpr char kBobToken[] = "bob-token-0123456789abcdef";
constexpr char kNode1Token[] = "node-1-agent-token-0123456789";
// The Unix accounts of alice and bob in SecureIsolationTest.
constexpr char kAliceAccount[] = "mesh-test-a";
constexpr char kBobAccount[] = "mesh-test-b";

void WriteFile(const std::string& path, const std::string& content, mode_t mode = 0600) {
  std::ofstream(path, std::ios::trunc) << content;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

struct CommandResult {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `argv` to its end (bounded by kCommandTimeout) with stderr captured
// through `err_file`.
CommandResult RunToEnd(const std::vector<std::string>& argv, const std::string& err_file) {
  std::vector<std::string> shell = {"/bin/sh", "-c", "e=$1; shift; exec \"$@\" 2>\"$e\"", "sh",
                                    err_file};
  shell.insert(shell.end(), argv.begin(), argv.end());
  CommandResult result;
  auto process = Subprocess::Start(shell);
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return result;
  const absl::Time deadline = absl::Now() + kCommandTimeout;
  for (;;) {
    auto line = process->ReadLine(std::max(deadline - absl::Now(), absl::Milliseconds(1)));
    if (!line.ok()) break;
    absl::StrAppend(&result.out, *line, "\n");
  }
  auto status = process->Wait(std::max(deadline - absl::Now(), absl::Seconds(1)));
  EXPECT_TRUE(status.ok()) << status.status() << " running " << argv[0];
  result.code = status.ok() ? ExitCode(*status) : -1;
  result.err = ReadFile(err_file);
  return result;
}

// The environment variables that would change what the binaries do; the
// test gives everything by flag.
void ClearMeshEnv() {
  for (const char* name :
       {"MESH_TOKEN", "MESH_TOKEN_FILE", "MESH_TLS_CA", "MESH_TLS_CERT", "MESH_TLS_KEY",
        "MESH_TLS_SERVER_NAME", "MESH_COORDINATOR", "MESH_INSECURE", "MESH_AUTH_TOKENS",
        "MESH_SERVER_TLS_CERT", "MESH_SERVER_TLS_KEY", "MESH_TLS_CLIENT_CA", "MESH_CONFIG"}) {
    ::unsetenv(name);
  }
}

class SecureClusterTest : public ::testing::Test {
 protected:
  // How a meshctl call identifies itself.
  struct Identity {
    std::string token_file;  // empty: no token
    bool client_cert = true;
    bool ca = true;
    bool other_client_cert = false;  // a certificate of an unrelated CA
    std::string timeout_s = "10";    // meshctl --timeout
  };

  void SetUp() override {
    if (!::mesh::testing::HaveOpenssl()) {
      GTEST_SKIP() << "the openssl command-line tool is not on PATH; it makes the test PKI";
    }
    ClearMeshEnv();
    dir_ = MakeTempDir("mesh-secure-test");
    auto pki = ::mesh::testing::MakeTestPki(dir_ + "/pki");
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *std::move(pki);
    WriteTokens();
    if (HasFatalFailure()) return;
    StartCoordinator();
    if (HasFatalFailure()) return;
    agents_.push_back(StartAgent("node-1", node1_token_file_));
    ASSERT_TRUE(
        ::mesh::testing::WaitUntil([&] { return NodeIsReady("node-1"); }, absl::Seconds(20)))
        << "node-1 did not register";
  }

  void TearDown() override {
    // Subprocess's destructor SIGKILLs each process group and reaps it; the
    // workers (in their agents' groups or their own) are checked below.
    agents_.clear();
    coordinator_.reset();
    if (!marker_jobs_.empty()) {
      for (const std::string& id : marker_jobs_) {
        EXPECT_TRUE(::mesh::testing::WaitUntil(
            [&] {
              return ::mesh::testing::LiveProcessesWithEnv(
                         {"MESH_JOB_ID=" + id, "MARKER=" + marker_})
                  .empty();
            },
            absl::Seconds(10)))
            << "workers of " << id << " outlived the test";
      }
    }
    if (!dir_.empty()) std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
  }

  // tokens.yaml: alice by SHA-256 (computed with openssl), the others in
  // clear; one token file per principal.
  void WriteTokens() {
    alice_token_file_ = dir_ + "/alice.token";
    bob_token_file_ = dir_ + "/bob.token";
    ops_token_file_ = dir_ + "/ops.token";
    node1_token_file_ = dir_ + "/node-1.token";
    // No trailing newline in alice's: openssl hashes the file as it is. A
    // newline in the others: ReadTokenFile strips it.
    WriteFile(alice_token_file_, kAliceToken);
    WriteFile(bob_token_file_, absl::StrCat(kBobToken, "\n"));
    WriteFile(ops_token_file_, absl::StrCat(kOpsToken, "\n"));
    WriteFile(node1_token_file_, absl::StrCat(kNode1Token, "\n"));
    auto digest = ::mesh::testing::RunOpenssl({"dgst", "-sha256", "-r", alice_token_file_});
    ASSERT_TRUE(digest.ok()) << digest.status();
    ASSERT_GE(digest->size(), 64u) << *digest;
    const std::string alice_sha256 = digest->substr(0, 64);
    tokens_file_ = dir_ + "/tokens.yaml";
    // Workers run as this test's own account (root when it is root), or,
    // with separate_accounts_, alice's and bob's as two accounts of their own.
    auto account = [](const std::string& user) {
      return absl::StrCat("    unix_user: ", user, "\n    allow_root: true\n");
    };
    const std::string self = ::mesh::testing::CurrentUserName();
    const std::string ops_account = account(self);
    const std::string alice_account = account(separate_accounts_ ? kAliceAccount : self);
    const std::string bob_account = account(separate_accounts_ ? kBobAccount : self);
    WriteFile(tokens_file_, absl::StrCat("tokens:\n"
                                         "  - name: ops\n"
                                         "    role: admin\n",
                                         ops_account, "    token: \"", kOpsToken,
                                         "\"\n"
                                         "  - name: alice\n"
                                         "    role: user\n",
                                         alice_account, "    token_sha256: ", alice_sha256,
                                         "\n"
                                         "  - name: bob\n"
                                         "    role: user\n",
                                         bob_account, "    token: \"", kBobToken,
                                         "\"\n"
                                         "  - name: node-1\n"
                                         "    role: agent\n"
                                         "    token: \"",
                                         kNode1Token, "\"\n"));
  }

  void StartCoordinator() {
    auto process = Subprocess::Start({MESH_COORDINATOR_BIN,
                                      "--listen",
                                      "127.0.0.1",
                                      "--port",
                                      "0",
                                      "--state-dir",
                                      dir_ + "/state",
                                      "--tls-cert",
                                      pki_.server_cert,
                                      "--tls-key",
                                      pki_.server_key,
                                      "--tls-client-ca",
                                      pki_.ca_cert,
                                      "--auth-tokens",
                                      tokens_file_,
                                      "--node-heartbeat-interval",
                                      "0.2",
                                      "--node-heartbeat-timeout",
                                      "2",
                                      "--kill-grace",
                                      "1",
                                      "--shutdown-grace",
                                      "0.5"});
    ASSERT_TRUE(process.ok()) << process.status();
    auto line = process->ReadLine(kStartTimeout);
    ASSERT_TRUE(line.ok()) << line.status();
    ASSERT_THAT(*line, StartsWith(kBanner));
    address_ = line->substr(sizeof(kBanner) - 1);
    coordinator_ = std::make_unique<Subprocess>(*std::move(process));
  }

  // An agent whose stderr (its log) goes to <dir>/agent-<name>.log. It runs
  // in `dir_` and is given its TLS and token files by relative paths, as an
  // operator would from /etc/mesh: its workers, which start in their job's
  // directory, must still find them.
  std::unique_ptr<Subprocess> StartAgent(const std::string& name, const std::string& token_file) {
    auto relative = [&](const std::string& path) {
      return std::string(absl::StripPrefix(path, dir_ + "/"));
    };
    auto process = Subprocess::Start({"/bin/sh",
                                      "-c",
                                      "cd \"$1\" && log=$2 && shift 2 && exec \"$@\" 2>>\"$log\"",
                                      "sh",
                                      dir_,
                                      AgentLog(name),
                                      MESH_AGENT_BIN,
                                      "--coordinator",
                                      address_,
                                      "--name",
                                      name,
                                      "--address",
                                      "127.0.0.1",
                                      "--slots",
                                      "4",
                                      "--gpus",
                                      "none",
                                      "--work-dir",
                                      absl::StrCat(dir_, "/agent-", name),
                                      "--grace",
                                      "1",
                                      "--tls-ca",
                                      relative(pki_.ca_cert),
                                      "--tls-cert",
                                      relative(pki_.client_cert),
                                      "--tls-key",
                                      relative(pki_.client_key),
                                      "--token-file",
                                      relative(token_file)});
    EXPECT_TRUE(process.ok()) << process.status();
    if (!process.ok()) return nullptr;
    return std::make_unique<Subprocess>(*std::move(process));
  }

  std::string AgentLog(const std::string& name) const {
    return absl::StrCat(dir_, "/agent-", name, ".log");
  }

  // Runs meshctl as `who` with `args`.
  CommandResult Meshctl(const Identity& who, std::vector<std::string> args) {
    std::vector<std::string> argv = {MESHCTL_BIN, "--coordinator", address_, "--timeout",
                                     who.timeout_s};
    if (who.ca) argv.insert(argv.end(), {"--tls-ca", pki_.ca_cert});
    if (who.client_cert) {
      argv.insert(argv.end(), {"--tls-cert", pki_.client_cert, "--tls-key", pki_.client_key});
    }
    if (who.other_client_cert) {
      argv.insert(argv.end(),
                  {"--tls-cert", pki_.other_client_cert, "--tls-key", pki_.other_client_key});
    }
    if (!who.token_file.empty()) argv.insert(argv.end(), {"--token-file", who.token_file});
    argv.insert(argv.end(), args.begin(), args.end());
    return RunToEnd(argv, absl::StrCat(dir_, "/meshctl-", ++commands_, ".err"));
  }

  Identity Alice() const { return {alice_token_file_}; }
  Identity Bob() const { return {bob_token_file_}; }
  Identity Ops() const { return {ops_token_file_}; }

  // `meshctl -o json status` as ops; null when the call fails.
  nlohmann::json JobJson(const std::string& id) {
    CommandResult r = Meshctl(Ops(), {"-o", "json", "status", id});
    if (r.code != kExitOk) return nullptr;
    return nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  }

  std::string JobState(const std::string& id) {
    nlohmann::json job = JobJson(id);
    return job.is_object() && job.contains("state") ? job["state"].get<std::string>() : "";
  }

  // Node names `meshctl nodes` lists (as ops), with their states.
  nlohmann::json Nodes() {
    CommandResult r = Meshctl(Ops(), {"-o", "json", "nodes"});
    if (r.code != kExitOk) return nullptr;
    nlohmann::json parsed = nlohmann::json::parse(r.out, nullptr, false);
    return parsed.is_object() && parsed.contains("nodes") ? parsed["nodes"] : nullptr;
  }

  bool NodeIsReady(const std::string& name) {
    nlohmann::json nodes = Nodes();
    if (!nodes.is_array()) return false;
    for (const auto& node : nodes) {
      if (node.value("name", "") == name && node.value("state", "") == "READY") return true;
    }
    return false;
  }

  // Submits `command` as alice (no wait) on one node with two ranks; the
  // job id.
  std::string SubmitAsAlice(const std::vector<std::string>& command) {
    std::vector<std::string> args = {"submit", "--parsable",        "--nodes",
                                     "1",      "--nproc-per-node",  "2",
                                     "--env",  "MARKER=" + marker_, "--"};
    args.insert(args.end(), command.begin(), command.end());
    CommandResult r = Meshctl(Alice(), args);
    EXPECT_EQ(r.code, kExitOk) << r.out << r.err;
    std::string id(absl::StripAsciiWhitespace(r.out));
    if (!id.empty()) marker_jobs_.push_back(id);
    return id;
  }

  // Map alice and bob to the accounts kAliceAccount and kBobAccount (set
  // before SetUp; they must exist).
  bool separate_accounts_ = false;
  std::string dir_;
  ::mesh::testing::TestPki pki_;
  std::string tokens_file_;
  std::string alice_token_file_;
  std::string bob_token_file_;
  std::string ops_token_file_;
  std::string node1_token_file_;
  std::string address_;
  int commands_ = 0;
  // Tags this test's workers so /proc scans find only them.
  std::string marker_ =
      absl::StrCat("secure-cluster-test-", getpid(), "-", absl::ToUnixNanos(absl::Now()));
  std::vector<std::string> marker_jobs_;
  std::unique_ptr<Subprocess> coordinator_;
  std::vector<std::unique_ptr<Subprocess>> agents_;
};

TEST_F(SecureClusterTest, LibmeshJobSucceedsThroughTlsAndWorkerTokensAndIsOwnedByItsSubmitter) {
  // meshctl submit follows the logs and exits with the job's result. The
  // workers join, all-reduce over Gloo and barrier through the coordinator
  // with the worker token and TLS files their agent gave them.
  CommandResult r =
      Meshctl(Alice(), {"submit", "--name", "allreduce", "--nodes", "1", "--nproc-per-node", "2",
                        "--env", "MARKER=" + marker_, "--", ALLREDUCE_2D_BIN, "--gloo-host",
                        "127.0.0.1", "--elements", "1024"});
  EXPECT_EQ(r.code, kExitOk) << r.out << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("rank 0: ok"), HasSubstr("rank 1: ok"))) << r.err;

  CommandResult list = Meshctl(Alice(), {"-o", "json", "list"});
  ASSERT_EQ(list.code, kExitOk) << list.err;
  const nlohmann::json jobs = nlohmann::json::parse(list.out)["jobs"];
  ASSERT_EQ(jobs.size(), 1u) << list.out;
  const std::string id = jobs[0]["id"];
  marker_jobs_.push_back(id);
  EXPECT_EQ(jobs[0]["state"], "SUCCEEDED");
  EXPECT_EQ(jobs[0]["owner"], "alice");

  // Any user may read a job (JobService reads are open to users).
  CommandResult describe = Meshctl(Bob(), {"-o", "json", "describe", id});
  ASSERT_EQ(describe.code, kExitOk) << describe.err;
  const nlohmann::json job = nlohmann::json::parse(describe.out);
  EXPECT_EQ(job["owner"], "alice");
  EXPECT_EQ(job["state"], "SUCCEEDED");
  EXPECT_EQ(job["world_size"], 2);
  CommandResult table = Meshctl(Alice(), {"status", id});
  EXPECT_EQ(table.code, kExitOk) << table.err;
  EXPECT_THAT(table.out, HasSubstr("alice"));

  // The owner reads the logs.
  CommandResult logs = Meshctl(Alice(), {"logs", id});
  EXPECT_EQ(logs.code, kExitOk) << logs.err;
  EXPECT_THAT(logs.out, AllOf(HasSubstr("rank 0: ok"), HasSubstr("rank 1: ok")));
}

// Alice's and bob's jobs on one node, each running as its owner's account
// (the token file's unix_user): from inside alice's worker, bob's worker's
// environment (its worker token), its signals and its log are out of reach.
class SecureIsolationTest : public SecureClusterTest {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "running workers as other accounts needs a root agent";
    std::string why;
    for (const char* user : {kAliceAccount, kBobAccount}) {
      if (!::mesh::testing::EnsureTestUser(user, &why)) GTEST_SKIP() << why;
    }
    separate_accounts_ = true;
    SecureClusterTest::SetUp();
    // The accounts must reach their jobs' directories under dir_ (mkdtemp:
    // 0700) to start in them; the directories themselves are the owners'.
    if (HasFatalFailure()) return;
    ASSERT_EQ(chmod(dir_.c_str(), 0711), 0);
  }

  // The uid a job's rank 0 printed ("uid N", isolation_probe hold).
  int PrintedUid(const std::string& id) {
    int uid = -1;
    ::mesh::testing::WaitUntil(
        [&] {
          CommandResult logs = Meshctl(Ops(), {"logs", id});
          const size_t at = logs.out.find("uid ");
          if (at == std::string::npos) return false;
          uid = std::atoi(logs.out.c_str() + at + 4);
          return true;
        },
        absl::Seconds(20));
    return uid;
  }
};

TEST_F(SecureIsolationTest, TwoOwnersJobsRunAsTwoAccountsThatCannotReachEachOther) {
  CommandResult bob = Meshctl(Bob(), {"submit", "--parsable", "--env", "MARKER=" + marker_, "--",
                                      ISOLATION_PROBE_BIN, "hold", "120"});
  ASSERT_EQ(bob.code, kExitOk) << bob.out << bob.err;
  const std::string bob_job(absl::StripAsciiWhitespace(bob.out));
  marker_jobs_.push_back(bob_job);
  EXPECT_EQ(PrintedUid(bob_job), static_cast<int>(getpwnam(kBobAccount)->pw_uid));
  const std::vector<pid_t> bob_pids =
      ::mesh::testing::LiveProcessesWithEnv({"MESH_JOB_ID=" + bob_job, "MARKER=" + marker_});
  ASSERT_EQ(bob_pids.size(), 1u);
  const std::string bob_log =
      absl::StrCat(dir_, "/agent-node-1/jobs/", bob_job, "/gen-0/rank-0.log");
  struct stat log_stat;
  ASSERT_EQ(stat(bob_log.c_str(), &log_stat), 0) << bob_log;
  EXPECT_EQ(log_stat.st_uid, getpwnam(kBobAccount)->pw_uid);
  EXPECT_EQ(log_stat.st_mode & 0777, 0600u);

  // Alice's worker probes bob's: every attempt must fail with EACCES/EPERM.
  CommandResult alice =
      Meshctl(Alice(), {"submit", "--env", "MARKER=" + marker_, "--", ISOLATION_PROBE_BIN, "probe",
                        absl::StrCat(bob_pids[0]), bob_log});
  EXPECT_EQ(alice.code, kExitOk) << alice.out << alice.err;
  EXPECT_THAT(alice.out, HasSubstr("environ: EACCES"));
  EXPECT_THAT(alice.out, HasSubstr("kill: EPERM"));
  EXPECT_THAT(alice.out, HasSubstr("log: EACCES"));
  std::printf("alice's worker probing bob's:\n%s", alice.out.c_str());

  // The node says how it isolates.
  nlohmann::json nodes = Nodes();
  ASSERT_TRUE(nodes.is_array() && nodes.size() == 1) << nodes;
  EXPECT_EQ(nodes[0]["isolation"]["run_as_owner"], true) << nodes;
  CommandResult cancel = Meshctl(Bob(), {"cancel", bob_job});
  EXPECT_EQ(cancel.code, kExitOk) << cancel.err;
}

TEST_F(SecureClusterTest, OnlyTheOwnerAndAnAdminMayCancelOrReadLogs) {
  // The worker prints what kind of token it got (worker tokens are
  // "mw1_<mac>_<job>"; alice's own must never reach it) and whether it can
  // read the TLS files its agent passed (from the job's directory).
  const std::string id =
      SubmitAsAlice({"/bin/sh", "-c",
                     "ca=missing; [ -r \"$MESH_TLS_CA\" ] && ca=readable; "
                     "cert=missing; [ -r \"$MESH_TLS_CERT\" ] && cert=readable; "
                     "echo \"token=${MESH_TOKEN%%_*} job=${MESH_TOKEN##*_} ca=$ca cert=$cert\"; "
                     "exec sleep 300"});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(
      ::mesh::testing::WaitUntil([&] { return JobState(id) == "RUNNING"; }, absl::Seconds(30)))
      << "state " << JobState(id);

  // bob may not cancel alice's job...
  CommandResult cancel = Meshctl(Bob(), {"cancel", id});
  EXPECT_EQ(cancel.code, kExitRefused) << cancel.out << cancel.err;
  EXPECT_THAT(cancel.err, AllOf(HasSubstr("PERMISSION_DENIED"), HasSubstr("user bob"),
                                HasSubstr("does not own"), HasSubstr("owner: alice")));
  EXPECT_EQ(JobState(id), "RUNNING");
  // ...nor read its logs.
  CommandResult bob_logs = Meshctl(Bob(), {"logs", id});
  EXPECT_EQ(bob_logs.code, kExitRefused) << bob_logs.out << bob_logs.err;
  EXPECT_THAT(bob_logs.err, AllOf(HasSubstr("PERMISSION_DENIED"), HasSubstr("does not own")));
  EXPECT_THAT(bob_logs.out, Not(HasSubstr("token=")));

  // alice reads them: her workers got a worker token for this job, not hers.
  const std::string expected_line =
      absl::StrCat("token=mw1 job=", id, " ca=readable cert=readable");
  CommandResult alice_logs;
  EXPECT_TRUE(::mesh::testing::WaitUntil(
      [&] {
        alice_logs = Meshctl(Alice(), {"logs", id});
        return alice_logs.code == kExitOk && absl::StrContains(alice_logs.out, expected_line) &&
               absl::StrContains(alice_logs.out, "[rank 1]");
      },
      absl::Seconds(20)))
      << alice_logs.code << "\n"
      << alice_logs.out << alice_logs.err;
  EXPECT_THAT(alice_logs.out, Not(HasSubstr("alice-token")));
  // So does the admin.
  CommandResult ops_logs = Meshctl(Ops(), {"logs", id});
  EXPECT_EQ(ops_logs.code, kExitOk) << ops_logs.err;
  EXPECT_THAT(ops_logs.out, HasSubstr(expected_line));

  // alice cancels her job; nothing of it stays behind.
  CommandResult alice_cancel = Meshctl(Alice(), {"cancel", id});
  EXPECT_EQ(alice_cancel.code, kExitOk) << alice_cancel.out << alice_cancel.err;
  EXPECT_EQ(JobState(id), "CANCELLED");
  EXPECT_TRUE(::mesh::testing::WaitUntil(
      [&] {
        return ::mesh::testing::LiveProcessesWithEnv({"MESH_JOB_ID=" + id, "MARKER=" + marker_})
            .empty();
      },
      absl::Seconds(15)));

  // An admin may cancel anybody's job.
  const std::string second = SubmitAsAlice({"/bin/sh", "-c", "exec sleep 300"});
  ASSERT_FALSE(second.empty());
  CommandResult ops_cancel = Meshctl(Ops(), {"cancel", second});
  EXPECT_EQ(ops_cancel.code, kExitOk) << ops_cancel.out << ops_cancel.err;
  EXPECT_EQ(JobState(second), "CANCELLED");
}

TEST_F(SecureClusterTest, CallersWithoutATokenOrAClientCertificateAreRefused) {
  // mTLS certificate but no token: UNAUTHENTICATED (a refusal, exit 4).
  CommandResult list = Meshctl(Identity{}, {"list"});
  EXPECT_EQ(list.code, kExitRefused) << list.out << list.err;
  EXPECT_THAT(list.err, HasSubstr("UNAUTHENTICATED"));
  // An unknown token likewise.
  const std::string stranger = dir_ + "/stranger.token";
  WriteFile(stranger, "not-a-known-token-0123456789");
  CommandResult unknown = Meshctl(Identity{stranger}, {"list"});
  EXPECT_EQ(unknown.code, kExitRefused) << unknown.out << unknown.err;
  EXPECT_THAT(unknown.err, HasSubstr("UNAUTHENTICATED"));
  // An agent token is not a user token.
  CommandResult agent = Meshctl(Identity{node1_token_file_}, {"list"});
  EXPECT_EQ(agent.code, kExitRefused) << agent.out << agent.err;
  EXPECT_THAT(agent.err, HasSubstr("PERMISSION_DENIED"));

  // A valid token but no client certificate: the mTLS handshake fails, so
  // the coordinator is unreachable (exit 3), whatever the token.
  Identity no_cert = Alice();
  no_cert.client_cert = false;
  no_cert.timeout_s = "3";
  CommandResult handshake = Meshctl(no_cert, {"list"});
  EXPECT_EQ(handshake.code, kExitUnreachable) << handshake.out << handshake.err;
  EXPECT_THAT(handshake.err, HasSubstr("UNAVAILABLE"));
  // A certificate of another CA: the same.
  Identity foreign = no_cert;
  foreign.other_client_cert = true;
  CommandResult other = Meshctl(foreign, {"list"});
  EXPECT_EQ(other.code, kExitUnreachable) << other.out << other.err;

  // Plaintext to a TLS server fails too; a token needs a CA (usage error).
  Identity plaintext;
  plaintext.ca = false;
  plaintext.client_cert = false;
  plaintext.timeout_s = "3";
  CommandResult clear = Meshctl(plaintext, {"list"});
  EXPECT_EQ(clear.code, kExitUnreachable) << clear.out << clear.err;
  Identity token_in_clear = Alice();
  token_in_clear.ca = false;
  token_in_clear.client_cert = false;
  CommandResult leak = Meshctl(token_in_clear, {"list"});
  EXPECT_NE(leak.code, kExitOk) << leak.out << leak.err;
  EXPECT_NE(leak.code, kExitUnreachable) << "must refuse before dialing: " << leak.err;

  // Health is open to probes: CA and client certificate, no token.
  CommandResult health = Meshctl(Identity{}, {"-o", "json", "health"});
  EXPECT_EQ(health.code, kExitOk) << health.out << health.err;
  EXPECT_THAT(health.out, HasSubstr("SERVING"));

  // The authenticated caller passes.
  CommandResult ok = Meshctl(Alice(), {"list"});
  EXPECT_EQ(ok.code, kExitOk) << ok.out << ok.err;
}

TEST_F(SecureClusterTest, UsersCreateAdHocJobsButNotUnderJobServiceIds) {
  CommandResult adhoc =
      Meshctl(Alice(), {"create-job", "--job-id", "alice-scratch", "--world-size", "2"});
  EXPECT_EQ(adhoc.code, kExitOk) << adhoc.out << adhoc.err;
  // "job-<n>" is the form of JobService's ids: taking one before it is
  // handed out would give alice the rendezvous of somebody's future job.
  CommandResult squat = Meshctl(Alice(), {"create-job", "--job-id", "job-50", "--world-size", "2"});
  EXPECT_EQ(squat.code, kExitRefused) << squat.out << squat.err;
  EXPECT_THAT(squat.err, AllOf(HasSubstr("PERMISSION_DENIED"), HasSubstr("job-<number>")));
  // An admin may.
  CommandResult admin = Meshctl(Ops(), {"create-job", "--job-id", "job-50", "--world-size", "2"});
  EXPECT_EQ(admin.code, kExitOk) << admin.out << admin.err;
}

TEST_F(SecureClusterTest, AnAgentTokenCannotRegisterAnotherNode) {
  agents_.push_back(StartAgent("node-2", node1_token_file_));
  ASSERT_NE(agents_.back(), nullptr);
  const std::string log = AgentLog("node-2");
  EXPECT_TRUE(::mesh::testing::WaitUntil(
      [&] { return absl::StrContains(ReadFile(log), "PERMISSION_DENIED"); }, absl::Seconds(20)))
      << ReadFile(log);
  EXPECT_THAT(ReadFile(log), HasSubstr("may not act for node node-2"));

  const nlohmann::json nodes = Nodes();
  ASSERT_TRUE(nodes.is_array());
  for (const auto& node : nodes) EXPECT_NE(node.value("name", ""), "node-2") << nodes.dump();
  EXPECT_TRUE(NodeIsReady("node-1"));
  // The refused agent keeps retrying; it is not a crash.
  EXPECT_TRUE(::mesh::testing::IsAlive(agents_.back()->pid()));
}

// The binary's start-up policy; no cluster needed.
class CoordinatorSecurityFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!::mesh::testing::HaveOpenssl()) {
      GTEST_SKIP() << "the openssl command-line tool is not on PATH; it makes the test PKI";
    }
    ClearMeshEnv();
    dir_ = MakeTempDir("mesh-secure-test");
    auto pki = ::mesh::testing::MakeTestPki(dir_ + "/pki");
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = *std::move(pki);
    tokens_file_ = dir_ + "/tokens.yaml";
    WriteFile(tokens_file_, absl::StrCat("tokens:\n  - name: ops\n    role: admin\n    token: \"",
                                         kOpsToken, "\"\n"));
  }
  void TearDown() override {
    if (!dir_.empty()) std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
  }

  CommandResult Coordinator(std::vector<std::string> flags) {
    flags.insert(flags.begin(), {MESH_COORDINATOR_BIN, "--listen", "127.0.0.1", "--port", "0"});
    return RunToEnd(flags, absl::StrCat(dir_, "/coordinator-", ++runs_, ".err"));
  }

  std::string dir_;
  ::mesh::testing::TestPki pki_;
  std::string tokens_file_;
  int runs_ = 0;
};

TEST_F(CoordinatorSecurityFlagsTest, RefusesToStartOpenOrLeaky) {
  // Neither TLS nor --insecure.
  CommandResult plain = Coordinator({});
  EXPECT_EQ(plain.code, 2) << plain.out << plain.err;
  EXPECT_THAT(plain.err, HasSubstr("--insecure"));
  EXPECT_THAT(plain.out, Not(HasSubstr(kBanner)));

  // --insecure with tokens: they would cross the network in clear.
  CommandResult leaky = Coordinator({"--insecure", "--auth-tokens", tokens_file_});
  EXPECT_EQ(leaky.code, 2) << leaky.out << leaky.err;
  EXPECT_THAT(leaky.err, HasSubstr("--auth-tokens"));
  EXPECT_THAT(leaky.out, Not(HasSubstr(kBanner)));

  // --insecure with TLS flags.
  CommandResult mixed =
      Coordinator({"--insecure", "--tls-cert", pki_.server_cert, "--tls-key", pki_.server_key});
  EXPECT_EQ(mixed.code, 2) << mixed.out << mixed.err;

  // TLS that authenticates nobody: neither a client CA nor tokens.
  CommandResult open = Coordinator({"--tls-cert", pki_.server_cert, "--tls-key", pki_.server_key});
  EXPECT_EQ(open.code, 2) << open.out << open.err;
  EXPECT_THAT(open.err, AllOf(HasSubstr("--tls-client-ca"), HasSubstr("--auth-tokens")));
  EXPECT_THAT(open.out, Not(HasSubstr(kBanner)));
}

}  // namespace secure_cluster_test
}  // namespace mesh
