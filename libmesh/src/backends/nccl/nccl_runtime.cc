// CUDA runtime and NCCL entry points of libmesh's build info. Compiled only
// when MESH_HAVE_NCCL; build_info.cc provides the CPU-only fallbacks.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "mesh/build_info.h"

namespace mesh {

int NcclHeaderVersion() { return NCCL_VERSION_CODE; }

int CudaDeviceCount() {
  int count = 0;
  // No driver or no device: cudaErrorNoDevice / cudaErrorInsufficientDriver.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // Clear the sticky-free error so later calls are clean.
    return 0;
  }
  return count;
}

absl::StatusOr<int> NcclRuntimeVersion() {
  int version = 0;
  const ncclResult_t result = ncclGetVersion(&version);
  if (result != ncclSuccess) {
    return absl::InternalError(absl::StrCat("ncclGetVersion: ", ncclGetErrorString(result)));
  }
  return version;
}

namespace {

absl::Status CudaError(const char* what, cudaError_t err) {
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

}  // namespace

absl::Status CudaRoundTripSelfTest(size_t bytes) {
  if (CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError("no CUDA device is visible");
  }
  if (cudaError_t err = cudaSetDevice(0); err != cudaSuccess) {
    return CudaError("cudaSetDevice(0)", err);
  }
  std::vector<unsigned char> in(bytes), out(bytes, 0);
  for (size_t i = 0; i < bytes; ++i) in[i] = static_cast<unsigned char>(i * 31 + 7);
  void* device = nullptr;
  if (cudaError_t err = cudaMalloc(&device, bytes == 0 ? 1 : bytes); err != cudaSuccess) {
    return CudaError("cudaMalloc", err);
  }
  absl::Status status;
  if (cudaError_t err = cudaMemcpy(device, in.data(), bytes, cudaMemcpyHostToDevice);
      err != cudaSuccess) {
    status = CudaError("cudaMemcpy host to device", err);
  } else if (cudaError_t err2 = cudaMemcpy(out.data(), device, bytes, cudaMemcpyDeviceToHost);
             err2 != cudaSuccess) {
    status = CudaError("cudaMemcpy device to host", err2);
  } else if (bytes != 0 && std::memcmp(in.data(), out.data(), bytes) != 0) {
    status = absl::DataLossError("bytes changed on their way through device 0");
  }
  cudaFree(device);
  return status;
}

}  // namespace mesh
