#include "agent/exit_detail.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace mesh::agent {
namespace {

constexpr size_t kMaxDetail = 512;
constexpr char kLoaderError[] = "error while loading shared libraries: ";

std::string Clip(absl::string_view text) {
  return std::string(text.size() <= kMaxDetail ? text : text.substr(0, kMaxDetail));
}

}  // namespace

std::string ReadLogTail(const std::string& path, int64_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st;
  std::string tail;
  if (fstat(fd, &st) == 0) {
    const int64_t start = st.st_size > max_bytes ? st.st_size - max_bytes : 0;
    tail.resize(static_cast<size_t>(st.st_size - start));
    const ssize_t n = pread(fd, tail.data(), tail.size(), start);
    tail.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  close(fd);
  return tail;
}

std::string ExitDetail(const ExitInfo& exit, const std::string& log_tail) {
  if (!exit.exited() || exit.exit_code != 127) return "";
  std::vector<absl::string_view> lines = absl::StrSplit(log_tail, '\n', absl::SkipWhitespace());
  // glibc: "<program>: error while loading shared libraries: <lib>: <why>".
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    const size_t at = it->find(kLoaderError);
    if (at != absl::string_view::npos) {
      return Clip(absl::StrCat("the dynamic loader could not start it: ",
                               absl::StripAsciiWhitespace(it->substr(at))));
    }
  }
  if (!lines.empty()) {
    return Clip(absl::StrCat("its last output: ", absl::StripAsciiWhitespace(lines.back())));
  }
  return "";
}

}  // namespace mesh::agent
