#include "libmesh/src/worker_metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metrics_prometheus.h"
#include "libmesh/src/metrics_hooks.h"

namespace mesh::internal {
namespace {

// The hooks' target. The flag keeps a hook to one relaxed load while
// metrics are off, which is the default.
std::atomic<bool> g_hooks_on{false};
absl::Mutex g_hooks_mu(absl::kConstInit);
std::shared_ptr<WorkerMetrics>* g_hook_metrics ABSL_GUARDED_BY(g_hooks_mu) = nullptr;

// The process's live server (a weak reference: the Runtimes own it).
absl::Mutex g_server_mu(absl::kConstInit);
std::weak_ptr<WorkerMetricsServer>* g_server ABSL_GUARDED_BY(g_server_mu) = nullptr;

// Holds a Work and records its duration the first time the caller sees it
// complete.
class MeteredWork final : public Work {
 public:
  MeteredWork(std::shared_ptr<Work> inner, metrics::Histogram* duration, absl::Time issued,
              absl::Duration default_timeout)
      : inner_(std::move(inner)),
        duration_(duration),
        issued_(issued),
        default_timeout_(default_timeout) {}

  using Work::Wait;
  absl::Status Wait(absl::Duration timeout) override {
    absl::Status status = inner_->Wait(timeout);
    ObserveIfCompleted();
    return status;
  }
  bool IsCompleted() const override {
    const bool completed = inner_->IsCompleted();
    if (completed) Observe();
    return completed;
  }
  absl::Status status() const override {
    absl::Status status = inner_->status();
    ObserveIfCompleted();
    return status;
  }
  void Abort(absl::Status reason) override { inner_->Abort(std::move(reason)); }

 protected:
  absl::Duration default_timeout() const override { return default_timeout_; }

 private:
  void ObserveIfCompleted() const {
    if (!observed_.load(std::memory_order_relaxed) && inner_->IsCompleted()) Observe();
  }
  void Observe() const {
    const absl::Time now = absl::Now();
    if (!observed_.exchange(true)) duration_->Observe(absl::ToDoubleSeconds(now - issued_));
  }

  const std::shared_ptr<Work> inner_;
  metrics::Histogram* const duration_;
  const absl::Time issued_;
  const absl::Duration default_timeout_;
  mutable std::atomic<bool> observed_{false};
};

uint64_t Bytes(const Tensor& tensor) { return static_cast<uint64_t>(tensor.nbytes()); }

}  // namespace

const char* CollectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return "all_reduce";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kReduce:
      return "reduce";
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kAllToAll:
      return "all_to_all";
    case CollectiveOp::kSend:
      return "send";
    case CollectiveOp::kRecv:
      return "recv";
    case CollectiveOp::kBarrier:
      return "barrier";
  }
  return "unknown";
}

// ---- WorkerMetrics ---------------------------------------------------------

WorkerMetrics::WorkerMetrics(std::shared_ptr<metrics::Registry> registry)
    : registry_(std::move(registry)),
      duration_(registry_->AddHistogram(
          "mesh_collective_duration_seconds",
          "From issue to completion of each collective or point-to-point op, as seen by the "
          "host.",
          {"op", "backend"}, metrics::LatencyBuckets())),
      bytes_(registry_->AddCounter("mesh_collective_bytes_total",
                                   "Bytes of the input tensors of collective and point-to-point "
                                   "ops.",
                                   {"op", "backend"})),
      redistribute_steps_(registry_->AddCounter("mesh_redistribute_steps_total",
                                                "Redistribute plan steps executed.", {"op"})) {
  // Every op's series exists from the start, at 0, so a dashboard tells "no
  // redistributes" from "no metrics".
  for (RedistributeOp op :
       {RedistributeOp::kAllGather, RedistributeOp::kAllReduce, RedistributeOp::kReduceScatter,
        RedistributeOp::kAllToAll, RedistributeOp::kLocalSlice, RedistributeOp::kLocalPartial}) {
    redistribute_steps_->WithLabels({RedistributeOpName(op)});
  }
}

