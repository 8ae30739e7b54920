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
// SharedWatch (which clears its pointer under its mutex, so Cancel never
// reaches a deleted reader).
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
    shared_->OnUpstreamEvent(event_);
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& status) override {
    shared_->OnUpstreamDone(status);
    delete this;
  }

 private:
  const std::shared_ptr<SharedWatch> shared_;
  grpc::ClientContext context_;
  const v1::WatchJobRequest request_;
  v1::JobEvent event_;
};

grpc::ServerWriteReactor<v1::JobEvent>* SharedWatch::AddWatcher() {
  absl::MutexLock lock(&mu_);
  if (end_.has_value() && !error_.has_value()) return nullptr;
  auto* watcher = new LocalWatcher(shared_from_this());
  v1::JobEvent watching;
  watching.set_kind(v1::JobEvent::WATCHING);
  if (error_.has_value()) {
    watcher->Push(watching);
    watcher->Push(*error_);
    watcher->End(grpc::Status::OK);
  } else {
    if (live_) watcher->Push(watching);
    watchers_.insert(watcher);
  }
  return watcher;
}

void SharedWatch::Open(v1::WorkerService::Stub* stub, const v1::WatchJobRequest& request,
                       const std::string& token) {
  auto* reader = new UpstreamWatchReader(shared_from_this(), request, token);
  {
    absl::MutexLock lock(&mu_);
    if (!end_.has_value() && watchers_.empty()) {
      // Its watcher left before the stream started: nothing to open it for.
      end_ = grpc::Status(grpc::StatusCode::CANCELLED, "no local watcher is left");
    }
    if (end_.has_value()) {
      delete reader;
      return;
    }
    upstream_ = reader;
  }
  reader->Start(stub);
}

void SharedWatch::Cancel(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!end_.has_value()) end_ = status;
  for (LocalWatcher* watcher : watchers_) watcher->End(status);
  watchers_.clear();
  if (upstream_ != nullptr) upstream_->Cancel();
}

void SharedWatch::OnUpstreamEvent(const v1::JobEvent& event) {
  absl::MutexLock lock(&mu_);
  if (event.kind() == v1::JobEvent::WATCHING) {
    if (live_) return;
    live_ = true;
    for (LocalWatcher* watcher : watchers_) watcher->Push(event);
    return;
  }
  if (event.kind() == v1::JobEvent::ERROR && !error_.has_value()) {
    error_ = event;
    for (LocalWatcher* watcher : watchers_) {
      watcher->Push(event);
      watcher->End(grpc::Status::OK);
    }
    watchers_.clear();
  }
}

void SharedWatch::OnUpstreamDone(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  upstream_ = nullptr;
  if (!end_.has_value()) end_ = status;
  for (LocalWatcher* watcher : watchers_) watcher->End(*end_);
  watchers_.clear();
}

void SharedWatch::Remove(LocalWatcher* watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watcher);
  if (watchers_.empty() && upstream_ != nullptr && !error_.has_value()) {
    end_ = grpc::Status(grpc::StatusCode::CANCELLED, "no local watcher is left");
    upstream_->Cancel();
  }
}

}  // namespace mesh::agent
