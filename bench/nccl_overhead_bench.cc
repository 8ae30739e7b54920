#include "bench/nccl_overhead_bench.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "mesh/build_info.h"
#include "mesh/config.h"

#if MESH_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "mesh/cuda_stream.h"
#include "mesh/process_group_nccl.h"
#include "mesh/tensor.h"
#endif

namespace mesh::bench {

#if MESH_HAVE_NCCL
namespace {

using Clock = std::chrono::steady_clock;

absl::Duration Since(Clock::time_point start) { return absl::FromChrono(Clock::now() - start); }

absl::Status CudaStatus(absl::string_view what, cudaError_t err) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

absl::Status NcclStatus(absl::string_view what, ncclResult_t r) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

// The baseline: raw NCCL on a world-of-one, non-blocking communicator (the
// same configuration libmesh uses) and a non-blocking stream.
class RawNccl {
 public:
  static absl::StatusOr<std::unique_ptr<RawNccl>> Create() {
    auto raw = std::unique_ptr<RawNccl>(new RawNccl());
    if (absl::Status s =
            CudaStatus("cudaStreamCreateWithFlags",
                       cudaStreamCreateWithFlags(&raw->stream_, cudaStreamNonBlocking));
        !s.ok()) {
      return s;
    }
    ncclUniqueId id;
    if (absl::Status s = NcclStatus("ncclGetUniqueId", ncclGetUniqueId(&id)); !s.ok()) return s;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&raw->comm_, 1, id, 0, &config);
    if (r == ncclInProgress) r = raw->Poll();
    if (absl::Status s = NcclStatus("ncclCommInitRankConfig", r); !s.ok()) return s;
    return raw;
  }