metrics::Histogram* WorkerMetrics::CollectiveDuration(CollectiveOp op, absl::string_view backend) {
  return duration_->WithLabels({CollectiveOpName(op), std::string(backend)});
}

metrics::Counter* WorkerMetrics::CollectiveBytes(CollectiveOp op, absl::string_view backend) {
  return bytes_->WithLabels({CollectiveOpName(op), std::string(backend)});
}

void WorkerMetrics::RecordRedistributeStep(RedistributeOp op) {
  redistribute_steps_->WithLabels({RedistributeOpName(op)})->Increment();
}

// ---- MeteredProcessGroup ---------------------------------------------------

MeteredProcessGroup::MeteredProcessGroup(std::shared_ptr<ProcessGroup> inner,
                                         std::shared_ptr<WorkerMetrics> metrics)
    : ProcessGroup(inner->rank(), inner->global_ranks(), inner->name(), inner->options()),
      inner_(std::move(inner)),
      metrics_(std::move(metrics)) {
  // Children are made once per group: recording then never takes a lock.
  for (int i = 0; i < kNumCollectiveOps; ++i) {
    const auto op = static_cast<CollectiveOp>(i);
    ops_[i].duration = metrics_->CollectiveDuration(op, inner_->backend());
    ops_[i].bytes = metrics_->CollectiveBytes(op, inner_->backend());
  }
}

absl::StatusOr<ProcessGroup::WorkPtr> MeteredProcessGroup::Meter(CollectiveOp op, uint64_t bytes,
                                                                 absl::Time issued,
                                                                 absl::StatusOr<WorkPtr> work) {
  // A refused op (bad arguments, an aborted group) moved nothing.
  if (!work.ok()) return work;
  const OpMetrics& m = ops_[static_cast<int>(op)];
  m.bytes->Increment(static_cast<double>(bytes));
  return WorkPtr(
      std::make_shared<MeteredWork>(*std::move(work), m.duration, issued, options().timeout));
}

absl::StatusOr<ProcessGroup::WorkPtr> MeteredProcessGroup::AllReduce(Tensor tensor, ReduceOp op) {
  const absl::Time issued = absl::Now();
  return Meter(CollectiveOp::kAllReduce, Bytes(tensor), issued, inner_->AllReduce(tensor, op));
}

absl::StatusOr<ProcessGroup::WorkPtr> MeteredProcessGroup::AllReduce(Tensor input, Tensor output,
                                                                     ReduceOp op) {
  const absl::Time issued = absl::Now();
  return Meter(CollectiveOp::kAllReduce, Bytes(input), issued,
               inner_->AllReduce(input, output, op));
}

absl::StatusOr<ProcessGroup::WorkPtr> MeteredProcessGroup::Broadcast(Tensor tensor, int root) {
  const absl::Time issued = absl::Now();
  return Meter(CollectiveOp::kBroadcast, Bytes(tensor), issued, inner_->Broadcast(tensor, root));
}

absl::StatusOr<ProcessGroup::WorkPtr> MeteredProcessGroup::Reduce(Tensor tensor, int root,
                                                                  ReduceOp op) {
  const absl::Time issued = absl::Now();
  return Meter(CollectiveOp::kReduce, Bytes(tensor), issued, inner_->Reduce(tensor, root, op));
}

absl::StatusOr<ProcessGroup::WorkPtr> MeteredProcessGroup::AllGather(Tensor input, Tensor output) {
  const absl::Time issued = absl::Now();
  return Meter(CollectiveOp::kAllGather, Bytes(input), issued, inner_->AllGather(input, output));
}

