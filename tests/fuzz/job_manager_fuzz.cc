// Fuzz target: JobManager (coordinator/job_manager.h), the logic behind
// every JobService and NodeService handler, over an in-memory JobStore, a
// Coordination and a FakeClock, driven by a sequence of operations decoded
// from the input with FuzzedDataProvider: submit (mostly valid specs,
// sometimes arbitrary wire bytes), cancel, get, list, wait, watch, logs;
// node registration, heartbeats, order streams, worker reports, log
// uploads; workers joining and reporting errors through Coordination (which
// fails generations into the manager); clock advances and Ticks.
//
// Invariants: no crash or sanitizer report; every sink obeys the stream
// rules (Send only before End, End at most once) and every sink nobody
// unwatched has ended after Shutdown; every WaitJob callback runs exactly
// once; an UploadControl is aborted at most once; a job's generation never
// goes back and a terminal job stays terminal.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>
#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/coordination.h"
#include "coordinator/job_manager.h"
#include "coordinator/sqlite_job_store.h"
#include "mesh/v1/job.pb.h"
#include "tests/fuzz/fuzz_check.h"

namespace mesh::coordinator {
namespace {

namespace v1 = ::mesh::v1;

JobManagerOptions Options() {
  JobManagerOptions options;
  options.spec_limits.working_dir_root = "/data";
  options.spec_limits.max_world_size = 16;
  options.node_heartbeat_interval = absl::Seconds(2);
  options.node_heartbeat_timeout = absl::Seconds(15);
  options.kill_grace = absl::Seconds(5);
  options.max_wait = absl::Minutes(1);
  options.log_attach_timeout = absl::Seconds(10);
  options.max_pending_jobs = 4;
  FUZZ_CHECK(ValidateJobManagerOptions(options).ok(), "bad test options");
  return options;
}

bool Terminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

// A sink that checks the stream rules. `on_send` sees every message.
template <typename Message>
class CheckedSink final : public StreamSink<Message> {
 public:
  explicit CheckedSink(std::string what) : what_(std::move(what)) {}
  void Send(const Message& message) override {
    FUZZ_CHECK(!ended_, absl::StrCat(what_, ": Send after End"));
    if (on_send) on_send(message);
  }
  void End(const absl::Status& status) override {
    FUZZ_CHECK(!ended_, absl::StrCat(what_, ": End twice, then with ", status.ToString()));
    ended_ = true;
  }
  bool ended() const { return ended_; }
  const std::string& what() const { return what_; }
  std::function<void(const Message&)> on_send;

 private:
  std::string what_;
  bool ended_ = false;
};

class CheckedUpload final : public UploadControl {
 public:
  void Abort(const absl::Status& status) override {
    FUZZ_CHECK(!aborted_, absl::StrCat("upload aborted twice, then with ", status.ToString()));
    aborted_ = true;
  }

 private:
  bool aborted_ = false;
};

struct Agent {
  std::string session;
};

class Driver {
 public:
  explicit Driver(FuzzedDataProvider& in)
      : in_(in),
        store_(OpenStore(clock_)),
        coordination_(&clock_, CoordinationOptions{}),
        manager_(std::make_unique<JobManager>(&clock_, store_.get(), &coordination_, Options())) {}

  void Run() {
    FUZZ_CHECK(manager_->Recover().ok(), "Recover of an empty store");
    for (int ops = 0; ops < 150 && in_.remaining_bytes() > 0; ++ops) {
      Step();
      CheckJobs();
    }
    shut_down_ = true;
    manager_->Shutdown();
    coordination_.Shutdown();
    // The gRPC layer ends the upload calls that were still open.
    for (auto& [handle, control] : uploads_) manager_->UploadEnded(handle, absl::CancelledError());
    uploads_.clear();
    for (const auto& sink : state_sinks_) CheckEnded(*sink);
    for (const auto& sink : log_sinks_) CheckEnded(*sink);
    for (const auto& sink : order_sinks_) CheckEnded(*sink);
    for (const auto& [what, calls] : waits_) {
      FUZZ_CHECK(*calls == 1, absl::StrCat(what, ": WaitJob callback ran ", *calls, " times"));
    }
    manager_.reset();
  }

