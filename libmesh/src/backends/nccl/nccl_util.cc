#include "backends/nccl/nccl_util.h"

#include <cstdlib>
#include <string_view>

#include <algorithm>
#include <thread>

#include "absl/container/node_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/check.h"

namespace mesh::nccl {

NcclCaps BuiltCaps() {
  NcclCaps caps;
  caps.bfloat16 = NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0);
  caps.avg = NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0);
  return caps;
}

bool SplitAvailable(NcclApi& api) {
#if MESH_NCCL_HAS_SPLIT
  int version = 0;
  return api.GetVersion(&version) == ncclSuccess && version >= NCCL_VERSION(2, 19, 0);
#else
  (void)api;
  return false;
#endif
}

bool ScalableInitAvailable(NcclApi& api) {
#if MESH_NCCL_HAS_INIT_SCALABLE
  int version = 0;
  return api.GetVersion(&version) == ncclSuccess && version >= NCCL_VERSION(2, 23, 0);
#else
  (void)api;
  return false;
#endif
}

bool ShrinkAvailable(NcclApi& api) {
#if MESH_NCCL_HAS_SHRINK
  int version = 0;
  return api.GetVersion(&version) == ncclSuccess && version >= NCCL_VERSION(2, 27, 0);
#else
  (void)api;
  return false;
#endif
}

bool SplitSharesResources() {
  const char* value = std::getenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  return value != nullptr && value[0] != '\0' && std::string_view(value) != "0";
}

ncclDataType_t ToNcclDataType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
      return ncclBfloat16;
#else
      break;
#endif
    case DType::kInt8:
      return ncclInt8;
    case DType::kUInt8:
      return ncclUint8;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    // One byte holding 0 or 1: min and max are logical and / or.
    case DType::kBool:
      return ncclUint8;
  }
  MESH_CHECK(false, "dtype has no NCCL type; CheckTensor should have rejected it");
  return ncclUint8;
}

ncclRedOp_t ToNcclRedOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProd:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kAvg:
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
      return ncclAvg;
#else
      break;
#endif
  }
  MESH_CHECK(false, "reduction has no NCCL op; CheckReduceOp should have rejected it");
  return ncclSum;
}

absl::StatusCode CodeForNcclResult(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return absl::StatusCode::kOk;
    case ncclSystemError:
    case ncclRemoteError:
      return absl::StatusCode::kUnavailable;
    case ncclInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    case ncclInvalidUsage:
      return absl::StatusCode::kFailedPrecondition;
    case ncclUnhandledCudaError:
    case ncclInternalError:
    case ncclInProgress:
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status NcclError(NcclApi& api, absl::string_view what, ncclResult_t result, ncclComm_t comm,
                       absl::StatusCode internal_as) {
  const char* last = api.GetLastError(comm);
  absl::StatusCode code = CodeForNcclResult(result);
  if (code == absl::StatusCode::kInternal) code = internal_as;
  return absl::Status(
      code,
      absl::StrCat(
          what, ": NCCL error ", static_cast<int>(result), ": ", api.GetErrorString(result),
          last != nullptr && last[0] != '\0' ? absl::StrCat(" (", last, ")") : std::string()));
}

absl::Status CudaError(NcclApi& api, absl::string_view what, cudaError_t err) {
  api.GetLastCudaError();  // Non-sticky errors would otherwise resurface in later calls.
  const std::string message =
      absl::StrCat(what, ": ", api.GetCudaErrorName(err), ": ", api.GetCudaErrorString(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

DeviceGuard::DeviceGuard(NcclApi& api, int device) : api_(api) {
  if (cudaError_t err = api_.GetDevice(&previous_); err != cudaSuccess) {
    status_ = CudaError(api_, "cudaGetDevice", err);
    previous_ = -1;
    return;
  }
  if (previous_ == device) return;
  if (cudaError_t err = api_.SetDevice(device); err != cudaSuccess) {
    status_ = CudaError(api_, absl::StrCat("cudaSetDevice(", device, ")"), err);
    previous_ = -1;  // Nothing to restore.
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ < 0) return;
  int current = -1;
  if (api_.GetDevice(&current) == cudaSuccess && current != previous_) api_.SetDevice(previous_);
}

namespace {

// Spin briefly (a lazy connection or a small init often finishes within
// microseconds), then back off to sleeps of up to 1 ms: inits take up to
// seconds, and a 2-core machine has no cycles to burn.
class Backoff {
 public:
  void Pause() {
    if (polls_++ < 64) {
      std::this_thread::yield();
      return;
    }
    absl::SleepFor(sleep_);
    sleep_ = std::min(sleep_ * 2, absl::Milliseconds(1));
  }

 private:
  int polls_ = 0;
  absl::Duration sleep_ = absl::Microseconds(10);
};

}  // namespace

absl::Status AwaitComm(NcclApi& api, ncclComm_t comm, absl::string_view what, absl::Time deadline,
                       absl::FunctionRef<absl::Status()> cancelled, absl::StatusCode internal_as) {
  for (Backoff backoff;; backoff.Pause()) {
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t r = api.CommGetAsyncError(comm, &state); r != ncclSuccess) {
      return NcclError(api, absl::StrCat(what, ": ncclCommGetAsyncError"), r, comm, internal_as);
    }
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(api, what, state, comm, internal_as);
    if (absl::Status s = cancelled(); !s.ok()) return s;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what,
                       ": NCCL did not finish before the deadline (peers missing or "
                       "stuck?)"));
    }
  }
}

