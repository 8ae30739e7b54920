#include "agent/relay_watch.h"

#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mesh::agent {

// One local WatchJob call. Writes the events it is given one at a time,
// then finishes with the status it was ended with. It leaves the
// SharedWatch's set before it finishes, so the SharedWatch never touches a
// finished (possibly deleted) watcher.
class LocalWatcher final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  explicit LocalWatcher(std::shared_ptr<SharedWatch> shared) : shared_(std::move(shared)) {}

  // Called by the SharedWatch under its mutex.
  void Push(const v1::JobEvent& event) {
    absl::MutexLock lock(&mu_);
    if (end_.has_value()) return;
    queue_.push_back(event);
    StepLocked();
  }
  // Called by the SharedWatch, which has removed this watcher already.
  void End(const grpc::Status& status) {
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (end_.has_value()) return;
      end_ = status;
      finish = StepLocked();
    }
    if (finish) Finish(*end_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Gone();
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      finish = StepLocked();
    }
    if (finish) Finish(*end_);
  }

  void OnCancel() override { Gone(); }
  void OnDone() override { delete this; }

 private:
  // The rank went away: leave the SharedWatch, then finish.
  void Gone() {
    shared_->Remove(this);
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      queue_.clear();
      if (!end_.has_value()) end_ = grpc::Status(grpc::StatusCode::CANCELLED, "");
      writing_ = false;
      finish = StepLocked();
    }
    if (finish) Finish(*end_);
  }

  // Starts the next write; true when the call should now finish.
  bool StepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_) return false;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      StartWrite(&current_);
      return false;
    }
    if (!end_.has_value()) return false;
    finished_ = true;
    return true;
  }

  const std::shared_ptr<SharedWatch> shared_;
  absl::Mutex mu_;
  std::deque<v1::JobEvent> queue_ ABSL_GUARDED_BY(mu_);
  v1::JobEvent current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
};

// The upstream WatchJob call. Deletes itself in OnDone, after telling the
// SharedWatch (which lets go of it under its mutex, so Cancel never reaches
// a deleted reader).
class UpstreamWatchReader final : public grpc::ClientReadReactor<v1::JobEvent> {
 public:
  UpstreamWatchReader(std::shared_ptr<SharedWatch> shared, const v1::WatchJobRequest& request,
                      const std::string& token)
      : shared_(std::move(shared)), request_(request) {
    if (!token.empty()) context_.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  }

  void Start(v1::WorkerService::Stub* stub) {
    stub->async()->WatchJob(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }

  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status.
    shared_->OnUpstreamEvent(this, event_);
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& status) override {
    shared_->OnUpstreamDone(this, status);
    delete this;
  }

 private:
  const std::shared_ptr<SharedWatch> shared_;
  grpc::ClientContext context_;
  const v1::WatchJobRequest request_;
  v1::JobEvent event_;
};

namespace {

v1::JobEvent WatchingEvent() {
  v1::JobEvent watching;
  watching.set_kind(v1::JobEvent::WATCHING);
  return watching;
}

// An end of the opener's stream that speaks for the opener's process only
// (see relay_watch.h): it is lost or fenced out, or has not joined.
bool OpenerOwnEnd(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::ABORTED ||
         status.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
}

}  // namespace

SharedWatch::SharedWatch(v1::WorkerService::Stub* stub, std::function<void()> on_reopen)
    : stub_(stub), on_reopen_(std::move(on_reopen)) {}

grpc::ServerWriteReactor<v1::JobEvent>* SharedWatch::AddWatcher(const v1::WatchJobRequest& request,
                                                                const std::string& token) {
  absl::MutexLock lock(&mu_);
  if (end_.has_value() && !error_.has_value()) return nullptr;
  auto* watcher = new LocalWatcher(shared_from_this());
  if (error_.has_value()) {
    watcher->Push(WatchingEvent());
    watcher->Push(*error_);
    watcher->End(grpc::Status::OK);
  } else {
    if (live_) watcher->Push(WatchingEvent());
    watchers_.emplace(watcher, Watcher{request, token});
  }
  return watcher;
}

void SharedWatch::Open() {
  UpstreamWatchReader* reader = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (end_.has_value()) return;
    // Its watcher may have left before the stream started: then nothing is
    // opened, and the watch ends.
    reader = NextReaderLocked(/*avoid_rank=*/-1);
  }
  if (reader != nullptr) StartReader(reader);
}

