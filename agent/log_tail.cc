#include "agent/log_tail.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/errno_text.h"

namespace mesh::agent {
namespace {

// Reads up to `size` bytes at `offset`, retrying on EINTR. Returns the
// count, or -1 with errno set.
ssize_t ReadAt(int fd, char* buffer, size_t size, int64_t offset) {
  for (;;) {
    const ssize_t n = pread(fd, buffer, size, offset);
    if (n >= 0 || errno != EINTR) return n;
  }
}

// Offset at which the last `lines` lines of the file's first `size` bytes
// begin. Scans backwards in blocks, so a huge log costs only its tail.
absl::StatusOr<int64_t> TailStart(int fd, int64_t size, int lines, const std::string& path) {
  constexpr int64_t kBlock = 64 * 1024;
  std::vector<char> block(kBlock);
  // A final '\n' ends the last line rather than starting an empty one.
  int64_t end = size;
  int newlines_needed = lines;
  int64_t pos = end;
  bool first = true;
  while (pos > 0) {
    const int64_t start = pos > kBlock ? pos - kBlock : 0;
    const ssize_t n = ReadAt(fd, block.data(), static_cast<size_t>(pos - start), start);
    if (n < 0) return absl::InternalError(absl::StrCat("read ", path, ": ", ErrnoText(errno)));
    if (n != pos - start) return int64_t{0};  // shrank under us: start over from 0
    for (int64_t i = n - 1; i >= 0; --i) {
      if (block[i] != '\n') continue;
      if (first && start + i == end - 1) continue;  // the file's final newline
      if (--newlines_needed == 0) return start + i + 1;
    }
    first = false;
    pos = start;
  }
  return int64_t{0};
}

// Opens a rank log for reading without following what its worker may have
// planted there (the job's directory is the worker's account's): no
// symlink, no FIFO (which would block), only a regular file. -1 with errno
// set otherwise (ELOOP for a symlink, EINVAL for anything but a file).
int OpenRegularLog(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    errno = EINVAL;
    return -1;
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LogTail>> LogTail::Open(const std::string& path, int tail_lines) {
  const int fd = OpenRegularLog(path);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("no log file ", path));
    return absl::InternalError(absl::StrCat("open ", path, ": ", ErrnoText(err)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("stat ", path, ": ", ErrnoText(err)));
  }
  int64_t start = 0;
  if (tail_lines > 0) {
    auto tail = TailStart(fd, st.st_size, tail_lines, path);
    if (!tail.ok()) {
      close(fd);
      return tail.status();
    }
    start = *tail;
  }
  auto log = std::unique_ptr<LogTail>(new LogTail(path, fd, st.st_ino, start, st.st_size));
  // Reading from offset 0 of a file that was rotated before: what came
  // before it is in "<path>.1" at best, so say so.
  struct stat rotated;
  if (start == 0 && stat((path + ".1").c_str(), &rotated) == 0) log->truncated_next_ = true;
  return log;
}

LogTail::LogTail(std::string path, int fd, ino_t inode, int64_t offset, int64_t size_at_open)
    : path_(std::move(path)),
      fd_(fd),
      inode_(inode),
      offset_(offset),
      size_at_open_(size_at_open) {}

LogTail::~LogTail() {
  if (fd_ >= 0) close(fd_);
}

bool LogTail::Rotated() const {
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) return errno == ENOENT;
  return st.st_ino != inode_;
}

absl::Status LogTail::SwitchToNewFile() {
  const int fd = OpenRegularLog(path_);
  if (fd < 0) {
    // Between the launcher's rename and create: try again on the next Read.
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("open ", path_, ": ", ErrnoText(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("stat ", path_, ": ", ErrnoText(err)));
  }
  close(fd_);
  fd_ = fd;
  inode_ = st.st_ino;
  offset_ = 0;
  ++rotations_;
  truncated_next_ = true;
  return absl::OkStatus();
}

absl::StatusOr<LogPiece> LogTail::Read(size_t max_bytes, bool final) {
  at_end_ = false;
  std::string buffer(max_bytes, '\0');
  for (int attempt = 0; attempt < 3; ++attempt) {
    // A rotation is checked *before* reading, so that bytes written to the
    // old file after the check are still read from it below.
    const bool rotated = Rotated();
    const ssize_t n = ReadAt(fd_, buffer.data(), max_bytes, offset_);
    if (n < 0) return absl::InternalError(absl::StrCat("read ", path_, ": ", ErrnoText(errno)));
    buffer.resize(static_cast<size_t>(n));
    if (n == 0) {
      if (!rotated) {
        at_end_ = true;
        return LogPiece{"", offset_, false};
      }
      if (absl::Status s = SwitchToNewFile(); !s.ok()) return s;
      if (Rotated()) return LogPiece{"", offset_, false};  // new file not there yet
      buffer.assign(max_bytes, '\0');
      continue;
    }
    size_t keep = buffer.size();
    const size_t last_newline = buffer.rfind('\n');
    if (last_newline != std::string::npos) {
      keep = last_newline + 1;
    } else if (buffer.size() < max_bytes && !final && !rotated) {
      // A line still being written; a rotated file's last line is complete.
      return LogPiece{"", offset_, false};
    }
    buffer.resize(keep);
    LogPiece piece{std::move(buffer), offset_, truncated_next_};
    truncated_next_ = false;
    offset_ += static_cast<int64_t>(keep);
    return piece;
  }
  return LogPiece{"", offset_, false};
}

}  // namespace mesh::agent
