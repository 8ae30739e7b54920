// SharedWatch: one upstream WatchJob stream of the rank relay
// (agent/rank_relay.h) shared by the local ranks of one (job, generation).
//
// The upstream stream is opened in the name of one local watcher, the
// *opener*: with its request and token. Its events (WATCHING, then at most
// one ERROR) go to every local watcher, in order; a watcher that arrives
// later gets what it missed (WATCHING, and the ERROR if there was one) at
// once. After an ERROR each local stream ends with OK, as the coordinator's
// own does. When the upstream stream ends otherwise (the coordinator went
// away, say), every local stream ends with its status, and the relay opens a
// new upstream stream for the next watcher. When the last local watcher
// goes, the upstream stream is cancelled.
//
// The opener's own answers. Most of what the coordinator tells a watch is
// the generation's, but not all of it: with in-place recovery a lost rank's
// watch gets an ERROR naming that rank while the generation carries on, and
// a process that is lost or fenced out (a newer process joined as its rank)
// gets ABORTED. So an ERROR naming the opener's rank, and an end with
// ABORTED or FAILED_PRECONDITION, reach only the watchers of the opener's
// process (its rank and incarnation); the stream is opened again at once in
// the name of another watcher, of another rank where there is one, whose
// answer tells the others whether the generation itself failed (then they
// get the coordinator's ERROR too). Each such step ends at least one
// process's watchers, so a failure costs at most one stream per local
// process. The others keep their stream: they see no second WATCHING. A
// lost or fenced-out process that is not the opener hears it from the relay
// (EndProcess), which ends its watchers with the ABORTED the coordinator
// gave the process's heartbeat.
//
//   opened ──WATCHING──▶ live ──ERROR (generation's)──▶ ended, OK
//      │                  │ ▲
//      │                  │ └── the opener's own ERROR or end: its watchers
//      │                  │     end; opened again for the others
//      └──────────────────┴──── other end, or Cancel, or no watcher left:
//                               ended with that status
//
// Thread safety: thread-safe. Lock order: the relay's mutex, then a
// SharedWatch's, then a local watcher's. Ownership: shared; the local
// watchers and the upstream readers hold it until their calls end, and
// delete themselves in OnDone.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
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
  // `stub`: the coordinator replica to watch on; borrowed, it must stay
  // valid until Cancel has returned (the relay cancels every watch it made
  // before its stubs go). `on_reopen` runs each time the stream is opened
  // again for the others (see above), under this watch's mutex, so it must
  // take no lock ordered before it; it never runs after Cancel has begun.
  SharedWatch(v1::WorkerService::Stub* stub, std::function<void()> on_reopen);

  // A local WatchJob call's reactor for `request`, whose call carried
  // `token`, fed from this watch; null when this watch has ended without an
  // ERROR (the caller makes a new one).
  grpc::ServerWriteReactor<v1::JobEvent>* AddWatcher(const v1::WatchJobRequest& request,
                                                     const std::string& token);
  // Opens the upstream stream in the name of a watcher. Called once, after
  // the first AddWatcher.
  void Open();
  // Ends the local watchers of `process` (its rank and incarnation) with
  // `status`: the coordinator refused the process's other calls (it is lost,
  // or fenced out), as it would refuse its watch. The stream goes on for the
  // other watchers.
  void EndProcess(const v1::RankContext& process, const grpc::Status& status);
  // Ends every local watcher with `status` and cancels the upstream stream;
  // returns once no stream is being started (none is started from then
  // on), so the stub is no longer used. Idempotent.
  void Cancel(const grpc::Status& status = grpc::Status(grpc::StatusCode::ABORTED,
                                                        "the generation ended on this node"));

 private:
  friend class LocalWatcher;
  friend class UpstreamWatchReader;

  // A local watcher's request and the token its call carried.
  struct Watcher {
    v1::WatchJobRequest request;
    std::string token;
  };

  // `reader`'s events and end; those of a reader that is no longer the
  // watch's (it spoke for an opener whose own answer came) are ignored.
  void OnUpstreamEvent(UpstreamWatchReader* reader, const v1::JobEvent& event);
  void OnUpstreamDone(UpstreamWatchReader* reader, const grpc::Status& status);
  void Remove(LocalWatcher* watcher);

  // Makes the reader of a new upstream stream in the name of a watcher (of
  // a rank other than `avoid_rank` where there is one) and makes it the
  // watch's; start it with StartReader after letting go of mu_. Null, and
  // the watch ended, when no watcher is left.
  UpstreamWatchReader* NextReaderLocked(int avoid_rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartReader(UpstreamWatchReader* reader) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the watchers of `process`: with `error` then OK, or with `status`.
  void EndProcessLocked(const v1::RankContext& process, const v1::JobEvent* error,
                        const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With no local watcher left the upstream stream is not needed.
  void CancelIfUnwatchedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  v1::WorkerService::Stub* const stub_;
  const std::function<void()> on_reopen_;

  mutable absl::Mutex mu_;
  bool live_ ABSL_GUARDED_BY(mu_) = false;  // WATCHING came.
  std::optional<v1::JobEvent> error_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
  std::map<LocalWatcher*, Watcher> watchers_ ABSL_GUARDED_BY(mu_);
  // The current upstream stream, until its OnDone, and whose it is.
  UpstreamWatchReader* upstream_ ABSL_GUARDED_BY(mu_) = nullptr;
  v1::RankContext opener_ ABSL_GUARDED_BY(mu_);
  int64_t opened_ ABSL_GUARDED_BY(mu_) = 0;  // Upstream streams opened.
  int starting_ ABSL_GUARDED_BY(mu_) = 0;    // Readers made, not yet started.
};

}  // namespace mesh::agent