 private:
  static std::unique_ptr<JobStore> OpenStore(const Clock& clock) {
    auto store = SqliteJobStore::Open(":memory:", &clock);
    FUZZ_CHECK(store.ok(), store.status().ToString());
    return *std::move(store);
  }

  template <typename Message>
  void CheckEnded(const CheckedSink<Message>& sink) {
    if (unwatched_.count(&sink) != 0) return;
    FUZZ_CHECK(sink.ended(), absl::StrCat(sink.what(), ": not ended after Shutdown"));
  }

  // Generations never go back; terminal states are final.
  void CheckJobs() {
    for (const std::string& id : jobs_) {
      auto job = manager_->GetJob(id);
      FUZZ_CHECK(job.ok(), absl::StrCat("job ", id, " lost: ", job.status().ToString()));
      auto [it, inserted] = seen_.emplace(id, *job);
      if (!inserted) {
        const v1::Job& before = it->second;
        FUZZ_CHECK(job->generation() >= before.generation(),
                   absl::StrCat("job ", id, " went back a generation"));
        if (Terminal(before.state())) {
          FUZZ_CHECK(job->state() == before.state(),
                     absl::StrCat("job ", id, " left ", v1::JobState_Name(before.state())));
        }
        FUZZ_CHECK(job->events_size() >= before.events_size(),
                   absl::StrCat("job ", id, " lost events"));
        it->second = *job;
      }
    }
  }

