// SharedWatch: one upstream WatchJob stream of the rank relay
// (agent/rank_relay.h) shared by the local ranks of one (job, generation).
//
// The upstream stream is opened with the first local watcher's request and
// token. Its events (WATCHING, then at most one ERROR) go to every local
// watcher, in order; a watcher that arrives later gets what it missed
// (WATCHING, and the ERROR if there was one) at once. After an ERROR each
// local stream ends with OK, as the coordinator's own does. When the upstream
// stream ends otherwise (the coordinator went away, say), every local stream
// ends with its status, and the relay opens a new upstream stream for the
// next watcher. When the last local watcher goes, the upstream stream is
// cancelled.
//
// Thread safety: thread-safe. Lock order: a SharedWatch's mutex before a
// local watcher's. Ownership: shared; the local watchers and the upstream
// reader hold it until their calls end, and delete themselves in OnDone.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::agent {

class LocalWatcher;
class UpstreamWatchReader;

class SharedWatch : public std::enable_shared_from_this<SharedWatch> {
 public:
  // A local WatchJob call's reactor, fed from this watch; null when this
  // watch has ended without an ERROR (the caller makes a new one).
  grpc::ServerWriteReactor<v1::JobEvent>* AddWatcher();
  // Opens the upstream stream on `stub` with `request`, carrying `token`.
  // Called once, after the first AddWatcher.
  void Open(v1::WorkerService::Stub* stub, const v1::WatchJobRequest& request,
            const std::string& token);
  // Ends every local watcher with `status` and cancels the upstream stream.
  void Cancel(const grpc::Status& status = grpc::Status(grpc::StatusCode::ABORTED,
                                                        "the generation ended on this node"));

 private:
  friend class LocalWatcher;
  friend class UpstreamWatchReader;

  void OnUpstreamEvent(const v1::JobEvent& event);
  void OnUpstreamDone(const grpc::Status& status);
  void Remove(LocalWatcher* watcher);

  mutable absl::Mutex mu_;
  bool live_ ABSL_GUARDED_BY(mu_) = false;  // WATCHING came.
  std::optional<v1::JobEvent> error_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
  std::set<LocalWatcher*> watchers_ ABSL_GUARDED_BY(mu_);
  // Until its OnDone.
  UpstreamWatchReader* upstream_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace mesh::agent
