// Worker metrics (docs/metrics.md, "Worker"): optional, off unless the
// agent gives the worker MESH_METRICS_PORT.
//
//   WorkerMetrics        the families, over any metrics::Registry (a
//                        PrometheusRegistry in a worker, a TestRegistry in
//                        unit tests).
//   MeteredProcessGroup  a ProcessGroup decorator: for every op the inner
//                        group accepts it adds the input's bytes to
//                        mesh_collective_bytes_total{op,backend}, and
//                        observes mesh_collective_duration_seconds{op,backend}
//                        from issue to the first time the caller sees the
//                        op complete (Work::Wait returning with the op done,
//                        IsCompleted() true, or status()). Backends stay
//                        untouched: the Runtime wraps its factory.
//   MeteredProcessGroupFactory  wraps every group a factory makes.
//   WorkerMetricsServer  the process's registry and /metrics exposer on
//                        0.0.0.0:port, shared by every Runtime of the
//                        process that asks for metrics, and the target of
//                        metrics_hooks.h while one is alive.
//
// What the duration means per backend: Gloo's Wait blocks until the op is
// done, so the usual issue-then-Wait gives the op's time (plus any delay
// before the caller waits). NCCL's Wait only orders the caller's stream and
// returns at once; the duration is recorded when the host first sees the op
// complete (IsCompleted, SynchronizeWork), and a Work released before that
// counts its bytes but no duration.
//
// Thread safety: all classes are thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "libmesh/src/decorating_factory.h"
#include "mesh/process_group.h"
#include "mesh/redistribute_plan.h"

namespace mesh::metrics {
class MetricsServer;
}  // namespace mesh::metrics

namespace mesh::internal {

// The ops of ProcessGroup, as metric label values.
enum class CollectiveOp : uint8_t {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSend,
  kRecv,
  kBarrier,
};
inline constexpr int kNumCollectiveOps = 9;
// "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
// "all_to_all", "send", "recv", "barrier".
const char* CollectiveOpName(CollectiveOp op);

class WorkerMetrics {
 public:
  // The registry is kept alive as long as this object (groups that outlive
  // their Runtime keep recording into it harmlessly).
  explicit WorkerMetrics(std::shared_ptr<metrics::Registry> registry);

  metrics::Histogram* CollectiveDuration(CollectiveOp op, absl::string_view backend);
  metrics::Counter* CollectiveBytes(CollectiveOp op, absl::string_view backend);
  void RecordRedistributeStep(RedistributeOp op);

 private:
  const std::shared_ptr<metrics::Registry> registry_;
  metrics::Family<metrics::Histogram>* const duration_;
  metrics::Family<metrics::Counter>* const bytes_;
  metrics::Family<metrics::Counter>* const redistribute_steps_;
};

class MeteredProcessGroup final : public ProcessGroup {
 public:
  MeteredProcessGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<WorkerMetrics> metrics);

  // The group it decorates.
  const std::shared_ptr<ProcessGroup>& inner() const { return inner_; }

  absl::string_view backend() const override { return inner_->backend(); }
  const ProcessGroup& Underlying() const override { return inner_->Underlying(); }
  absl::StatusOr<WorkPtr> AllReduce(Tensor tensor, ReduceOp op) override;
  absl::StatusOr<WorkPtr> AllReduce(Tensor input, Tensor output, ReduceOp op) override;
  absl::StatusOr<WorkPtr> Broadcast(Tensor tensor, int root) override;
  absl::StatusOr<WorkPtr> Reduce(Tensor tensor, int root, ReduceOp op) override;
  absl::StatusOr<WorkPtr> AllGather(Tensor input, Tensor output) override;
  absl::StatusOr<WorkPtr> ReduceScatter(Tensor input, Tensor output, ReduceOp op) override;
  absl::StatusOr<WorkPtr> AllToAll(Tensor input, Tensor output, std::vector<int64_t> input_splits,
                                   std::vector<int64_t> output_splits) override;
  absl::StatusOr<WorkPtr> Send(Tensor tensor, int peer, int tag) override;
  absl::StatusOr<WorkPtr> Recv(Tensor tensor, int peer, int tag) override;
  absl::StatusOr<WorkPtr> Barrier() override;
  void Abort(absl::Status reason) override { inner_->Abort(std::move(reason)); }
  absl::Status health() const override { return inner_->health(); }

 private:
  // Counts the bytes of an accepted op and wraps its Work.
  absl::StatusOr<WorkPtr> Meter(CollectiveOp op, uint64_t bytes, absl::Time issued,
                                absl::StatusOr<WorkPtr> work);

  struct OpMetrics {
    metrics::Histogram* duration = nullptr;
    metrics::Counter* bytes = nullptr;
  };
  const std::shared_ptr<ProcessGroup> inner_;
  const std::shared_ptr<WorkerMetrics> metrics_;
  OpMetrics ops_[kNumCollectiveOps];
};

class MeteredProcessGroupFactory final : public DecoratingProcessGroupFactory {
 public:
  MeteredProcessGroupFactory(std::shared_ptr<ProcessGroupFactory> inner,
                             std::shared_ptr<WorkerMetrics> metrics)
      : DecoratingProcessGroupFactory(std::move(inner)), metrics_(std::move(metrics)) {}

 private:
  std::shared_ptr<ProcessGroup> Wrap(std::shared_ptr<ProcessGroup> group) override {
    return std::make_shared<MeteredProcessGroup>(std::move(group), metrics_);
  }

  const std::shared_ptr<WorkerMetrics> metrics_;
};

class WorkerMetricsServer {
 public:
  // The server of this process while one is alive (whatever `port`: a
  // process serves one /metrics), else a new one on 0.0.0.0:`port` (0: a
  // free port) with mesh_build_info{component="worker"}. Possible errors:
  // those of MetricsServer::Start (UNAVAILABLE when the port is taken).
  static absl::StatusOr<std::shared_ptr<WorkerMetricsServer>> Acquire(int port);
  ~WorkerMetricsServer();

  int port() const;
  const std::shared_ptr<WorkerMetrics>& metrics() const { return metrics_; }

 private:
  WorkerMetricsServer() = default;
  std::shared_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<metrics::MetricsServer> server_;
};

// Makes `metrics` the target of metrics_hooks.h (null: none). Used by
// WorkerMetricsServer, and by tests with a TestRegistry.
void SetHookMetrics(std::shared_ptr<WorkerMetrics> metrics);

}  // namespace mesh::internal
