#include "coordinator/worker_exit_message.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace mesh::coordinator {
namespace worker_exit_message_test {

using ::mesh::v1::ReportWorkerExitRequest;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kWho[] = "rank 3 (node n1)";

ReportWorkerExitRequest ExitCode(int code, const std::string& detail = "") {
  ReportWorkerExitRequest request;
  request.set_exit_code(code);
  request.set_detail(detail);
  return request;
}

ReportWorkerExitRequest Signal(int signal, const std::string& detail = "") {
  ReportWorkerExitRequest request;
  request.set_signal(signal);
  request.set_detail(detail);
  return request;
}

ReportWorkerExitRequest Oom(ReportWorkerExitRequest request) {
  request.set_oom_killed(true);
  return request;
}

TEST(WorkerExitMessage, StatusAlone) {
  EXPECT_EQ(WorkerExitMessage(kWho, ExitCode(3)), "rank 3 (node n1) exited with code 3");
  EXPECT_EQ(WorkerExitMessage(kWho, Signal(11)),
            "rank 3 (node n1) was killed by signal 11 (SIGSEGV)");
  EXPECT_EQ(WorkerExitMessage(kWho, Signal(64)), "rank 3 (node n1) was killed by signal 64");
  ReportWorkerExitRequest launch;
  launch.set_launch_error("execve /usr/bin/python3: No such file or directory");
  EXPECT_EQ(WorkerExitMessage(kWho, launch),
            "rank 3 (node n1) could not be started: execve /usr/bin/python3: No such file or "
            "directory");
  EXPECT_EQ(WorkerExitMessage(kWho, ReportWorkerExitRequest()), "rank 3 (node n1) ended");
}

TEST(WorkerExitMessage, DetailIsAppended) {
  EXPECT_EQ(
      WorkerExitMessage("rank 0 (node n1)",
                        ExitCode(127,
                                 "error while loading shared libraries: libfoo.so.1: cannot open "
                                 "shared object file: No such file or directory")),
      "rank 0 (node n1) exited with code 127: error while loading shared libraries: "
      "libfoo.so.1: cannot open shared object file: No such file or directory");
  EXPECT_EQ(WorkerExitMessage(kWho, ExitCode(127, "last log line: sh: 1: trian.py: not found")),
            "rank 3 (node n1) exited with code 127: last log line: sh: 1: trian.py: not found");
  EXPECT_EQ(WorkerExitMessage(kWho, Signal(6, "core dumped")),
            "rank 3 (node n1) was killed by signal 6 (SIGABRT): core dumped");
  // Not repeated when the launch error already says it.
  ReportWorkerExitRequest launch;
  launch.set_launch_error("env: LD_PRELOAD: denied on this node");
  launch.set_detail("denied on this node");
  EXPECT_EQ(WorkerExitMessage(kWho, launch),
            "rank 3 (node n1) could not be started: env: LD_PRELOAD: denied on this node");
}

TEST(WorkerExitMessage, DetailIsMadeOneBoundedLine) {
  EXPECT_EQ(WorkerExitMessage(kWho, ExitCode(127, "\n  first\n\n\tsecond\r\n")),
            "rank 3 (node n1) exited with code 127: first second");
  EXPECT_EQ(WorkerExitMessage(kWho, ExitCode(1, " \n\t")), "rank 3 (node n1) exited with code 1");

  std::string accents;
  for (int i = 0; i < 1000; ++i) accents += "\xc3\xa9";  // 2000 bytes
  const std::string message = WorkerExitMessage(kWho, ExitCode(1, "x" + accents));
  const std::string prefix = "rank 3 (node n1) exited with code 1: ";
  ASSERT_THAT(message, StartsWith(prefix));
  EXPECT_LE(message.size() - prefix.size(), kMaxExitDetailBytes);
  EXPECT_THAT(message, EndsWith("\xc3\xa9..."));  // Cut between characters.
}

TEST(WorkerExitMessage, OomKillOfTheRankReadsWellWithOrWithoutTheAgentsWords) {
  const std::string expected =
      "rank 3 (node n1) was killed by the kernel: out of memory (memory limit 8 GiB)";
  EXPECT_EQ(WorkerExitMessage(kWho, Oom(Signal(9,
                                               "killed by the kernel: out of memory (memory "
                                               "limit 8 GiB)"))),
            expected);
  EXPECT_EQ(WorkerExitMessage(kWho, Oom(Signal(9,
                                               "was killed by the kernel: out of memory "
                                               "(memory limit 8 GiB)"))),
            expected);
  EXPECT_EQ(WorkerExitMessage(kWho, Oom(Signal(9))),
            "rank 3 (node n1) was killed by the kernel: out of memory");
  EXPECT_EQ(WorkerExitMessage(kWho, Oom(Signal(9, "memory limit 8 GiB"))),
            "rank 3 (node n1) was killed by the kernel: out of memory; memory limit 8 GiB");
}

TEST(WorkerExitMessage, OomKillOfAChildFollowsTheRanksOwnEnding) {
  EXPECT_EQ(WorkerExitMessage(kWho, Oom(ExitCode(1,
                                                 "a process it started was killed by the "
                                                 "kernel: out of memory (memory limit 8 GiB)"))),
            "rank 3 (node n1) exited with code 1: a process it started was killed by the kernel: "
            "out of memory (memory limit 8 GiB)");
  EXPECT_EQ(WorkerExitMessage(kWho, Oom(ExitCode(1))),
            "rank 3 (node n1) exited with code 1: a process it started was killed by the kernel: "
            "out of memory");
  EXPECT_EQ(WorkerExitMessage(kWho, Oom(Signal(6))),
            "rank 3 (node n1) was killed by signal 6 (SIGABRT): a process it started was killed "
            "by the kernel: out of memory");
  EXPECT_THAT(WorkerExitMessage(kWho, Oom(ExitCode(137, "memory limit 8 GiB"))),
              HasSubstr("exited with code 137: a process it started was killed by the kernel: "
                        "out of memory; memory limit 8 GiB"));
}

}  // namespace worker_exit_message_test
}  // namespace mesh::coordinator
