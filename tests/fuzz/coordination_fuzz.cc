// Fuzz target: Coordination (coordinator/coordination.h), the logic behind
// every WorkerService and AdminService job handler, driven by a sequence of
// operations decoded from the input with FuzzedDataProvider: jobs created,
// removed and bumped; Join; every KV operation, waiting or not; barriers;
// unique IDs; heartbeats, errors, leaves, watches; clock advances and Ticks.
// Callers are mostly well-formed (a known job, its current generation, a
// rank in range) and sometimes not, so both the fencing and the logic
// behind it are reached. Limits are tiny so that inputs reach them.
//
// Invariants: no crash or sanitizer report; every callback runs exactly
// once by the end (after Shutdown), except a watch that Unwatch dropped,
// which never runs; a result is never delivered after Shutdown with OK.
// Some callbacks call back into Coordination, as the contract allows.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>
#include <spdlog/spdlog.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/coordination.h"
#include "tests/fuzz/fuzz_check.h"

namespace mesh::coordinator {
namespace {

constexpr size_t kMaxKeyBytes = 8;

CoordinationOptions Options() {
  CoordinationOptions options;
  options.heartbeat_interval = absl::Seconds(1);
  options.heartbeat_timeout = absl::Seconds(3);
  options.default_wait = absl::Seconds(5);
  options.max_wait = absl::Seconds(20);
  options.kv.max_key_bytes = kMaxKeyBytes;
  options.kv.max_value_bytes = 16;
  options.kv.max_total_bytes = 128;
  options.kv.max_keys = 8;
  options.max_barriers = 4;
  options.max_unique_ids = 4;
  options.max_keys_per_request = 4;
  FUZZ_CHECK(ValidateOptions(options).ok(), "bad test options");
  return options;
}

// Counts the calls of every callback handed out.
class Tracker {
 public:
  struct Entry {
    std::string what;
    int calls = 0;
    bool dropped = false;  // An Unwatch that returned true.
  };

  size_t Add(std::string what) {
    entries_.push_back(Entry{std::move(what)});
    return entries_.size() - 1;
  }
  void Called(size_t id) {
    Entry& entry = entries_[id];
    ++entry.calls;
    FUZZ_CHECK(entry.calls == 1,
               absl::StrCat(entry.what, ": callback ran ", entry.calls, " times"));
    FUZZ_CHECK(!entry.dropped, absl::StrCat(entry.what, ": ran after Unwatch dropped it"));
  }
  void Dropped(size_t id) { entries_[id].dropped = true; }
  void CheckAllCalledOnce() const {
    for (const Entry& entry : entries_) {
      if (entry.dropped) {
        FUZZ_CHECK(entry.calls == 0, absl::StrCat(entry.what, ": dropped watch ran"));
      } else {
        FUZZ_CHECK(entry.calls == 1,
                   absl::StrCat(entry.what, ": callback ran ", entry.calls, " times, not once"));
      }
    }
  }

 private:
  std::vector<Entry> entries_;
};

class Driver {
 public:
  explicit Driver(FuzzedDataProvider& in) : in_(in), coordination_(&clock_, Options()) {
    coordination_.SetFailureListener([this](const std::string& job_id, const JobError& error) {
      FUZZ_CHECK(!job_id.empty(), "failure of an unnamed job");
      FUZZ_CHECK(!error.message.empty(), "failure without a message");
      ++failures_;
    });
    JobLayout layout;
    layout.job_id = "j0";
    layout.world_size = 2;
    FUZZ_CHECK(coordination_.CreateJob(layout).ok(), "create j0");
    jobs_.push_back("j0");
  }

  void Run() {
    for (int ops = 0; ops < 200 && in_.remaining_bytes() > 0; ++ops) Step();
    shut_down_ = true;
    coordination_.Shutdown();
    // After Shutdown every call fails with UNAVAILABLE, waits included.
    Caller caller = MakeCaller();
    FUZZ_CHECK(absl::IsUnavailable(coordination_.KvSet(caller, "k", "v")), "KvSet after Shutdown");
    coordination_.KvGet(caller, "k", true, absl::Seconds(1), Expect<std::string>("late KvGet"));
    FUZZ_CHECK(coordination_.PendingWaits() == 0, "waits pending after Shutdown");
    tracker_.CheckAllCalledOnce();
  }

