// Crash test of JobStore's "durable before acknowledged": a child process
// creates jobs and reports each id to the parent only after CreateJob has
// returned; the parent SIGKILLs it mid-stream, reopens the store, and checks
// that every acknowledged job is there, exactly once, with its first event.
//
// SIGKILL ends the process, not the machine: what the child had written is
// still in the page cache. So this proves that a returned CreateJob has
// committed (nothing acknowledged sits in a user-space buffer or an open
// transaction) and that a half-done transaction leaves no trace; it cannot
// prove the fsync itself, which synchronous=FULL is there for.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "coordinator/sqlite_job_store.h"
#include "tests/util/status_matchers.h"

namespace mesh::coordinator {
namespace job_store_crash_test {

using ::mesh::testing::IsOk;

constexpr int kRounds = 8;
// A child that is never killed stops here, so that nothing runs unbounded.
constexpr int kMaxJobsPerChild = 20000;
constexpr auto kRoundTimeout = std::chrono::seconds(20);

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) _exit(4);
    done += static_cast<size_t>(n);
  }
}

// The child: never returns. Reports "A <id> <key>" per acknowledged job, or
// "E <message>" and exits on an error.
[[noreturn]] void RunWriter(const std::string& db, int fd, int round, pid_t parent) {
  // Dies with the test; the getppid check covers a parent that died before
  // prctl ran.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(3);
  auto store = SqliteJobStore::Open(db, Clock::Real());
  if (!store.ok()) {
    WriteAll(fd, absl::StrCat("E ", store.status().ToString(), "\n"));
    _exit(2);
  }
  for (int i = 0; i < kMaxJobsPerChild; ++i) {
    NewJob job;
    job.idempotency_key = absl::StrCat("round", round, "-", i);
    job.name = absl::StrCat("crash-", round, "-", i);
    job.state = "PENDING";
    job.spec = std::string(512, static_cast<char>('a' + i % 26));
    auto created = (*store)->CreateJob(job);
    if (!created.ok()) {
      WriteAll(fd, absl::StrCat("E ", created.status().ToString(), "\n"));
      _exit(2);
    }
    // Acknowledged only now, after CreateJob returned.
    WriteAll(fd, absl::StrCat("A ", created->job.id, " ", job.idempotency_key, "\n"));
  }
  _exit(0);
}

struct RoundResult {
  std::vector<std::pair<std::string, std::string>> acked;  // (id, key)
  std::vector<std::string> errors;
  bool killed = false;
};

