// FakeJobService: an in-process mesh.v1.JobService for meshctl tests, served
// on 127.0.0.1:0. It records every request and answers from scripts the test
// sets up before running a command:
//   - SubmitJob: `submit_response` or `submit_error`;
//   - GetJob: a queue of jobs per id; each call takes the front one, and the
//     last one stays (so "RUNNING, then SUCCEEDED forever" is two entries);
//   - ListJobs: one page per page token;
//   - CancelJob: the job with state CANCELLED (or `cancel_result`);
//   - WaitJob: `wait_result`, or DEADLINE_EXCEEDED after the request's
//     timeout capped at `wait_hold_cap` (a server's maximum wait);
//   - WatchJobState: `watch_events`, then OK;
//   - GetLogs: one LogScript per call, in order (chunks, then `end`, or held
//     open until the client cancels); with no script left, ends at once OK.
//   - ListNodes: `nodes`.
// Thread safety: every member is guarded by mu_; tests set scripts through
// Lock() while no command runs, and read records after it returns.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mesh/v1/job.grpc.pb.h"

namespace mesh::cli::testing {

struct LogScript {
  std::vector<mesh::v1::LogChunk> chunks;
  grpc::Status end = grpc::Status::OK;
  // Keep the stream open after the chunks until the client cancels it.
  bool hold_open = false;
};

struct FakeJobState {
  // Scripts.
  std::optional<mesh::v1::SubmitJobResponse> submit_response;
  grpc::Status submit_error = grpc::Status::OK;
  std::map<std::string, std::deque<mesh::v1::Job>> jobs;
  std::map<std::string, mesh::v1::ListJobsResponse> pages;  // By page token.
  std::optional<mesh::v1::Job> cancel_result;
  std::optional<mesh::v1::Job> wait_result;
  absl::Duration wait_hold_cap = absl::Seconds(5);
  std::vector<mesh::v1::WatchJobStateResponse> watch_events;
  std::deque<LogScript> log_scripts;
  mesh::v1::ListNodesResponse nodes;

  // Records.
  std::vector<mesh::v1::SubmitJobRequest> submits;
  std::vector<mesh::v1::ListJobsRequest> lists;
  std::vector<mesh::v1::CancelJobRequest> cancels;
  std::vector<mesh::v1::WaitJobRequest> waits;
  std::vector<mesh::v1::WatchJobStateRequest> watches;
  std::vector<mesh::v1::GetLogsRequest> log_requests;
  int get_job_calls = 0;
};

class FakeJobService final : public mesh::v1::JobService::CallbackService {
 public:
  ~FakeJobService() override {
    BeginShutdown();
    for (auto& thread : threads_) thread.join();
  }

  // Ends held WaitJob calls now (before the server shuts down, which waits
  // for every call to finish).
  void BeginShutdown() {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }

  // Scripts and records, under the service's lock.
  class Locked {
   public:
    explicit Locked(FakeJobService& service) : lock_(&service.mu_), state_(service.state_) {}
    FakeJobState* operator->() { return &state_; }