 private:
  // A callback that counts its call, checks that nothing succeeds after
  // Shutdown, and sometimes calls back into Coordination.
  template <typename T>
  Callback<T> Expect(std::string what) {
    const size_t id = tracker_.Add(std::move(what));
    const bool reenter = in_.ConsumeIntegralInRange<int>(0, 3) == 0;
    Caller caller = MakeCaller();
    return [this, id, reenter, caller](absl::StatusOr<T> result) {
      tracker_.Called(id);
      if (shut_down_) FUZZ_CHECK(!result.ok(), "success after Shutdown");
      if (reenter) (void)coordination_.KvSet(caller, "re", "1");
    };
  }
  DoneCallback ExpectDone(std::string what) {
    const size_t id = tracker_.Add(std::move(what));
    return [this, id](absl::Status status) {
      tracker_.Called(id);
      if (shut_down_) FUZZ_CHECK(!status.ok(), "success after Shutdown");
    };
  }

  std::string PickJob() {
    if (jobs_.empty() || in_.ConsumeIntegralInRange<int>(0, 15) == 0) return "nope";
    return jobs_[in_.ConsumeIntegralInRange<size_t>(0, jobs_.size() - 1)];
  }

  Caller MakeCaller() {
    Caller caller;
    caller.job_id = PickJob();
    auto job = coordination_.GetJob(caller.job_id);
    const int world = job.ok() ? job->layout.world_size : 2;
    const int64_t generation = job.ok() ? job->generation : 0;
    caller.generation = generation + in_.PickValueInArray({0, 0, 0, 0, 0, -1, 1});
    caller.rank = in_.ConsumeIntegralInRange<int>(0, 15) == 0
                      ? in_.ConsumeIntegralInRange<int>(-2, world + 1)
                      : in_.ConsumeIntegralInRange<int>(0, world - 1);
    caller.incarnation = in_.ConsumeIntegralInRange<int>(0, 7) == 0 ? 2 : 1;
    return caller;
  }

