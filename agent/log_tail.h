// LogTail: reads one rank's log file for upload to the coordinator
// (UPLOAD_LOGS orders; LogChunk in protos/mesh/v1/job.proto).
//
// It starts at the beginning of the file or at its last N lines, hands out
// pieces that end at a line end where possible, and can follow the file
// while the worker runs. The launcher caps each log by renaming it to
// "<path>.1" and starting a fresh "<path>" (agent/process_launcher.h); the
// tail notices the rename when it reaches the end of the file it holds open,
// finishes that file (the launcher never writes it again), and continues at
// offset 0 of the new one with `truncated` set, because offsets restart and
// older output may be dropped by the next rotation.
//
//   Open ──▶ reading ──EOF, same inode──▶ at_end (more may come while the
//              ▲                           writer runs)
//              └──EOF, path has a new inode: switch, offset 0, truncated
//
// Thread safety: none; one LogTail is used by one upload at a time.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace mesh::agent {

// One piece of a log.
struct LogPiece {
  std::string data;
  // Byte offset of `data` in the file it came from.
  int64_t offset = 0;
  // Output before `offset` is not in this file: the file was rotated (see
  // the header comment).
  bool truncated = false;
};

class LogTail {
 public:
  // Opens `path` at its start (tail_lines <= 0) or at the start of its last
  // `tail_lines` lines (a final line without '\n' counts as a line).
  // Possible errors: NOT_FOUND when `path` does not exist; INTERNAL for
  // other open/stat/read failures, naming the path.
  static absl::StatusOr<std::unique_ptr<LogTail>> Open(const std::string& path, int tail_lines);

  ~LogTail();
  LogTail(const LogTail&) = delete;
  LogTail& operator=(const LogTail&) = delete;

  // The next piece, at most `max_bytes` (> 0) long. It ends after a '\n'
  // unless a single line is longer than `max_bytes`, or `final` is set: the
  // writer has exited, so a last line without '\n' is complete too. Empty
  // data means nothing new now (at_end() tells whether the file is done
  // for the moment). Follows a rotation to the new file.
  // Possible errors: INTERNAL for read failures, naming the path.
  absl::StatusOr<LogPiece> Read(size_t max_bytes, bool final);

  // True when the last Read returned nothing because every byte of the
  // current file was handed out and no rotation was pending.
  bool at_end() const { return at_end_; }

  // True once the tail has handed out everything the file held when it was
  // opened (or the file was rotated since): a one-shot read stops there even
  // if the writer keeps writing.
  bool past_open_end() const { return rotations_ > 0 || offset_ >= size_at_open_; }

  int64_t offset() const { return offset_; }
  int rotations() const { return rotations_; }

 private:
  LogTail(std::string path, int fd, ino_t inode, int64_t offset, int64_t size_at_open);

  // Whether "<path>" now names another file than the one held open. ENOENT
  // (the launcher is between rename and create) counts as rotated.
  bool Rotated() const;
  absl::Status SwitchToNewFile();

  const std::string path_;
  int fd_;
  ino_t inode_;
  int64_t offset_;
  int64_t size_at_open_;
  int rotations_ = 0;
  bool truncated_next_ = false;  // mark the next piece
  bool at_end_ = false;
};

}  // namespace mesh::agent
