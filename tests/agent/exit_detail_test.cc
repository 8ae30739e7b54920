#include "agent/exit_detail.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "tests/util/proc.h"

namespace mesh::agent {
namespace exit_detail_test {

using ::mesh::testing::ScratchDir;
using ::testing::EndsWith;
using ::testing::StartsWith;

ExitInfo Exited(int code) {
  ExitInfo exit;
  exit.exit_code = code;
  return exit;
}

ExitInfo Killed(int signal) {
  ExitInfo exit;
  exit.signal = signal;
  return exit;
}

// True when `s` is well-formed UTF-8 without C0 controls or DEL.
bool IsCleanUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return false;
    size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

constexpr char kLoaderLine[] =
    "/opt/train: error while loading shared libraries: libcudart.so.12: cannot open shared "
    "object file: No such file or directory";
constexpr char kLoaderMessage[] =
    "error while loading shared libraries: libcudart.so.12: cannot open shared object file: No "
    "such file or directory";

TEST(ExitDetail, ExitCode127GivesTheLoadersMessage) {
  EXPECT_EQ(ExitDetail(Exited(127), absl::StrCat("starting\n", kLoaderLine, "\n")), kLoaderMessage);
  // Without a final newline, with CRLF, and with output after it.
  EXPECT_EQ(ExitDetail(Exited(127), kLoaderLine), kLoaderMessage);
  EXPECT_EQ(ExitDetail(Exited(127), absl::StrCat(kLoaderLine, "\r\n")), kLoaderMessage);
  EXPECT_EQ(ExitDetail(Exited(127), absl::StrCat(kLoaderLine, "\nwrapper: giving up\n\n")),
            kLoaderMessage);
  // The last loader line wins (a wrapper that tried twice).
  EXPECT_EQ(ExitDetail(Exited(127),
                       "a: error while loading shared libraries: libold.so: x\n"
                       "b: error while loading shared libraries: libnew.so: y\n"),
            "error while loading shared libraries: libnew.so: y");
}

TEST(ExitDetail, ExitCode127WithoutALoaderLineGivesTheLastLogLine) {
  EXPECT_EQ(ExitDetail(Exited(127), "sh: 1: trian.py: not found\n\n  \n"),
            "last log line: sh: 1: trian.py: not found");
  EXPECT_EQ(ExitDetail(Exited(127), "bash: line 1: trian.py: command not found"),
            "last log line: bash: line 1: trian.py: command not found");
  // A progress line rewritten with '\r': what the terminal showed last.
  EXPECT_EQ(ExitDetail(Exited(127), "step 1\rstep 2\rstep 3\r\n"), "last log line: step 3");
  EXPECT_EQ(ExitDetail(Exited(127), ""), "");
  EXPECT_EQ(ExitDetail(Exited(127), "\n \n\t\n"), "");
}

TEST(ExitDetail, OtherStatusesHaveNone) {
  for (int code : {0, 1, 2, 126, 128, 255}) {
    EXPECT_EQ(ExitDetail(Exited(code), kLoaderLine), "") << code;
  }
  EXPECT_EQ(ExitDetail(Killed(9), kLoaderLine), "");
  EXPECT_EQ(ExitDetail(Killed(127), kLoaderLine), "");
}

TEST(ExitDetail, IsOnePrintableUtf8LineOfBoundedLength) {
  // Colours removed, controls and invalid bytes replaced, tabs as spaces.
  EXPECT_EQ(
      ExitDetail(Exited(127), "\x1b[31mfatal:\x1b[0m\tno\x07 such\x80 file \xc3\xa9t\xc3\xa9"),
      "last log line: fatal: no? such? file \xc3\xa9t\xc3\xa9");
  // Overlong forms, surrogates and a C1 control are not text either.
  EXPECT_EQ(ExitDetail(Exited(127), "a\xc0\xaf b\xed\xa0\x80 c\xc2\x85"),
            "last log line: a?? b??? c?");
  EXPECT_EQ(ExitDetail(Exited(127), "\x1b]0;title\x07x"), "last log line: x");

  const std::string long_line(2000, 'x');
  const std::string clipped = ExitDetail(Exited(127), long_line);
  EXPECT_EQ(clipped.size(), kMaxExitDetailBytes);
  EXPECT_THAT(clipped, StartsWith("last log line: xxx"));
  EXPECT_THAT(clipped, EndsWith("x..."));

  // A cut never splits a character: 2-byte characters from an odd offset.
  std::string accents = "a";
  for (int i = 0; i < 400; ++i) accents += "\xc3\xa9";
  const std::string cut = ExitDetail(Exited(127), accents);
  EXPECT_LE(cut.size(), kMaxExitDetailBytes);
  EXPECT_THAT(cut, EndsWith("\xc3\xa9..."));
  EXPECT_TRUE(IsCleanUtf8(cut));

  std::string junk;
  for (int i = 0; i < 3000; ++i) junk.push_back(static_cast<char>((i * 7919) % 256));
  const std::string cleaned = ExitDetail(Exited(127), junk);
  EXPECT_LE(cleaned.size(), kMaxExitDetailBytes);
  EXPECT_TRUE(IsCleanUtf8(cleaned)) << cleaned;
}

class ReadLogTailTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    return dir_.Write(name, text);
  }

  const ScratchDir dir_{"exit_detail_test"};
};

TEST_F(ReadLogTailTest, ReadsAtMostTheLastBytes) {
  std::string text;
  for (int i = 0; i < 10000; ++i) absl::StrAppend(&text, i, "\n");
  const std::string path = Write("rank-0.log", text);
  EXPECT_EQ(ReadLogTail(path, 100), text.substr(text.size() - 100));
  EXPECT_EQ(ReadLogTail(path).size(), static_cast<size_t>(kExitDetailLogBytes));
  EXPECT_EQ(ReadLogTail(path, int64_t{1} << 40), text);  // Smaller than the bound: all of it.
  EXPECT_EQ(ReadLogTail(path, 0), "");
  EXPECT_EQ(ReadLogTail(path, -5), "");
  EXPECT_EQ(ReadLogTail(Write("empty.log", ""), 100), "");
}

TEST_F(ReadLogTailTest, UnreadableIsEmpty) {
  EXPECT_EQ(ReadLogTail(dir_ / "missing.log"), "");
  EXPECT_EQ(ReadLogTail(dir_.path()), "");  // A directory is not a log.
}

TEST_F(ReadLogTailTest, ExplainsAWorkerFromItsLogFile) {
  const std::string path =
      Write("rank-3.log", absl::StrCat(std::string(10000, '.'), "\n", kLoaderLine, "\n"));
  EXPECT_EQ(ExitDetail(Exited(127), ReadLogTail(path)), kLoaderMessage);
}

}  // namespace exit_detail_test
}  // namespace mesh::agent