  std::string Key() {
    switch (in_.ConsumeIntegralInRange<int>(0, 7)) {
      case 0:
        return "";
      case 1:
        return std::string(kMaxKeyBytes + 1, 'k');
      case 2:
        return in_.ConsumeRandomLengthString(kMaxKeyBytes + 2);
      case 3:
        return "re";
      default:
        return std::string(1, static_cast<char>('a' + in_.ConsumeIntegralInRange<int>(0, 3)));
    }
  }
  std::string Value() { return in_.ConsumeRandomLengthString(20); }
  std::vector<std::string> Keys() {
    std::vector<std::string> keys(in_.ConsumeIntegralInRange<int>(0, 6));
    for (std::string& key : keys) key = Key();
    return keys;
  }
  absl::Duration Timeout() {
    return absl::Milliseconds(in_.ConsumeIntegralInRange<int>(-1000, 30'000));
  }
  std::string UniqueId() {
    return in_.ConsumeBool() ? std::string(128, static_cast<char>(in_.ConsumeIntegral<uint8_t>()))
                             : in_.ConsumeRandomLengthString(130);
  }

  void Step() {
    switch (in_.ConsumeIntegralInRange<int>(0, 27)) {
      case 0: {
        JobLayout layout;
        layout.job_id =
            in_.ConsumeBool() ? absl::StrCat("j", jobs_.size()) : in_.ConsumeRandomLengthString(12);
        layout.world_size = in_.ConsumeIntegralInRange<int>(-1, 5);
        const int dims = in_.ConsumeIntegralInRange<int>(0, 3);
        for (int i = 0; i < dims; ++i)
          layout.mesh_shape.push_back(in_.ConsumeIntegralInRange<int>(-1, 4));
        if (in_.ConsumeBool()) {
          for (int i = 0; i < dims; ++i) layout.mesh_dim_names.push_back(Key());
        }
        auto created = coordination_.CreateJob(layout, in_.ConsumeIntegralInRange<int>(-1, 3));
        if (created.ok()) {
          FUZZ_CHECK(created->layout.world_size >= 1, "created an empty world");
          int64_t product = 1;
          for (int64_t dim : created->layout.mesh_shape) product *= dim;
          FUZZ_CHECK(product == created->layout.world_size, "mesh does not cover the world");
          FUZZ_CHECK(created->layout.mesh_dim_names.size() == created->layout.mesh_shape.size(),
                     "names and shape differ");
          jobs_.push_back(created->layout.job_id);
        }
        return;
      }
      case 1: {
        const std::string job = PickJob();
        if (coordination_.RemoveJob(job, "fuzz removes").ok()) std::erase(jobs_, job);
        return;
      }
      case 2: {
        auto generation = coordination_.BumpGeneration(PickJob(), "fuzz bumps");
        if (generation.ok()) FUZZ_CHECK(*generation >= 1, "bumped to generation 0");
        return;
      }
      case 3:
      case 4: {
        JoinArgs args;
        args.caller = MakeCaller();
        args.host = in_.PickValueInArray({"h0", "h0", "h1", ""});
        args.device.kind = in_.PickValueInArray({"cpu", "cuda", ""});
        args.device.index = in_.ConsumeIntegralInRange<int>(-1, 3);
        if (in_.ConsumeIntegralInRange<int>(0, 3) == 0) args.nccl_unique_id = UniqueId();
        args.timeout = Timeout();
        coordination_.Join(std::move(args), Expect<JoinResult>("Join"));
        return;
      }
      case 5:
        (void)coordination_.KvSet(MakeCaller(), Key(), Value());
        return;
      case 6: {
        Caller caller = MakeCaller();
        const std::string key = Key();
        const bool wait = in_.ConsumeBool();
        coordination_.KvGet(caller, key, wait, Timeout(), Expect<std::string>("KvGet"));
        return;
      }
      case 7: {
        auto sum = coordination_.KvAdd(MakeCaller(), Key(),
                                       in_.ConsumeBool() ? in_.ConsumeIntegralInRange<int>(-3, 3)
                                                         : in_.ConsumeIntegral<int64_t>());
        (void)sum;
        return;
      }
      case 8: {
        Caller caller = MakeCaller();
        const std::string key = Key();
        std::optional<std::string> expected;
        if (in_.ConsumeBool()) expected = Value();
        auto result = coordination_.KvCompareSet(caller, key, expected, Value());
        if (result.ok() && result->swapped) FUZZ_CHECK(result->present, "swapped but absent");
        return;
      }
      case 9:
        (void)coordination_.KvDelete(MakeCaller(), Key(), in_.ConsumeBool());
        return;
      case 10: {
        Caller caller = MakeCaller();
        const std::string prefix = in_.ConsumeBool() ? "" : Key();
        const std::string start_after = in_.ConsumeBool() ? "" : Key();
        const int limit = in_.ConsumeIntegralInRange<int>(-1, 3);
        auto list = coordination_.KvList(caller, prefix, start_after, limit);
        if (list.ok() && limit > 0) {
          FUZZ_CHECK(list->keys.size() <= static_cast<size_t>(limit), "KvList over its limit");
        }
        return;
      }
      case 11:
        (void)coordination_.KvNumKeys(MakeCaller());
        return;
      case 12: {
        Caller caller = MakeCaller();
        std::vector<std::string> keys = Keys();
        coordination_.KvWait(caller, std::move(keys), Timeout(), ExpectDone("KvWait"));
        return;
      }
      case 13: {
        Caller caller = MakeCaller();
        std::vector<std::string> keys = Keys();
        const bool wait = in_.ConsumeBool();
        auto done = [this, n = keys.size()](std::string what) {
          return Expect<std::vector<std::string>>(absl::StrCat(what, " of ", n));
        }("KvMultiGet");
        coordination_.KvMultiGet(caller, std::move(keys), wait, Timeout(), std::move(done));
        return;
      }
      case 14: {
        Caller caller = MakeCaller();
        std::vector<std::pair<std::string, std::string>> entries(
            in_.ConsumeIntegralInRange<int>(0, 5));
        for (auto& [key, value] : entries) {
          key = Key();
          value = Value();
        }
        (void)coordination_.KvMultiSet(caller, std::move(entries));
        return;
      }
      case 15:
      case 16: {
        Caller caller = MakeCaller();
        const std::string name = in_.ConsumeBool() ? "b" : Key();
        std::vector<int> ranks;
        if (in_.ConsumeBool()) {
          ranks.resize(in_.ConsumeIntegralInRange<int>(1, 3));
          for (int& rank : ranks) rank = in_.ConsumeIntegralInRange<int>(-1, 4);
        }
        coordination_.Barrier(caller, name, std::move(ranks), Timeout(), Expect<int>("Barrier"));
        return;
      }
      case 17: {
        Caller caller = MakeCaller();
        std::vector<std::pair<std::string, std::string>> ids(in_.ConsumeIntegralInRange<int>(0, 5));
        for (auto& [key, id] : ids) {
          key = Key();
          id = UniqueId();
        }
        (void)coordination_.PublishUniqueIds(caller, std::move(ids));
        return;
      }
      case 18: {
        Caller caller = MakeCaller();
        std::vector<std::string> keys = Keys();
        coordination_.GetUniqueIds(caller, std::move(keys), Timeout(),
                                   Expect<std::vector<std::string>>("GetUniqueIds"));
        return;
      }
      case 19:
        (void)coordination_.Heartbeat(MakeCaller());
        return;
      case 20:
        (void)coordination_.ReportError(MakeCaller(), "fuzz reports");
        return;
      case 21:
        (void)coordination_.Leave(MakeCaller());
        return;
      case 22: {
        Caller caller = MakeCaller();
        const size_t id = tracker_.Add("Watch");
        auto handle = coordination_.Watch(caller, [this, id](absl::StatusOr<JobError> result) {
          tracker_.Called(id);
          (void)result;
        });
        if (handle.ok()) {
          watches_.emplace_back(*handle, id);
        } else {
          // Refused: the callback was never taken, so it must not run.
          tracker_.Dropped(id);
        }
        return;
      }
      case 23: {
        if (watches_.empty()) return;
        const size_t i = in_.ConsumeIntegralInRange<size_t>(0, watches_.size() - 1);
        if (coordination_.Unwatch(watches_[i].first)) tracker_.Dropped(watches_[i].second);
        watches_.erase(watches_.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
      case 24: {
        std::vector<int> ranks(in_.ConsumeIntegralInRange<int>(0, 3));
        for (int& rank : ranks) rank = in_.ConsumeIntegralInRange<int>(-1, 4);
        (void)coordination_.DescribeRanks(MakeCaller(), ranks);
        return;
      }
      case 25:
        (void)coordination_.GetJob(PickJob());
        return;
      default:
        clock_.Advance(absl::Milliseconds(in_.ConsumeIntegralInRange<int>(0, 6000)));
        coordination_.Tick();
        return;
    }
  }

  FuzzedDataProvider& in_;
  Tracker tracker_;  // Outlives coordination_, whose Shutdown runs callbacks.
  FakeClock clock_;
  bool shut_down_ = false;
  Coordination coordination_;
  std::vector<std::string> jobs_;
  std::vector<std::pair<uint64_t, size_t>> watches_;  // (handle, tracker id)
  int failures_ = 0;
};

}  // namespace
}  // namespace mesh::coordinator

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Logging would cost most of the time of a run, and say nothing.
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);
    return true;
  }();
  (void)quiet;
  FuzzedDataProvider in(data, size);
  mesh::coordinator::Driver driver(in);
  driver.Run();
  return 0;
}
