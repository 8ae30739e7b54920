#include "agent/exit_detail.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace mesh::agent {
namespace {

constexpr absl::string_view kLoaderError = "error while loading shared libraries: ";
constexpr absl::string_view kEllipsis = "...";

bool IsContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of the well-formed UTF-8 sequence at the start of `s` (the ranges
// of RFC 3629, which protobuf checks too: no overlong forms, no
// surrogates), or 0 when it is not one.
size_t Utf8SequenceLength(absl::string_view s) {
  const auto at = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = at(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // Range of the second byte.
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < n || at(1) < lo || at(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (!IsContinuation(at(i))) return 0;
  }
  return n;
}

// Length of the terminal escape sequence at the start of `s` (which starts
// with ESC): CSI "ESC [ params final" (colours, cursor moves), OSC
// "ESC ] ... BEL|ESC \" (titles, links), or ESC and one more byte.
size_t EscapeLength(absl::string_view s) {
  if (s.size() < 2) return s.size();
  if (s[1] == '[') {
    size_t i = 2;
    while (i < s.size() && s[i] >= 0x20 && s[i] <= 0x3F) ++i;
    return i < s.size() && s[i] >= 0x40 && s[i] <= 0x7E ? i + 1 : i;
  }
  if (s[1] == ']') {
    for (size_t i = 2; i < s.size(); ++i) {
      if (s[i] == '\a') return i + 1;
      if (s[i] == '\x1b' && i + 1 < s.size() && s[i + 1] == '\\') return i + 2;
    }
    return s.size();
  }
  return 2;
}

// `line` as one line of valid UTF-8 for people: escape sequences removed,
// tabs as spaces, other control characters (C0, DEL, C1) and bytes that are
// not UTF-8 as '?'; surrounding whitespace stripped.
std::string Printable(absl::string_view line) {
  std::string out;
  out.reserve(line.size());
  size_t i = 0;
  while (i < line.size()) {
    const unsigned char c = static_cast<unsigned char>(line[i]);
    if (c == 0x1b) {
      i += EscapeLength(line.substr(i));
      continue;
    }
    if (c == '\t') {
      out.push_back(' ');
      ++i;
      continue;
    }
    if (c < 0x20 || c == 0x7f) {
      out.push_back('?');
      ++i;
      continue;
    }
    const size_t n = Utf8SequenceLength(line.substr(i));
    if (n == 0 || (n == 2 && c == 0xC2 && static_cast<unsigned char>(line[i + 1]) < 0xA0)) {
      out.push_back('?');  // Not UTF-8, or a C1 control (U+0080..U+009F).
      i += n == 0 ? 1 : n;
      continue;
    }
    out.append(line.data() + i, n);
    i += n;
  }
  return std::string(absl::StripAsciiWhitespace(out));
}

// `text` cut to kMaxExitDetailBytes at a character boundary, "..." marking
// the cut. `text` is valid UTF-8.
std::string Clip(std::string text) {
  if (text.size() <= kMaxExitDetailBytes) return text;
  size_t end = kMaxExitDetailBytes - kEllipsis.size();
  while (end > 0 && IsContinuation(static_cast<unsigned char>(text[end]))) --end;
  text.resize(end);
  absl::StrAppend(&text, kEllipsis);
  return text;
}

// What a terminal shows of a line that was rewritten with '\r' (progress
// bars): its last non-blank segment. A CRLF line's empty tail is skipped.
absl::string_view LastSegment(absl::string_view line) {
  std::vector<absl::string_view> segments = absl::StrSplit(line, '\r', absl::SkipWhitespace());
  return segments.empty() ? absl::string_view() : segments.back();
}

}  // namespace

// O_NOFOLLOW and regular files only: the job directory is the worker's
// account's, so the log may have been replaced by a link or a FIFO.
std::string ReadLogTail(const std::string& path, int64_t max_bytes) {
  if (max_bytes <= 0) return "";
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return "";
  std::string tail;
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    const int64_t start = st.st_size > max_bytes ? st.st_size - max_bytes : 0;
    tail.resize(static_cast<size_t>(st.st_size - start));
    size_t got = 0;
    while (got < tail.size()) {
      const ssize_t n =
          pread(fd, tail.data() + got, tail.size() - got, start + static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // An error, or the file shrank (log rotation).
      got += static_cast<size_t>(n);
    }
    tail.resize(got);
  }
  close(fd);
  return tail;
}

std::string ExitDetail(const ExitInfo& exit, absl::string_view log_tail) {
  if (!exit.exited() || exit.exit_code != 127) return "";
  std::vector<absl::string_view> lines = absl::StrSplit(log_tail, '\n');
  // glibc: "<program>: error while loading shared libraries: <lib>: <why>".
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    const size_t at = it->find(kLoaderError);
    if (at == absl::string_view::npos) continue;
    return Clip(Printable(LastSegment(it->substr(at))));
  }
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    std::string line = Printable(LastSegment(*it));
    if (!line.empty()) return Clip(absl::StrCat("last log line: ", line));
  }
  return "";
}

}  // namespace mesh::agent