  ~RawNccl() {
    if (comm_ != nullptr) {
      cudaStreamSynchronize(stream_);
      ncclCommAbort(comm_);  // Nothing pending; abort skips finalize's handshake.
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status AllReduce(float* data, size_t count) {
    ncclResult_t r = ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_);
    if (r == ncclInProgress) r = Poll();
    return NcclStatus("ncclAllReduce", r);
  }

  absl::Status Sync() {
    return CudaStatus("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
  }

 private:
  RawNccl() = default;

  ncclResult_t Poll() {
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) {
      if (ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) return r;
      std::this_thread::yield();
    }
    return state;
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// The libmesh side: the world group of a world-of-one factory, called from
// a non-blocking stream of its own (made current with CudaStreamGuard), as
// the raw side's calls are. On the legacy default stream every
// cudaEventRecord costs more (about 0.3 us against 0.19 on an H100), which
// would be charged to libmesh though the baseline never pays it.
struct MeshSide {
  std::unique_ptr<NcclProcessGroupFactory> factory;
  std::shared_ptr<ProcessGroup> world;
  cudaStream_t caller = nullptr;

  ~MeshSide() {
    world.reset();
    factory.reset();
    if (caller != nullptr) cudaStreamDestroy(caller);
  }
  absl::Status AllReduceAndWait(const Tensor& t) {
    CudaStreamGuard current(t.device(), caller);
    absl::StatusOr<ProcessGroup::WorkPtr> work = world->AllReduce(t, ReduceOp::kSum);
    if (!work.ok()) return work.status();
    return (*work)->Wait();  // Stream-ordered: `caller` waits; the host does not.
  }
  absl::Status AllReduceAndSynchronize(const Tensor& t) {
    CudaStreamGuard current(t.device(), caller);
    absl::StatusOr<ProcessGroup::WorkPtr> work = world->AllReduce(t, ReduceOp::kSum);
    if (!work.ok()) return work.status();
    return SynchronizeWork(**work, absl::Seconds(60));
  }
  // Waits for everything Wait ordered on `caller`.
  absl::Status Sync() const {
    return CudaStatus("cudaStreamSynchronize(caller)", cudaStreamSynchronize(caller));
  }
};

absl::StatusOr<NcclOverheadRow> MeasureSize(const NcclOverheadOptions& options, RawNccl& raw,
                                            MeshSide& mesh, int64_t elements) {
  NcclOverheadRow row;
  row.elements = elements;
  row.bytes = elements * static_cast<int64_t>(sizeof(float));
  absl::StatusOr<Tensor> mesh_tensor =
      Tensor::Zeros(DType::kFloat32, {elements}, Device::Cuda(options.device));
  if (!mesh_tensor.ok()) return mesh_tensor.status();
  absl::StatusOr<Tensor> raw_tensor =
      Tensor::Zeros(DType::kFloat32, {elements}, Device::Cuda(options.device));
  if (!raw_tensor.ok()) return raw_tensor.status();
  float* raw_data = raw_tensor->data_as<float>();
  const size_t count = static_cast<size_t>(elements);

  for (int i = 0; i < options.warmup; ++i) {
    if (absl::Status s = raw.AllReduce(raw_data, count); !s.ok()) return s;
    if (absl::Status s = mesh.AllReduceAndWait(*mesh_tensor); !s.ok()) return s;
  }
  if (absl::Status s = raw.Sync(); !s.ok()) return s;
  if (absl::Status s = mesh.Sync(); !s.ok()) return s;

  std::vector<absl::Duration> raw_pipe, mesh_pipe, raw_sync, mesh_sync;
  for (int done = 0; done < options.iterations;) {
    const int n = std::min(options.block, options.iterations - done);
    // Pipelined blocks.
    Clock::time_point start = Clock::now();
    for (int i = 0; i < n; ++i) {
      if (absl::Status s = raw.AllReduce(raw_data, count); !s.ok()) return s;
    }
    if (absl::Status s = raw.Sync(); !s.ok()) return s;
    raw_pipe.push_back(Since(start) / n);
    start = Clock::now();
    for (int i = 0; i < n; ++i) {
      if (absl::Status s = mesh.AllReduceAndWait(*mesh_tensor); !s.ok()) return s;
    }
    if (absl::Status s = mesh.Sync(); !s.ok()) return s;
    mesh_pipe.push_back(Since(start) / n);
    // Synchronous calls.
    for (int i = 0; i < n; ++i) {
      start = Clock::now();
      if (absl::Status s = raw.AllReduce(raw_data, count); !s.ok()) return s;
      if (absl::Status s = raw.Sync(); !s.ok()) return s;
      raw_sync.push_back(Since(start));
    }
    for (int i = 0; i < n; ++i) {
      start = Clock::now();
      if (absl::Status s = mesh.AllReduceAndSynchronize(*mesh_tensor); !s.ok()) return s;
      mesh_sync.push_back(Since(start));
    }
    done += n;
  }
  row.raw_pipelined = Summarize(std::move(raw_pipe));
  row.mesh_pipelined = Summarize(std::move(mesh_pipe));
  row.raw_sync = Summarize(std::move(raw_sync));
  row.mesh_sync = Summarize(std::move(mesh_sync));
  row.pipelined_ratio = row.mesh_pipelined.p50_us / row.raw_pipelined.p50_us;
  row.pipelined_overhead_us = row.mesh_pipelined.p50_us - row.raw_pipelined.p50_us;
  row.sync_ratio = row.mesh_sync.p50_us / row.raw_sync.p50_us;
  return row;
}

}  // namespace
#endif  // MESH_HAVE_NCCL

absl::StatusOr<NcclOverheadResult> RunNcclOverheadBench(const NcclOverheadOptions& options) {
  if (options.iterations <= 0 || options.warmup < 0 || options.block <= 0 ||
      options.elements.empty() || options.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "iterations and block must be > 0, warmup >= 0, device >= 0, and at least one size; got ",
        options.iterations, ", ", options.block, ", ", options.warmup, ", ", options.device));
  }
  for (int64_t n : options.elements) {
    if (n <= 0) return absl::InvalidArgumentError(absl::StrCat("element count ", n, " is not > 0"));
  }
  NcclOverheadResult result;
  if (!GetBuildInfo().has_nccl) {
    result.skipped = true;
    result.skip_reason = "built without NCCL";
    return result;
  }
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    result.skipped = true;
    result.skip_reason = "no CUDA device";
    return result;
  }
#if MESH_HAVE_NCCL
  if (options.device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", options.device, " is not visible (", devices, " devices)"));
  }
  if (absl::Status s = CudaStatus("cudaSetDevice", cudaSetDevice(options.device)); !s.ok()) {
    return s;
  }
  cudaDeviceProp prop;
  if (absl::Status s =
          CudaStatus("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, options.device));
      !s.ok()) {
    return s;
  }
  result.device_name = prop.name;
  ncclGetVersion(&result.nccl_version);

  absl::StatusOr<std::unique_ptr<RawNccl>> raw = RawNccl::Create();
  if (!raw.ok()) return raw.status();
  MeshSide mesh;
  if (absl::Status s = CudaStatus("cudaStreamCreateWithFlags",
                                  cudaStreamCreateWithFlags(&mesh.caller, cudaStreamNonBlocking));
      !s.ok()) {
    return s;
  }
  NcclProcessGroupFactoryOptions factory_options;
  factory_options.device = Device::Cuda(options.device);
  factory_options.stream_mode = options.stream_mode;
  result.stream_mode = options.stream_mode;
  absl::StatusOr<std::string> id = GenerateNcclUniqueId();
  if (!id.ok()) return id.status();
  factory_options.world_unique_id = *id;
  absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> factory =
      NcclProcessGroupFactory::Create(factory_options);
  if (!factory.ok()) return factory.status();
  mesh.factory = *std::move(factory);
  absl::StatusOr<std::shared_ptr<ProcessGroup>> world = mesh.factory->World();
  if (!world.ok()) return world.status();
  mesh.world = *world;

  for (int64_t elements : options.elements) {
    absl::StatusOr<NcclOverheadRow> row = MeasureSize(options, **raw, mesh, elements);
    if (!row.ok()) return row.status();
    result.rows.push_back(*row);
  }
  return result;
#else
  return absl::InternalError("unreachable: has_nccl without MESH_HAVE_NCCL");
#endif
}

nlohmann::json ToJson(const NcclOverheadResult& result) {
  nlohmann::json json = {{"benchmark", "nccl-overhead"},
                         {"collective", "all_reduce sum float32, world size 1"},
                         {"skipped", result.skipped}};
  if (result.skipped) {
    json["skip_reason"] = result.skip_reason;
    return json;
  }
  json["device"] = result.device_name;
  json["nccl_version"] = result.nccl_version;
  json["stream"] = result.stream_mode == NcclStreamMode::kCurrentStream ? "current" : "group";
  nlohmann::json rows = nlohmann::json::array();
  for (const NcclOverheadRow& row : result.rows) {
    rows.push_back({{"elements", row.elements},
                    {"bytes", row.bytes},
                    {"raw_pipelined_per_call", ToJson(row.raw_pipelined)},
                    {"mesh_pipelined_per_call", ToJson(row.mesh_pipelined)},
                    {"raw_sync", ToJson(row.raw_sync)},
                    {"mesh_sync", ToJson(row.mesh_sync)},
                    {"pipelined_p50_ratio", row.pipelined_ratio},
                    {"pipelined_overhead_us", row.pipelined_overhead_us},
                    {"sync_p50_ratio", row.sync_ratio}});
  }
  json["rows"] = std::move(rows);
  return json;
}

}  // namespace mesh::bench