   private:
    absl::MutexLock lock_;
    FakeJobState& state_;
  };
  Locked Lock() { return Locked(*this); }

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const mesh::v1::SubmitJobRequest* request,
                                      mesh::v1::SubmitJobResponse* response) override {
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      state_.submits.push_back(*request);
      if (!state_.submit_error.ok()) {
        status = state_.submit_error;
      } else if (state_.submit_response) {
        *response = *state_.submit_response;
      } else {
        status = grpc::Status(grpc::StatusCode::INTERNAL, "fake: no submit response scripted");
      }
    }
    return Done(context, status);
  }

  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const mesh::v1::GetJobRequest* request,
                                   mesh::v1::GetJobResponse* response) override {
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      ++state_.get_job_calls;
      auto it = state_.jobs.find(request->job_id());
      if (it == state_.jobs.end() || it->second.empty()) {
        status =
            grpc::Status(grpc::StatusCode::NOT_FOUND, "job " + request->job_id() + " not found");
      } else {
        *response->mutable_job() = it->second.front();
        if (it->second.size() > 1) it->second.pop_front();
      }
    }
    return Done(context, status);
  }

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const mesh::v1::ListJobsRequest* request,
                                     mesh::v1::ListJobsResponse* response) override {
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      state_.lists.push_back(*request);
      auto it = state_.pages.find(request->page_token());
      if (it == state_.pages.end()) {
        status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad page token");
      } else {
        *response = it->second;
      }
    }
    return Done(context, status);
  }

  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const mesh::v1::CancelJobRequest* request,
                                      mesh::v1::CancelJobResponse* response) override {
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      state_.cancels.push_back(*request);
      if (state_.cancel_result) {
        *response->mutable_job() = *state_.cancel_result;
      } else {
        response->mutable_job()->set_id(request->job_id());
        response->mutable_job()->set_state(mesh::v1::JOB_STATE_CANCELLED);
      }
    }
    return Done(context, status);
  }

  grpc::ServerUnaryReactor* WaitJob(grpc::CallbackServerContext* context,
                                    const mesh::v1::WaitJobRequest* request,
                                    mesh::v1::WaitJobResponse* response) override {
    absl::MutexLock lock(&mu_);
    state_.waits.push_back(*request);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (state_.wait_result) {
      *response->mutable_job() = *state_.wait_result;
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }
    // Hold the call as a server would, on a thread of its own so no gRPC
    // callback thread blocks; shutdown ends the hold early.
    const absl::Duration hold =
        std::min(absl::Seconds(request->timeout_seconds()), state_.wait_hold_cap);
    threads_.emplace_back([this, reactor, hold] {
      {
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&shutting_down_), hold);
      }
      reactor->Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "fake: still running"));
    });
    return reactor;
  }

  grpc::ServerWriteReactor<mesh::v1::WatchJobStateResponse>* WatchJobState(
      grpc::CallbackServerContext*, const mesh::v1::WatchJobStateRequest* request) override {
    absl::MutexLock lock(&mu_);
    state_.watches.push_back(*request);
    return new Writer<mesh::v1::WatchJobStateResponse>(state_.watch_events, grpc::Status::OK,
                                                       false);
  }

  grpc::ServerWriteReactor<mesh::v1::LogChunk>* GetLogs(
      grpc::CallbackServerContext*, const mesh::v1::GetLogsRequest* request) override {
    absl::MutexLock lock(&mu_);
    state_.log_requests.push_back(*request);
    LogScript script;
    if (!state_.log_scripts.empty()) {
      script = std::move(state_.log_scripts.front());
      state_.log_scripts.pop_front();
    }
    return new Writer<mesh::v1::LogChunk>(std::move(script.chunks), script.end, script.hold_open);
  }

  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* context,
                                      const mesh::v1::ListNodesRequest*,
                                      mesh::v1::ListNodesResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      *response = state_.nodes;
    }
    return Done(context, grpc::Status::OK);
  }

 private:
  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context,
                                        const grpc::Status& status) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }

  // Writes `messages` one at a time, then finishes with `end` (or waits for
  // the client to cancel when `hold_open`). Deletes itself in OnDone.
  template <typename Message>
  class Writer final : public grpc::ServerWriteReactor<Message> {
   public:
    Writer(std::vector<Message> messages, grpc::Status end, bool hold_open)
        : messages_(std::move(messages)), end_(std::move(end)), hold_open_(hold_open) {
      absl::MutexLock lock(&mu_);
      NextLocked();
    }
    void OnWriteDone(bool ok) override {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
        return;
      }
      NextLocked();
    }
    void OnCancel() override {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      if (!writing_) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    }
    void OnDone() override { delete this; }

   private:
    void NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (cancelled_) {
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      } else if (next_ < messages_.size()) {
        writing_ = true;
        this->StartWrite(&messages_[next_++]);
      } else if (!hold_open_) {
        FinishLocked(end_);
      }
    }
    void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (finished_) return;
      finished_ = true;
      this->Finish(status);
    }

    absl::Mutex mu_;
    std::vector<Message> messages_;
    size_t next_ ABSL_GUARDED_BY(mu_) = 0;
    const grpc::Status end_;
    const bool hold_open_;
    bool writing_ ABSL_GUARDED_BY(mu_) = false;
    bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;
  };

  absl::Mutex mu_;
  FakeJobState state_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // WaitJob holds; joined in the destructor.
};

// The fake on 127.0.0.1:<port picked by the OS>. Shuts down in the
// destructor; held WaitJob calls end at once.
class FakeJobServer {
 public:
  FakeJobServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~FakeJobServer() { Stop(); }

  void Stop() {
    if (server_ == nullptr) return;
    service_.BeginShutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }

  bool ok() const { return server_ != nullptr && port_ > 0; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  FakeJobService& service() { return service_; }

 private:
  FakeJobService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace mesh::cli::testing
