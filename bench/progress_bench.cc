#include "bench/progress_bench.h"

#include <stdlib.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "libmesh/src/progress_group.h"
#include "mesh/process_group.h"
#include "mesh/progress.h"

namespace mesh::bench {
namespace {

// A Work that completed before it was returned.
class DoneWork final : public Work {
 public:
  using Work::Wait;
  absl::Status Wait(absl::Duration) override { return absl::OkStatus(); }
  bool IsCompleted() const override { return true; }
  absl::Status status() const override { return absl::OkStatus(); }
  void Abort(absl::Status) override {}

 protected:
  absl::Duration default_timeout() const override { return absl::Seconds(1); }
};

// One rank whose collectives complete at once: only the call path costs.
class NullGroup final : public ProcessGroup {
 public:
  NullGroup() : ProcessGroup(0, {0}, "bench", ProcessGroupOptions{}) {}
  absl::string_view backend() const override { return "null"; }
  absl::StatusOr<WorkPtr> AllReduce(Tensor, ReduceOp) override { return Done(); }
  absl::StatusOr<WorkPtr> AllReduce(Tensor, Tensor, ReduceOp) override { return Done(); }
  absl::StatusOr<WorkPtr> Broadcast(Tensor, int) override { return Done(); }
  absl::StatusOr<WorkPtr> Reduce(Tensor, int, ReduceOp) override { return Done(); }
  absl::StatusOr<WorkPtr> AllGather(Tensor, Tensor) override { return Done(); }
  absl::StatusOr<WorkPtr> ReduceScatter(Tensor, Tensor, ReduceOp) override { return Done(); }
  absl::StatusOr<WorkPtr> AllToAll(Tensor, Tensor, std::vector<int64_t>,
                                   std::vector<int64_t>) override {
    return Done();
  }
  absl::StatusOr<WorkPtr> Send(Tensor, int, int) override { return Done(); }
  absl::StatusOr<WorkPtr> Recv(Tensor, int, int) override { return Done(); }
  absl::StatusOr<WorkPtr> Barrier() override { return Done(); }
  void Abort(absl::Status) override {}
  absl::Status health() const override { return absl::OkStatus(); }

 private:
  // A fresh Work per op, as a backend allocates one.
  static absl::StatusOr<WorkPtr> Done() { return WorkPtr(std::make_shared<DoneWork>()); }
};

// ns per all_reduce + Wait over `calls` calls.
double NsPerCall(ProcessGroup& group, Tensor tensor, int64_t calls) {
  const absl::Time start = absl::Now();
  for (int64_t i = 0; i < calls; ++i) {
    absl::StatusOr<ProcessGroup::WorkPtr> work = group.AllReduce(tensor, ReduceOp::kSum);
    if (!work.ok() || !(*work)->Wait().ok()) return -1;
  }
  return absl::ToDoubleNanoseconds(absl::Now() - start) / static_cast<double>(calls);
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

absl::StatusOr<ProgressBenchResult> RunProgressBench(const ProgressBenchOptions& options) {
  if (options.calls < 1 || options.batches < 1) {
    return absl::InvalidArgumentError("calls and batches must be positive");
  }
  auto registry = std::make_shared<ProgressRegistry>();
  auto bare = std::make_shared<NullGroup>();
  internal::ProgressProcessGroup tracked(std::make_shared<NullGroup>(), *registry);
  float value = 1;
  const Tensor tensor = Tensor::Contiguous(&value, DType::kFloat32, {1});

  const int64_t per_batch = std::max<int64_t>(1, options.calls / options.batches);
  NsPerCall(*bare, tensor, per_batch / 10 + 1);  // Warm-up.
  NsPerCall(tracked, tensor, per_batch / 10 + 1);
  std::vector<double> bare_ns, tracked_ns;
  for (int b = 0; b < options.batches; ++b) {
    bare_ns.push_back(NsPerCall(*bare, tensor, per_batch));
    tracked_ns.push_back(NsPerCall(tracked, tensor, per_batch));
    (void)registry->Snapshot();  // What the heartbeat thread does.
    if (bare_ns.back() < 0 || tracked_ns.back() < 0) {
      return absl::InternalError("a null collective failed");
    }
  }
  ProgressBenchResult result;
  result.baseline_ns = Median(bare_ns);
  result.tracked_ns = Median(tracked_ns);
  result.added_ns = result.tracked_ns - result.baseline_ns;
  result.ratio = result.tracked_ns / result.baseline_ns;
  double load[1] = {0};
  if (getloadavg(load, 1) == 1) result.load_average = load[0];
  return result;
}

nlohmann::json ToJson(const ProgressBenchResult& r) {
  return {{"suite", "progress"},    {"tracked_ns", r.tracked_ns}, {"baseline_ns", r.baseline_ns},
          {"added_ns", r.added_ns}, {"ratio", r.ratio},           {"load_average", r.load_average}};
}

}  // namespace mesh::bench
