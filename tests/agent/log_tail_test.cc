// LogTail over real files in a temporary directory (no processes).
#include "agent/log_tail.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "agent/exit_detail.h"

namespace mesh::agent {
namespace log_tail_test {

class LogTailTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/mesh-log-tail-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    path_ = dir_ + "/rank-0.log";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Append(const std::string& text) { Append(path_, text); }
  static void Append(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::app) << text;
  }

  // Everything Read hands out until it returns nothing.
  static std::string Drain(LogTail& tail, size_t max_bytes, bool final) {
    std::string all;
    for (int i = 0; i < 1000; ++i) {
      auto piece = tail.Read(max_bytes, final);
      EXPECT_TRUE(piece.ok()) << piece.status();
      if (!piece.ok() || piece->data.empty()) break;
      all += piece->data;
    }
    return all;
  }

  std::string dir_;
  std::string path_;
};

TEST_F(LogTailTest, MissingFileIsNotFound) {
  auto tail = LogTail::Open(path_, 0);
  EXPECT_EQ(tail.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(LogTailTest, ReadsWholeLinesAndHoldsAPartialOneUntilFinal) {
  Append("one\ntwo\nthr");
  auto tail = LogTail::Open(path_, 0);
  ASSERT_TRUE(tail.ok()) << tail.status();
  auto piece = (*tail)->Read(1024, false);
  ASSERT_TRUE(piece.ok());
  EXPECT_EQ(piece->data, "one\ntwo\n");
  EXPECT_EQ(piece->offset, 0);
  EXPECT_FALSE(piece->truncated);
  piece = (*tail)->Read(1024, false);
  ASSERT_TRUE(piece.ok());
  EXPECT_EQ(piece->data, "");
  EXPECT_FALSE((*tail)->at_end()) << "a partial line is pending";
  Append("ee\nfour");
  piece = (*tail)->Read(1024, false);
  ASSERT_TRUE(piece.ok());
  EXPECT_EQ(piece->data, "three\n");
  EXPECT_EQ(piece->offset, 8);
  piece = (*tail)->Read(1024, true);
  ASSERT_TRUE(piece.ok());
  EXPECT_EQ(piece->data, "four");
  piece = (*tail)->Read(1024, true);
  ASSERT_TRUE(piece.ok());
  EXPECT_EQ(piece->data, "");
  EXPECT_TRUE((*tail)->at_end());
  EXPECT_EQ((*tail)->offset(), 18);
}

TEST_F(LogTailTest, SplitsOnlyLinesLongerThanThePiece) {
  Append("ab\ncd\n0123456789\nx\n");
  auto tail = LogTail::Open(path_, 0);
  ASSERT_TRUE(tail.ok());
  std::vector<std::string> pieces;
  for (int i = 0; i < 20; ++i) {
    auto piece = (*tail)->Read(6, false);
    ASSERT_TRUE(piece.ok());
    if (piece->data.empty()) break;
    pieces.push_back(piece->data);
  }
  EXPECT_THAT(pieces, ::testing::ElementsAre("ab\ncd\n", "012345", "6789\n", "x\n"));
}

TEST_F(LogTailTest, TailStartsAtTheLastLines) {
  Append("1\n2\n3\n4\n5\n");
  auto tail = LogTail::Open(path_, 2);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(Drain(**tail, 1024, true), "4\n5\n");
  // A final line without a newline counts as a line.
  Append("6");
  auto tail2 = LogTail::Open(path_, 2);
  ASSERT_TRUE(tail2.ok());
  EXPECT_EQ(Drain(**tail2, 1024, true), "5\n6");
  // More lines asked for than there are: the whole file.
  auto tail3 = LogTail::Open(path_, 100);
  ASSERT_TRUE(tail3.ok());
  EXPECT_EQ(Drain(**tail3, 1024, true), "1\n2\n3\n4\n5\n6");
}

TEST_F(LogTailTest, TailOfALargeFileCrossesBlocks) {
  std::string big;
  for (int i = 0; i < 30000; ++i) absl::StrAppend(&big, "line ", i, "\n");
  Append(big);
  auto tail = LogTail::Open(path_, 3);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(Drain(**tail, 64 * 1024, true), "line 29997\nline 29998\nline 29999\n");
  auto all = LogTail::Open(path_, 0);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(Drain(**all, 64 * 1024, true), big);
}

// The launcher's rotation: "<path>" renamed to "<path>.1", a fresh "<path>".
TEST_F(LogTailTest, FollowsARotationAndMarksItTruncated) {
  Append("old 1\nold 2\n");
  auto tail = LogTail::Open(path_, 0);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(Drain(**tail, 1024, false), "old 1\nold 2\n");
  Append("old 3\n");  // written before the rotation, read after it
  ASSERT_EQ(std::rename(path_.c_str(), (path_ + ".1").c_str()), 0);
  Append("new 1\n");
  auto piece = (*tail)->Read(1024, false);
  ASSERT_TRUE(piece.ok());
  EXPECT_EQ(piece->data, "old 3\n");
  EXPECT_FALSE(piece->truncated);
  piece = (*tail)->Read(1024, false);
  ASSERT_TRUE(piece.ok());
  EXPECT_EQ(piece->data, "new 1\n");
  EXPECT_EQ(piece->offset, 0);
  EXPECT_TRUE(piece->truncated);
  EXPECT_EQ((*tail)->rotations(), 1);
  EXPECT_TRUE((*tail)->past_open_end());
  piece = (*tail)->Read(1024, false);
  ASSERT_TRUE(piece.ok());
  EXPECT_EQ(piece->data, "");
  EXPECT_TRUE((*tail)->at_end());
}

TEST_F(LogTailTest, AFileThatWasRotatedBeforeOpenStartsTruncated) {
  Append(path_ + ".1", "older\n");
  Append("newer\n");
  auto tail = LogTail::Open(path_, 0);
  ASSERT_TRUE(tail.ok());
  auto piece = (*tail)->Read(1024, true);
  ASSERT_TRUE(piece.ok());
  EXPECT_EQ(piece->data, "newer\n");
  EXPECT_TRUE(piece->truncated);
}

TEST_F(LogTailTest, ARotatedFilesLastPartialLineIsDelivered) {
  Append("partial");
  auto tail = LogTail::Open(path_, 0);
  ASSERT_TRUE(tail.ok());
  auto piece = (*tail)->Read(1024, false);
  ASSERT_TRUE(piece.ok());
  EXPECT_EQ(piece->data, "");
  ASSERT_EQ(std::rename(path_.c_str(), (path_ + ".1").c_str()), 0);
  Append("rest\n");
  EXPECT_EQ(Drain(**tail, 1024, false), "partialrest\n");
}

// The job's directory belongs to the worker's account when workers run as
// their owners: a log it replaced with a symlink (to root's files) or a
// FIFO (which would block the agent) is refused, not read.
TEST_F(LogTailTest, ASymlinkOrAFifoInPlaceOfTheLogIsRefused) {
  const std::string secret = path_ + ".secret";
  std::ofstream(secret) << "root only\n";
  ASSERT_EQ(symlink(secret.c_str(), path_.c_str()), 0);
  auto linked = LogTail::Open(path_, 0);
  EXPECT_FALSE(linked.ok());
  EXPECT_EQ(ReadLogTail(path_), "");
  ASSERT_EQ(unlink(path_.c_str()), 0);
  ASSERT_EQ(mkfifo(path_.c_str(), 0600), 0);
  EXPECT_FALSE(LogTail::Open(path_, 0).ok());
  EXPECT_EQ(ReadLogTail(path_), "");
}

}  // namespace log_tail_test
}  // namespace mesh::agent
