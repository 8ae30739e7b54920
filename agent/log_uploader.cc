#include "agent/log_uploader.h"

#include <filesystem>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "agent/job_paths.h"
#include "agent/log_tail.h"

namespace mesh::agent {
namespace {

// Largest LogChunk.data sent (the proto's contract: chunks <= 64 KiB).
constexpr size_t kMaxChunkData = 64 * 1024;
// A followed upload with nothing to send writes an empty message this often,
// so it learns that the coordinator ended the call.
constexpr absl::Duration kUploadKeepalive = absl::Seconds(5);

}  // namespace

LogUploader::LogUploader(const AgentConfig* config, NodeClient* client, const OrderApplier* workers,
                         std::function<std::string()> session_id)
    : config_(*config), client_(client), workers_(workers), session_id_(std::move(session_id)) {}

LogUploader::~LogUploader() { Stop(); }

void LogUploader::Start(const v1::Assignment& order) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  // Join the uploads that finished: each sets `done` under mu_ as its last
  // step, so the join below waits only for the thread to return.
  for (auto it = uploads_.begin(); it != uploads_.end();) {
    if ((*it)->done) {
      (*it)->thread.join();
      it = uploads_.erase(it);
    } else {
      ++it;
    }
  }
  if (active_ >= config_.max_uploads) {
    spdlog::warn("refusing log upload {} for job {}: {} uploads already running",
                 order.log_request_id(), order.job_id(), active_);
    return;
  }
  ++active_;
  auto upload = std::make_unique<Upload>();
  Upload* raw = upload.get();
  raw->thread = std::thread([this, order, raw] {
    Run(order);
    absl::MutexLock lock(&mu_);
    --active_;
    raw->done = true;
  });
  uploads_.push_back(std::move(upload));
}

void LogUploader::Stop() {
  std::list<std::unique_ptr<Upload>> uploads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    uploads.swap(uploads_);
  }
  for (auto& upload : uploads) upload->thread.join();
}

bool LogUploader::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

bool LogUploader::SleepUnlessStopping(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), duration);
  return !stopping_;
}

void LogUploader::Run(const v1::Assignment& order) {
  const std::string& job_id = order.job_id();
  const int64_t generation = order.generation();
  const bool follow = order.log_follow();
  v1::UploadLogsRequest header;
  header.set_name(config_.name);
  header.set_job_id(job_id);
  header.set_log_request_id(order.log_request_id());
  std::set<int> ranks(order.log_ranks().begin(), order.log_ranks().end());
  header.set_session_id(session_id_());
  if (ranks.empty()) ranks = workers_->GenerationRanks(job_id, generation);
  if (order.log_ranks().empty() && IsSafeJobId(job_id)) {
    // Logs outlive the agent's memory of a generation (a KILL, a restart of
    // the agent): the directory is the record.
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(
             GenerationDir(config_.work_dir, job_id, generation), error)) {
      absl::string_view name = entry.path().filename().native();
      int rank = 0;
      if (absl::ConsumePrefix(&name, "rank-") && absl::ConsumeSuffix(&name, ".log") &&
          absl::SimpleAtoi(name, &rank) && rank >= 0) {
        ranks.insert(rank);
      }
    }
  }

  std::unique_ptr<LogUploadStream> writer =
      client_->UploadLogs(follow ? config_.follow_upload_timeout : config_.upload_timeout);
  bool header_sent = false;
  auto send = [&](const v1::LogChunk* chunk) {
    v1::UploadLogsRequest message;
    if (!header_sent) {
      message = header;
      header_sent = true;
    }
    if (chunk != nullptr) *message.mutable_chunk() = *chunk;
    return writer->Write(message);
  };
  // Every selected rank is read round-robin, so a follow shows all ranks as
  // they write, not one rank after another.
  struct RankLog {
    int rank = 0;
    std::unique_ptr<LogTail> tail;  // Null: no log (sent as missing).
    bool done = false;
  };
  std::vector<RankLog> logs;
  for (int rank : ranks) {
    RankLog log;
    log.rank = rank;
    absl::StatusOr<std::unique_ptr<LogTail>> tail =
        IsSafeJobId(job_id) ? LogTail::Open(RankLogPath(config_.work_dir, job_id, generation, rank),
                                            order.log_tail())
                            : absl::NotFoundError("bad job id");
    if (tail.ok()) {
      log.tail = *std::move(tail);
    } else if (!absl::IsNotFound(tail.status())) {
      spdlog::warn("log upload: {}", std::string(tail.status().message()));
    }
    logs.push_back(std::move(log));
  }
  auto send_eof = [&](RankLog& log) {
    log.done = true;
    v1::LogChunk eof;
    eof.set_rank(log.rank);
    eof.set_generation(generation);
    eof.set_eof(true);
    if (log.tail == nullptr) {
      eof.set_missing(true);
    } else {
      eof.set_offset(log.tail->offset());
    }
    return send(&eof);
  };

  bool ok = true;
  absl::Time last_write = absl::Now();
  size_t left = logs.size();
  while (ok && left > 0) {
    if (stopping()) {
      ok = false;
      break;
    }
    bool progressed = false;
    for (RankLog& log : logs) {
      if (log.done) continue;
      if (log.tail == nullptr) {
        ok = send_eof(log);
        --left;
        if (!ok) break;
        continue;
      }
      // Checked before reading: the launcher reports an exit only after the
      // worker's output is in the file, so reading after this sees it all.
      const bool finished = !follow || workers_->RankFinished(job_id, generation, log.rank);
      absl::StatusOr<LogPiece> piece = log.tail->Read(kMaxChunkData, finished);
      if (!piece.ok()) {
        spdlog::warn("log upload: {}", std::string(piece.status().message()));
        ok = send_eof(log);
        --left;
        if (!ok) break;
        continue;
      }
      if (!piece->data.empty()) {
        v1::LogChunk chunk;
        chunk.set_rank(log.rank);
        chunk.set_generation(generation);
        chunk.set_stream(v1::LogChunk::STREAM_STDOUT);
        chunk.set_data(std::move(piece->data));
        chunk.set_offset(piece->offset);
        chunk.set_truncated(piece->truncated);
        if (!(ok = send(&chunk))) break;
        last_write = absl::Now();
        progressed = true;
        if (follow || !log.tail->past_open_end()) continue;
      } else if (follow && !(finished && log.tail->at_end())) {
        continue;
      }
      ok = send_eof(log);
      --left;
      if (!ok) break;
    }
    if (!ok || left == 0 || progressed) continue;
    if (absl::Now() - last_write >= kUploadKeepalive) {
      if (!(ok = send(nullptr))) break;
      last_write = absl::Now();
    }
    SleepUnlessStopping(config_.log_poll_interval);
  }
  if (ok && !header_sent) ok = send(nullptr);  // no ranks: the header alone
  if (ok) writer->WritesDone();
  const absl::Status status = writer->Finish();
  if (!status.ok()) {
    spdlog::info("log upload {} for job {} generation {} ended early: {}", order.log_request_id(),
                 job_id, generation, status.ToString());
  }
}

}  // namespace mesh::agent
