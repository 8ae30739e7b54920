#include "backends/cuda/cuda_memory.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "mesh/build_info.h"

namespace mesh::cuda {
namespace {

absl::Status CudaError(absl::string_view what, int device, cudaError_t err) {
  const std::string message = absl::StrCat(what, " on cuda:", device, ": ", cudaGetErrorName(err),
                                           ": ", cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
      err == cudaErrorInvalidDevice) {
    return absl::FailedPreconditionError(message);
  }
  return absl::InternalError(message);
}

// Makes `device` current and restores the previous current device on
// destruction. cudaSetDevice is per host thread, so this is thread-local
// state and needs no lock.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device_) status_ = cudaSetDevice(device_);
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  absl::Status status() const {
    if (status_ == cudaSuccess) return absl::OkStatus();
    return CudaError("cudaSetDevice", device_, status_);
  }

 private:
  const int device_;
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace

absl::Status CheckDevice(int device) {
  const int count = CudaDeviceCount();
  if (count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", device,
                     " requested but no CUDA device is visible to this process (no driver, no "
                     "GPU, or CUDA_VISIBLE_DEVICES hides them all)"));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", device, " requested but only ", count,
                     " CUDA device(s) are visible (cuda:0..", count - 1, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> Malloc(int device, size_t bytes) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  DeviceGuard guard(device);
  if (absl::Status s = guard.status(); !s.ok()) return s;
  void* ptr = nullptr;
  if (cudaError_t err = cudaMalloc(&ptr, bytes == 0 ? 1 : bytes); err != cudaSuccess) {
    cudaGetLastError();  // An allocation failure is not sticky; clear it.
    return CudaError(absl::StrCat("cudaMalloc(", bytes, " bytes)"), device, err);
  }
  return ptr;
}

void Free(int device, void* ptr) noexcept {
  if (ptr == nullptr) return;
  DeviceGuard guard(device);
  if (cudaFree(ptr) != cudaSuccess) cudaGetLastError();
}

absl::Status Memset(int device, void* ptr, int value, size_t bytes) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  DeviceGuard guard(device);
  if (absl::Status s = guard.status(); !s.ok()) return s;
  if (cudaError_t err = cudaMemset(ptr, value, bytes); err != cudaSuccess) {
    return CudaError("cudaMemset", device, err);
  }
  if (cudaError_t err = cudaStreamSynchronize(nullptr); err != cudaSuccess) {
    return CudaError("cudaStreamSynchronize after cudaMemset", device, err);
  }
  return absl::OkStatus();
}

absl::Status Memcpy(int device, void* dst, const void* src, size_t bytes) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  DeviceGuard guard(device);
  if (absl::Status s = guard.status(); !s.ok()) return s;
  if (cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault); err != cudaSuccess) {
    return CudaError(absl::StrCat("cudaMemcpy(", bytes, " bytes)"), device, err);
  }
  if (cudaError_t err = cudaStreamSynchronize(nullptr); err != cudaSuccess) {
    return CudaError("cudaStreamSynchronize after cudaMemcpy", device, err);
  }
  return absl::OkStatus();
}

absl::Status MemcpyAsync(int device, void* dst, const void* src, size_t bytes, void* stream) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  DeviceGuard guard(device);
  if (absl::Status s = guard.status(); !s.ok()) return s;
  if (cudaError_t err =
          cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
      err != cudaSuccess) {
    return CudaError(absl::StrCat("cudaMemcpyAsync(", bytes, " bytes)"), device, err);
  }
  return absl::OkStatus();
}

}  // namespace mesh::cuda
