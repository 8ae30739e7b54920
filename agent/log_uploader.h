// LogUploader: serves the coordinator's UPLOAD_LOGS orders. Each upload
// runs on its own thread and streams the selected ranks' log files
// (agent/job_paths.h) to NodeService.UploadLogs: the header first, then
// chunks of at most 64 KiB read round-robin across the ranks (so a follow
// shows all ranks as they write), then one EOF chunk per rank (`missing`
// for a rank with no log). Without follow, each rank's log is sent as it
// was at open; with follow, a rank's upload ends once the rank has exited
// and its log is read to the end. A followed upload with nothing to send
// writes an empty message every 5 s to learn whether the coordinator has
// ended the call.
//
// Ranks: those of the order, or when it lists none, every rank of the
// generation the agent knows plus every rank-<r>.log in the generation's
// directory (logs outlive the agent's memory of a generation).
//
// At most AgentConfig.max_uploads run at once; more are refused (logged).
// Errors are logged, never returned: an upload that fails ends early.
//
// Thread safety: thread-safe. Ownership: config, client and workers are
// borrowed and must outlive the uploader; `session_id` is called from the
// upload threads.
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_config.h"
#include "agent/node_client.h"
#include "agent/order_applier.h"
#include "mesh/v1/job.pb.h"

namespace mesh::agent {

class LogUploader {
 public:
  LogUploader(const AgentConfig* config, NodeClient* client, const OrderApplier* workers,
              std::function<std::string()> session_id);
  // Calls Stop().
  ~LogUploader();

  LogUploader(const LogUploader&) = delete;
  LogUploader& operator=(const LogUploader&) = delete;

  // Starts serving `order` (ACTION_UPLOAD_LOGS) on a thread of its own and
  // returns at once; refuses it (logged) when max_uploads already run or
  // after Stop.
  void Start(const v1::Assignment& order);
  // Ends every upload (each stops at its next chunk or poll; calls in
  // flight are the client's to cancel) and waits for their threads.
  // Idempotent.
  void Stop();

 private:
  struct Upload {
    std::thread thread;
    bool done = false;  // guarded by mu_
  };

  void Run(const v1::Assignment& order);
  bool stopping() const;
  // Sleeps up to `duration`; returns false when stopping.
  bool SleepUnlessStopping(absl::Duration duration);

  const AgentConfig& config_;
  NodeClient* const client_;
  const OrderApplier* const workers_;
  const std::function<std::string()> session_id_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::unique_ptr<Upload>> uploads_ ABSL_GUARDED_BY(mu_);
  int active_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mesh::agent