UpstreamWatchReader* SharedWatch::NextReaderLocked(int avoid_rank) {
  if (watchers_.empty()) {
    if (!end_.has_value()) {
      end_ = grpc::Status(grpc::StatusCode::CANCELLED, "no local watcher is left");
    }
    return nullptr;
  }
  const Watcher* chosen = &watchers_.begin()->second;
  for (const auto& [local, watcher] : watchers_) {
    if (watcher.request.context().rank() != avoid_rank) {
      chosen = &watcher;
      break;
    }
  }
  if (opened_++ > 0 && on_reopen_) on_reopen_();
  opener_ = chosen->request.context();
  upstream_ = new UpstreamWatchReader(shared_from_this(), chosen->request, chosen->token);
  ++starting_;
  return upstream_;
}

void SharedWatch::StartReader(UpstreamWatchReader* reader) {
  // Not under mu_: the call's reactions take it. A Cancel meanwhile cancels
  // the reader's context first, which gRPC applies when the call starts.
  reader->Start(stub_);
  absl::MutexLock lock(&mu_);
  --starting_;
}

void SharedWatch::EndProcessLocked(const v1::RankContext& process, const v1::JobEvent* error,
                                   const grpc::Status& status) {
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    const v1::RankContext& context = it->second.request.context();
    if (context.rank() != process.rank() || context.incarnation() != process.incarnation()) {
      ++it;
      continue;
    }
    LocalWatcher* watcher = it->first;
    it = watchers_.erase(it);
    if (error != nullptr) {
      watcher->Push(*error);
      watcher->End(grpc::Status::OK);
    } else {
      watcher->End(status);
    }
  }
}

void SharedWatch::Cancel(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!end_.has_value()) end_ = status;
  for (auto& [watcher, unused] : watchers_) watcher->End(status);
  watchers_.clear();
  if (upstream_ != nullptr) upstream_->Cancel();
  // With end_ set no reader is made any more; wait out those being started,
  // which use the stub (a call's start does not wait on the server).
  auto started = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return starting_ == 0; };
  mu_.Await(absl::Condition(&started));
}

void SharedWatch::OnUpstreamEvent(UpstreamWatchReader* reader, const v1::JobEvent& event) {
  UpstreamWatchReader* next = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (reader != upstream_) return;
    if (event.kind() == v1::JobEvent::WATCHING) {
      // A stream opened again for the others: they have had theirs.
      if (live_) return;
      live_ = true;
      for (auto& [watcher, unused] : watchers_) watcher->Push(event);
      return;
    }
    if (event.kind() != v1::JobEvent::ERROR || error_.has_value()) return;
    if (event.error().rank() == opener_.rank()) {
      // Perhaps the opener's own loss (in-place recovery), perhaps the
      // generation's failure: its process hears it, and a stream in
      // another's name tells the others which.
      EndProcessLocked(opener_, &event, grpc::Status::OK);
      upstream_->Cancel();  // Its OnDone is ignored from now on.
      upstream_ = nullptr;
      if (!end_.has_value()) next = NextReaderLocked(event.error().rank());
    } else {
      error_ = event;
      for (auto& [watcher, unused] : watchers_) {
        watcher->Push(event);
        watcher->End(grpc::Status::OK);
      }
      watchers_.clear();
    }
  }
  if (next != nullptr) StartReader(next);
}

void SharedWatch::OnUpstreamDone(UpstreamWatchReader* reader, const grpc::Status& status) {
  UpstreamWatchReader* next = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (reader != upstream_) return;
    upstream_ = nullptr;
    if (!end_.has_value() && !error_.has_value() && OpenerOwnEnd(status)) {
      EndProcessLocked(opener_, nullptr, status);
      next = NextReaderLocked(opener_.rank());
    } else {
      if (!end_.has_value()) end_ = status;
      for (auto& [watcher, unused] : watchers_) watcher->End(*end_);
      watchers_.clear();
    }
  }
  if (next != nullptr) StartReader(next);
}

void SharedWatch::EndProcess(const v1::RankContext& process, const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  if (end_.has_value() || error_.has_value()) return;
  EndProcessLocked(process, nullptr, status);
  CancelIfUnwatchedLocked();
}

void SharedWatch::Remove(LocalWatcher* watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watcher);
  CancelIfUnwatchedLocked();
}

void SharedWatch::CancelIfUnwatchedLocked() {
  if (watchers_.empty() && upstream_ != nullptr && !error_.has_value()) {
    end_ = grpc::Status(grpc::StatusCode::CANCELLED, "no local watcher is left");
    upstream_->Cancel();
  }
}

}  // namespace mesh::agent