absl::StatusOr<ProcessGroup::WorkPtr> MeteredProcessGroup::ReduceScatter(Tensor input,
                                                                         Tensor output,
                                                                         ReduceOp op) {
  const absl::Time issued = absl::Now();
  return Meter(CollectiveOp::kReduceScatter, Bytes(input), issued,
               inner_->ReduceScatter(input, output, op));
}

absl::StatusOr<ProcessGroup::WorkPtr> MeteredProcessGroup::AllToAll(
    Tensor input, Tensor output, std::vector<int64_t> input_splits,
    std::vector<int64_t> output_splits) {
  const absl::Time issued = absl::Now();
  return Meter(CollectiveOp::kAllToAll, Bytes(input), issued,
               inner_->AllToAll(input, output, std::move(input_splits), std::move(output_splits)));
}

absl::StatusOr<ProcessGroup::WorkPtr> MeteredProcessGroup::Send(Tensor tensor, int peer, int tag) {
  const absl::Time issued = absl::Now();
  return Meter(CollectiveOp::kSend, Bytes(tensor), issued, inner_->Send(tensor, peer, tag));
}

absl::StatusOr<ProcessGroup::WorkPtr> MeteredProcessGroup::Recv(Tensor tensor, int peer, int tag) {
  const absl::Time issued = absl::Now();
  return Meter(CollectiveOp::kRecv, Bytes(tensor), issued, inner_->Recv(tensor, peer, tag));
}

absl::StatusOr<ProcessGroup::WorkPtr> MeteredProcessGroup::Barrier() {
  const absl::Time issued = absl::Now();
  return Meter(CollectiveOp::kBarrier, 0, issued, inner_->Barrier());
}

// ---- MeteredProcessGroupFactory --------------------------------------------

// ---- Hooks and the server --------------------------------------------------

void SetHookMetrics(std::shared_ptr<WorkerMetrics> metrics) {
  absl::MutexLock lock(&g_hooks_mu);
  if (g_hook_metrics == nullptr) g_hook_metrics = new std::shared_ptr<WorkerMetrics>();
  g_hooks_on.store(metrics != nullptr, std::memory_order_relaxed);
  *g_hook_metrics = std::move(metrics);
}

void RecordRedistributeStep(RedistributeOp op) {
  if (!g_hooks_on.load(std::memory_order_relaxed)) return;
  std::shared_ptr<WorkerMetrics> metrics;
  {
    absl::MutexLock lock(&g_hooks_mu);
    if (g_hook_metrics != nullptr) metrics = *g_hook_metrics;
  }
  if (metrics != nullptr) metrics->RecordRedistributeStep(op);
}

absl::StatusOr<std::shared_ptr<WorkerMetricsServer>> WorkerMetricsServer::Acquire(int port) {
  absl::MutexLock lock(&g_server_mu);
  if (g_server == nullptr) g_server = new std::weak_ptr<WorkerMetricsServer>();
  if (std::shared_ptr<WorkerMetricsServer> live = g_server->lock(); live != nullptr) return live;
  auto registry = std::make_shared<metrics::PrometheusRegistry>();
  metrics::AddBuildInfo(*registry, "worker");
  absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> exposer =
      metrics::MetricsServer::Start("0.0.0.0", port, *registry);
  if (!exposer.ok()) return exposer.status();
  std::shared_ptr<WorkerMetricsServer> server(new WorkerMetricsServer());
  server->metrics_ = std::make_shared<WorkerMetrics>(std::move(registry));
  server->server_ = *std::move(exposer);
  SetHookMetrics(server->metrics_);
  *g_server = server;
  return server;
}

WorkerMetricsServer::~WorkerMetricsServer() {
  absl::MutexLock lock(&g_hooks_mu);
  if (g_hook_metrics != nullptr && *g_hook_metrics == metrics_) {
    g_hooks_on.store(false, std::memory_order_relaxed);
    g_hook_metrics->reset();
  }
}

int WorkerMetricsServer::port() const { return server_->port(); }

}  // namespace mesh::internal