SplitWait AwaitSplit(NcclApi& api, ncclComm_t parent, ncclComm_t* slot, absl::string_view what,
                     absl::Time deadline, absl::FunctionRef<absl::Status()> cancelled,
                     absl::StatusCode internal_as) {
  SplitWait wait;
  for (Backoff backoff;; backoff.Pause()) {
    // The parent first: asking it is what lets NCCL finish the split's group
    // job, and its error (a peer or the network failed) ends the wait.
    ncclResult_t parent_state = ncclSuccess;
    if (ncclResult_t r = api.CommGetAsyncError(parent, &parent_state); r != ncclSuccess) {
      wait.child = LoadPublished(slot);
      wait.status = NcclError(api, absl::StrCat(what, ": ncclCommGetAsyncError of the parent"), r,
                              parent, internal_as);
      return wait;
    }
    wait.child = LoadPublished(slot);
    if (parent_state != ncclSuccess && parent_state != ncclInProgress) {
      wait.status = NcclError(api, absl::StrCat(what, ": the parent communicator failed"),
                              parent_state, parent, internal_as);
      return wait;
    }
    if (wait.child != nullptr) {
      ncclResult_t child_state = ncclSuccess;
      if (ncclResult_t r = api.CommGetAsyncError(wait.child, &child_state); r != ncclSuccess) {
        wait.status = NcclError(api, absl::StrCat(what, ": ncclCommGetAsyncError of the child"), r,
                                wait.child, internal_as);
        return wait;
      }
      if (child_state != ncclSuccess && child_state != ncclInProgress) {
        wait.status = NcclError(api, absl::StrCat(what, ": the new communicator failed to come up"),
                                child_state, wait.child, internal_as);
        return wait;
      }
      // Both must be out of ncclInProgress: the child before its first use,
      // the parent before its next call.
      if (child_state == ncclSuccess && parent_state == ncclSuccess) {
        wait.status = absl::OkStatus();
        return wait;
      }
    }
    if (absl::Status s = cancelled(); !s.ok()) {
      wait.status = s;
      return wait;
    }
    if (absl::Now() >= deadline) {
      wait.status = absl::DeadlineExceededError(absl::StrCat(
          what, ": NCCL did not finish before the deadline (peers missing or stuck?); ",
          wait.child == nullptr ? "the new communicator had not been created yet"
                                : "the new communicator was still initializing"));
      return wait;
    }
  }
}

ncclConfig_t NonBlockingConfig(const char* name) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
#if MESH_NCCL_HAS_COMM_NAME
  config.commName = name;
#else
  (void)name;
#endif
  return config;
}

const char* PersistentName(absl::string_view name) {
  static absl::Mutex mu(absl::kConstInit);
  // Leaked on purpose: communicators may outlive any owner we could give it.
  static auto* names = new absl::node_hash_set<std::string>();
  absl::MutexLock lock(&mu);
  return names->emplace(name).first->c_str();  // Node-based: the string never moves.
}

namespace {

// The common part of InitComm and InitCommScalable: `start` is the NCCL
// init call (named `call` in errors), made on `device` with a non-blocking
// config; then the wait, and the abort of a half-made communicator.
absl::StatusOr<ncclComm_t> StartAndAwaitComm(
    NcclApi& api, int device, const char* name, absl::string_view what, absl::Time deadline,
    absl::FunctionRef<absl::Status()> cancelled, absl::string_view call,
    absl::FunctionRef<ncclResult_t(ncclComm_t*, ncclConfig_t*)> start) {
  DeviceGuard guard(api, device);  // NCCL binds the communicator to the current device.
  if (!guard.status().ok()) {
    return absl::Status(guard.status().code(), absl::StrCat("creating NCCL communicator for ", what,
                                                            ": ", guard.status().message()));
  }
  ncclConfig_t config = NonBlockingConfig(name);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = start(&comm, &config);
  absl::Status status;
  if (r == ncclInProgress || r == ncclSuccess) {
    if (comm == nullptr) {
      return absl::InternalError(absl::StrCat(call, " for ", what, " returned no communicator"));
    }
    status = AwaitComm(api, comm, absl::StrCat("creating NCCL communicator for ", what), deadline,
                       cancelled, absl::StatusCode::kUnavailable);
  } else {
    status =
        NcclError(api, absl::StrCat(call, " for ", what), r, comm, absl::StatusCode::kUnavailable);
  }
  if (!status.ok()) {
    // Unlike a split, an init publishes its communicator before returning,
    // and aborting it is NCCL's way to cancel the init: ncclCommAbort joins
    // the init job, so nothing writes to `comm` later.
    if (comm != nullptr) api.CommAbort(comm);
    return status;
  }
  return comm;
}

}  // namespace

absl::StatusOr<ncclComm_t> InitComm(NcclApi& api, const ncclUniqueId& id, int nranks, int rank,
                                    int device, const char* name, absl::string_view what,
                                    absl::Time deadline,
                                    absl::FunctionRef<absl::Status()> cancelled) {
  return StartAndAwaitComm(api, device, name, what, deadline, cancelled, "ncclCommInitRankConfig",
                           [&](ncclComm_t* comm, ncclConfig_t* config) {
                             return api.CommInitRankConfig(comm, nranks, id, rank, config);
                           });
}

absl::StatusOr<ncclComm_t> InitCommScalable(NcclApi& api, std::vector<ncclUniqueId> ids, int nranks,
                                            int rank, int device, const char* name,
                                            absl::string_view what, absl::Time deadline,
                                            absl::FunctionRef<absl::Status()> cancelled) {
  return StartAndAwaitComm(api, device, name, what, deadline, cancelled, "ncclCommInitRankScalable",
                           [&](ncclComm_t* comm, ncclConfig_t* config) {
                             return api.CommInitRankScalable(comm, nranks, rank,
                                                             static_cast<int>(ids.size()),
                                                             ids.data(), config);
                           });
}

}  // namespace mesh::nccl