  std::string PickJob() {
    if (jobs_.empty() || in_.ConsumeIntegralInRange<int>(0, 15) == 0) {
      return in_.PickValueInArray({"job-99", "", "adhoc-1"});
    }
    return jobs_[in_.ConsumeIntegralInRange<size_t>(0, jobs_.size() - 1)];
  }
  std::string PickNode() {
    if (in_.ConsumeIntegralInRange<int>(0, 15) == 0) return in_.ConsumeRandomLengthString(10);
    return in_.PickValueInArray({"n0", "n1", "n2"});
  }
  std::string Session(const std::string& node) {
    auto it = agents_.find(node);
    if (it == agents_.end() || in_.ConsumeIntegralInRange<int>(0, 15) == 0) return "stale";
    return it->second.session;
  }
  int64_t Generation(const std::string& job_id) {
    auto job = manager_->GetJob(job_id);
    const int64_t current = job.ok() ? job->generation() : 0;
    return current + in_.PickValueInArray({0, 0, 0, 0, -1, 1});
  }
  int Rank() {
    return in_.ConsumeIntegralInRange<int>(0, 7) == 0 ? in_.ConsumeIntegralInRange<int>(-1, 9)
                                                      : in_.ConsumeIntegralInRange<int>(0, 3);
  }
  absl::Duration Timeout() {
    return absl::Milliseconds(in_.ConsumeIntegralInRange<int>(-1000, 90'000));
  }

  v1::JobSpec Spec() {
    v1::JobSpec spec;
    if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) {
      (void)spec.ParseFromString(in_.ConsumeRandomLengthString(64));
      return spec;
    }
    spec.set_name("fuzz");
    spec.add_command(in_.ConsumeIntegralInRange<int>(0, 15) == 0 ? "" : "/bin/true");
    if (in_.ConsumeBool()) spec.set_working_dir(in_.PickValueInArray({"/data/a", "/tmp", "/data"}));
    const int min = in_.ConsumeIntegralInRange<int>(0, 3);
    spec.mutable_nodes()->set_min(min);
    spec.mutable_nodes()->set_max(in_.ConsumeBool() ? 0 : in_.ConsumeIntegralInRange<int>(min, 4));
    spec.set_nproc_per_node(in_.ConsumeIntegralInRange<int>(0, 2));
    spec.set_gpus_per_proc(in_.ConsumeIntegralInRange<int>(0, 7) == 0 ? 1 : 0);
    const int dims = in_.ConsumeIntegralInRange<int>(0, 2);
    for (int i = 0; i < dims; ++i) spec.add_mesh_shape(in_.ConsumeIntegralInRange<int>(-1, 2));
    spec.set_max_restarts(in_.ConsumeIntegralInRange<int>(0, 2));
    spec.set_deadline_seconds(in_.ConsumeBool() ? 0 : in_.ConsumeIntegralInRange<int>(1, 60));
    spec.set_idempotency_key(in_.PickValueInArray({"", "", "k1", "k2"}));
    return spec;
  }

  v1::RunningWorker Worker() {
    v1::RunningWorker worker;
    worker.set_job_id(PickJob());
    worker.set_generation(Generation(worker.job_id()));
    worker.set_rank(Rank());
    worker.set_pid(in_.ConsumeIntegralInRange<int>(1, 100));
    worker.set_metrics_port(in_.ConsumeBool() ? 0 : in_.ConsumeIntegralInRange<int>(-1, 70000));
    return worker;
  }

  void Step() {
    switch (in_.ConsumeIntegralInRange<int>(0, 24)) {
      case 0:
      case 1: {
        v1::JobSpec spec = Spec();
        auto submitted = manager_->Submit(std::move(spec), in_.PickValueInArray({"", "alice"}));
        if (submitted.ok()) {
          const std::string& id = submitted->job().id();
          if (std::find(jobs_.begin(), jobs_.end(), id) == jobs_.end()) jobs_.push_back(id);
        }
        return;
      }
      case 2:
        (void)manager_->Cancel(PickJob(), "fuzz cancels");
        return;
      case 3:
        (void)manager_->OwnerOf(PickJob());
        return;
      case 4: {
        v1::ListJobsRequest request;
        const int states = in_.ConsumeIntegralInRange<int>(0, 2);
        for (int i = 0; i < states; ++i)
          request.mutable_states()->Add(in_.ConsumeIntegralInRange<int>(-1, 9));
        if (in_.ConsumeBool()) (*request.mutable_labels())["a"] = "b";
        request.set_page_size(in_.ConsumeIntegralInRange<int>(-1, 3));
        request.set_page_token(in_.ConsumeBool() ? page_token_ : in_.ConsumeRandomLengthString(8));
        auto list = manager_->ListJobs(request);
        if (list.ok()) {
          page_token_ = list->next_page_token();
          if (request.page_size() > 0) {
            FUZZ_CHECK(list->jobs_size() <= request.page_size(), "ListJobs over its page size");
          }
        }
        return;
      }
      case 5: {
        auto calls = std::make_shared<int>(0);
        const std::string job = PickJob();
        waits_.emplace_back(absl::StrCat("WaitJob ", job), calls);
        manager_->WaitJob(job, Timeout(), [this, calls](absl::StatusOr<v1::Job> result) {
          ++*calls;
          if (result.ok()) FUZZ_CHECK(Terminal(result->state()), "WaitJob woke before the end");
          if (shut_down_ && !result.ok()) FUZZ_CHECK(absl::IsUnavailable(result.status()), "");
        });
        return;
      }
      case 6: {
        auto& sink = state_sinks_.emplace_back(
            std::make_unique<CheckedSink<v1::WatchJobStateResponse>>("WatchJobState"));
        auto handle = manager_->WatchJobState(PickJob(), in_.ConsumeBool(), sink.get());
        if (handle.ok()) {
          state_watches_.emplace_back(*handle, sink.get());
        } else {
          FUZZ_CHECK(!sink->ended(), "a refused watch ended its sink");
          unwatched_.insert(sink.get());
        }
        return;
      }
      case 7: {
        if (state_watches_.empty()) return;
        const size_t i = in_.ConsumeIntegralInRange<size_t>(0, state_watches_.size() - 1);
        manager_->UnwatchJobState(state_watches_[i].first);
        unwatched_.insert(state_watches_[i].second);
        state_watches_.erase(state_watches_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
      case 8: {
        v1::GetLogsRequest request;
        request.set_job_id(PickJob());
        const int ranks = in_.ConsumeIntegralInRange<int>(0, 2);
        for (int i = 0; i < ranks; ++i) request.add_ranks(Rank());
        request.set_generation(in_.ConsumeIntegralInRange<int>(-2, 2));
        request.set_tail(in_.ConsumeIntegralInRange<int>(-1, 10));
        request.set_follow(in_.ConsumeBool());
        auto& sink =
            log_sinks_.emplace_back(std::make_unique<CheckedSink<v1::LogChunk>>("GetLogs"));
        auto handle = manager_->StartLogs(request, sink.get());
        if (handle.ok()) {
          log_requests_.emplace_back(*handle, sink.get());
        } else {
          unwatched_.insert(sink.get());
        }
        return;
      }
      case 9: {
        if (log_requests_.empty()) return;
        const size_t i = in_.ConsumeIntegralInRange<size_t>(0, log_requests_.size() - 1);
        manager_->CancelLogs(log_requests_[i].first);
        unwatched_.insert(log_requests_[i].second);
        log_requests_.erase(log_requests_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
      case 10:
      case 11: {
        v1::RegisterNodeRequest request;
        request.set_name(PickNode());
        request.set_address(in_.ConsumeIntegralInRange<int>(0, 15) == 0 ? "" : "127.0.0.1:1");
        request.set_slots(in_.ConsumeIntegralInRange<int>(0, 7) == 0
                              ? in_.ConsumeIntegralInRange<int>(-1, 0)
                              : in_.ConsumeIntegralInRange<int>(1, 4));
        const int gpus = in_.ConsumeIntegralInRange<int>(0, 2);
        for (int i = 0; i < gpus; ++i)
          request.add_gpus()->set_index(in_.ConsumeIntegralInRange<int>(0, 1));
        const int running = in_.ConsumeIntegralInRange<int>(0, 3);
        for (int i = 0; i < running; ++i) *request.add_running() = Worker();
        request.set_metrics_port(in_.ConsumeBool() ? 0 : 9100);
        auto registered = manager_->RegisterNode(request);
        if (registered.ok()) agents_[request.name()].session = registered->session_id();
        return;
      }
      case 12: {
        const std::string node = PickNode();
        (void)manager_->NodeHeartbeat(node, Session(node));
        return;
      }
      case 13: {
        const std::string node = PickNode();
        auto& sink = order_sinks_.emplace_back(
            std::make_unique<CheckedSink<v1::Assignment>>(absl::StrCat("WatchAssignments ", node)));
        sink->on_send = [this](const v1::Assignment& order) {
          if (order.action() == v1::Assignment::ACTION_UPLOAD_LOGS) {
            log_request_ids_.push_back(order.log_request_id());
          }
        };
        auto handle = manager_->WatchAssignments(node, Session(node), sink.get());
        if (handle.ok()) {
          order_watches_.emplace_back(*handle, sink.get());
        } else {
          unwatched_.insert(sink.get());
        }
        return;
      }
      case 14: {
        if (order_watches_.empty()) return;
        const size_t i = in_.ConsumeIntegralInRange<size_t>(0, order_watches_.size() - 1);
        manager_->UnwatchAssignments(order_watches_[i].first);
        unwatched_.insert(order_watches_[i].second);
        order_watches_.erase(order_watches_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
      case 15: {
        v1::ReportWorkersStartedRequest request;
        request.set_name(PickNode());
        request.set_session_id(Session(request.name()));
        request.set_job_id(PickJob());
        request.set_generation(Generation(request.job_id()));
        const int workers = in_.ConsumeIntegralInRange<int>(0, 4);
        for (int i = 0; i < workers; ++i) {
          v1::RunningWorker* worker = request.add_workers();
          *worker = Worker();
          worker->set_job_id(request.job_id());
          worker->set_generation(request.generation());
        }
        (void)manager_->ReportWorkersStarted(request);
        return;
      }
      case 16:
      case 17: {
        v1::ReportWorkerExitRequest request;
        request.set_name(PickNode());
        request.set_session_id(Session(request.name()));
        request.set_job_id(PickJob());
        request.set_generation(Generation(request.job_id()));
        request.set_rank(Rank());
        switch (in_.ConsumeIntegralInRange<int>(0, 4)) {
          case 0:
            request.set_exit_code(in_.ConsumeIntegralInRange<int>(1, 255));
            break;
          case 1:
            request.set_signal(in_.ConsumeIntegralInRange<int>(1, 64));
            break;
          case 2:
            request.set_launch_error("exec failed");
            break;
          case 3:
            break;  // No termination at all.
          default:
            request.set_exit_code(0);
            break;
        }
        request.set_time_unix_ms(in_.ConsumeIntegral<int64_t>());
        (void)manager_->ReportWorkerExit(request);
        return;
      }
      case 18: {
        const std::string node = PickNode();
        std::string id = "nope";
        if (!log_request_ids_.empty() && in_.ConsumeIntegralInRange<int>(0, 7) != 0) {
          id = log_request_ids_[in_.ConsumeIntegralInRange<size_t>(0, log_request_ids_.size() - 1)];
        }
        auto control = std::make_unique<CheckedUpload>();
        auto upload = manager_->AttachUpload(node, Session(node), id, control.get());
        if (upload.ok()) uploads_.emplace(*upload, std::move(control));
        return;
      }
      case 19: {
        if (uploads_.empty()) return;
        auto it = uploads_.begin();
        std::advance(it, in_.ConsumeIntegralInRange<size_t>(0, uploads_.size() - 1));
        if (in_.ConsumeIntegralInRange<int>(0, 3) == 0) {
          manager_->UploadEnded(
              it->first, in_.ConsumeBool() ? absl::OkStatus() : absl::CancelledError("gone"));
          ended_uploads_.push_back(std::move(it->second));  // Kept: the manager may hold it.
          uploads_.erase(it);
          return;
        }
        v1::LogChunk chunk;
        chunk.set_rank(Rank());
        chunk.set_generation(in_.ConsumeIntegralInRange<int>(-1, 2));
        chunk.set_stream(in_.ConsumeBool() ? v1::LogChunk::STREAM_STDOUT
                                           : v1::LogChunk::STREAM_STDERR);
        chunk.set_data(in_.ConsumeRandomLengthString(16));
        chunk.set_offset(in_.ConsumeIntegralInRange<int>(-1, 100));
        chunk.set_eof(in_.ConsumeBool());
        chunk.set_missing(in_.ConsumeIntegralInRange<int>(0, 7) == 0);
        (void)manager_->UploadChunk(it->first, chunk);
        return;
      }
      case 20:
      case 21: {
        // A worker of a placed job, through Coordination.
        const std::string job_id = PickJob();
        auto job = coordination_.GetJob(job_id);
        Caller caller;
        caller.job_id = job_id;
        caller.generation = job.ok() ? job->generation : 0;
        caller.rank = Rank();
        caller.incarnation = 1;
        if (in_.ConsumeBool()) {
          JoinArgs args;
          args.caller = caller;
          args.host = "h";
          args.timeout = Timeout();
          coordination_.Join(std::move(args), [](absl::StatusOr<JoinResult>) {});
        } else {
          (void)coordination_.ReportError(caller, "worker says no");
        }
        return;
      }
      case 22:
        (void)manager_->ListNodes();
        return;
      default:
        clock_.Advance(absl::Milliseconds(in_.ConsumeIntegralInRange<int>(0, 20'000)));
        coordination_.Tick();
        manager_->Tick();
        return;
    }
  }

  FuzzedDataProvider& in_;
  FakeClock clock_;
  bool shut_down_ = false;
  // Sinks and controls outlive the manager (declared before it).
  std::vector<std::unique_ptr<CheckedSink<v1::WatchJobStateResponse>>> state_sinks_;
  std::vector<std::unique_ptr<CheckedSink<v1::LogChunk>>> log_sinks_;
  std::vector<std::unique_ptr<CheckedSink<v1::Assignment>>> order_sinks_;
  std::set<const void*> unwatched_;
  std::map<uint64_t, std::unique_ptr<CheckedUpload>> uploads_;
  std::vector<std::unique_ptr<CheckedUpload>> ended_uploads_;
  std::vector<std::pair<std::string, std::shared_ptr<int>>> waits_;
  std::unique_ptr<JobStore> store_;
  Coordination coordination_;
  std::unique_ptr<JobManager> manager_;

  std::vector<std::string> jobs_;
  std::map<std::string, v1::Job> seen_;
  std::map<std::string, Agent> agents_;
  std::vector<std::pair<uint64_t, CheckedSink<v1::WatchJobStateResponse>*>> state_watches_;
  std::vector<std::pair<uint64_t, CheckedSink<v1::LogChunk>*>> log_requests_;
  std::vector<std::pair<uint64_t, CheckedSink<v1::Assignment>*>> order_watches_;
  std::vector<std::string> log_request_ids_;
  std::string page_token_;
};

}  // namespace
}  // namespace mesh::coordinator

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Logging would cost most of the time of a run, and say nothing.
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  FuzzedDataProvider in(data, size);
  mesh::coordinator::Driver driver(in);
  driver.Run();
  return 0;
}