// Forks a writer and kills it once `kill_after` acknowledgements have
// arrived (0: after `kill_delay` instead, which can land inside Open and
// the schema migration). Reads every line the child wrote before it died.
RoundResult RunRound(const std::string& db, int round, int kill_after,
                     std::chrono::microseconds kill_delay) {
  RoundResult result;
  int fds[2];
  if (pipe(fds) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return result;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    close(fds[0]);
    close(fds[1]);
    return result;
  }
  if (pid == 0) {
    close(fds[0]);
    RunWriter(db, fds[1], round, parent);
  }
  close(fds[1]);

  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + kRoundTimeout;
  std::string buffer;
  bool sent_kill = false;
  auto kill_child = [&] {
    if (!sent_kill) {
      kill(pid, SIGKILL);
      sent_kill = true;
    }
  };
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      ADD_FAILURE() << "round " << round << " ran past " << kRoundTimeout.count() << " s";
      kill_child();
      break;
    }
    if (kill_after == 0 && now - start >= kill_delay) kill_child();
    int wait_ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1);
    if (kill_after == 0 && !sent_kill) wait_ms = 0;  // Poll until the delay passes.
    pollfd pfd{fds[0], POLLIN, 0};
    const int ready = poll(&pfd, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;
    char chunk[4096];
    const ssize_t n = read(fds[0], chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child is gone and everything it wrote is read.
    buffer.append(chunk, static_cast<size_t>(n));
    size_t newline;
    while ((newline = buffer.find('\n')) != std::string::npos) {
      const std::string line = buffer.substr(0, newline);
      buffer.erase(0, newline + 1);
      if (line.rfind("A ", 0) == 0) {
        std::vector<std::string> parts = absl::StrSplit(line, ' ');
        if (parts.size() == 3) {
          result.acked.emplace_back(parts[1], parts[2]);
        } else {
          result.errors.push_back("bad line: " + line);
        }
      } else {
        result.errors.push_back(line);
      }
    }
    if (kill_after > 0 && static_cast<int>(result.acked.size()) >= kill_after) kill_child();
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  // A partial last line is a write the kill cut short: never acknowledged.
  return result;
}

TEST(JobStoreCrashTest, EveryAcknowledgedJobSurvivesSigkill) {
  std::string tmpl = ::testing::TempDir() + "job_store_crash.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const std::string db = tmpl + "/state.db";

  std::mt19937 rng(20261122);  // Fixed: a failure reproduces.
  std::uniform_int_distribution<int> kill_after(1, 300);
  std::uniform_int_distribution<int> kill_delay_us(0, 50000);

  // Every job acknowledged so far, across rounds: id -> key.
  std::map<std::string, std::string> acknowledged;
  int64_t stored_before = 0;
  for (int round = 0; round < kRounds; ++round) {
    // Rounds 0 and 3 kill after a delay, which can land in Open itself.
    const bool by_delay = round % 3 == 0;
    const int after = by_delay ? 0 : kill_after(rng);
    const auto delay = std::chrono::microseconds(kill_delay_us(rng));
    RoundResult result = RunRound(db, round, after, delay);
    EXPECT_THAT(result.errors, ::testing::IsEmpty()) << "round " << round;
    EXPECT_TRUE(result.killed) << "round " << round << ": the writer was not SIGKILLed";

    auto store = SqliteJobStore::Open(db, Clock::Real());
    ASSERT_THAT(store, IsOk()) << "round " << round;
    for (const auto& [id, key] : result.acked) {
      EXPECT_TRUE(acknowledged.emplace(id, key).second)
          << "id " << id << " acknowledged twice (round " << round << ")";
    }
    // Every job acknowledged in any round is there, with its key and its
    // first event.
    for (const auto& [id, key] : acknowledged) {
      auto job = (*store)->GetJob(id);
      ASSERT_THAT(job, IsOk()) << "acknowledged job " << id << " lost (round " << round << ")";
      EXPECT_EQ(job->idempotency_key, key);
      auto events = (*store)->ListEvents(id);
      ASSERT_THAT(events, IsOk());
      EXPECT_EQ(events->size(), 1u) << id;
    }
    // Exactly once: the stored jobs are the acknowledged ones plus at most
    // one per round that committed before the kill but was not yet
    // reported; ids and keys are unique.
    std::set<std::string> ids;
    std::set<std::string> keys;
    JobQuery query;
    query.limit = JobStore::kMaxPageSize;
    for (int page_count = 0; page_count < 1000; ++page_count) {
      auto page = (*store)->ListJobs(query);
      ASSERT_THAT(page, IsOk());
      for (const JobRecord& job : page->jobs) {
        EXPECT_TRUE(ids.insert(job.id).second) << "duplicate id " << job.id;
        EXPECT_TRUE(keys.insert(job.idempotency_key).second)
            << "duplicate key " << job.idempotency_key;
      }
      if (page->next_page_token.empty()) break;
      query.page_token = page->next_page_token;
    }
    const int64_t stored = static_cast<int64_t>(ids.size());
    const int64_t acked = static_cast<int64_t>(result.acked.size());
    EXPECT_GE(stored - stored_before, acked) << "round " << round;
    EXPECT_LE(stored - stored_before, acked + 1) << "round " << round;
    std::printf("round %d: kill %s, %lld acknowledged, %lld stored (total %lld)\n", round,
                by_delay ? absl::StrCat("after ", delay.count(), " us").c_str()
                         : absl::StrCat("after ", after, " acks").c_str(),
                static_cast<long long>(acked), static_cast<long long>(stored - stored_before),
                static_cast<long long>(stored));
    stored_before = stored;
  }
  EXPECT_GT(acknowledged.size(), 0u);  // The test exercised something.

  for (const char* suffix : {"", "-wal", "-shm"}) unlink((db + suffix).c_str());
  rmdir(tmpl.c_str());
}

}  // namespace job_store_crash_test
}  // namespace mesh::coordinator
