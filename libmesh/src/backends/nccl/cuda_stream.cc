// Thread-local current streams. No CUDA calls: the table only stores
// handles, so this file is compiled in every build.
#include "mesh/cuda_stream.h"

#include <vector>

#include "common/check.h"

namespace mesh {
namespace {

// Indexed by CUDA ordinal; grown on first use of a device. A vector rather
// than a map: ordinals are small and dense, and the lookup sits on every
// op's hot path.
std::vector<void*>& Streams() {
  thread_local std::vector<void*> streams;
  return streams;
}

int CudaIndex(const Device& device) {
  MESH_CHECK(device.is_cuda(), "the current CUDA stream needs a CUDA device, not the CPU");
  return device.index();
}

}  // namespace

void* CurrentCudaStream(const Device& device) {
  const int index = CudaIndex(device);
  const std::vector<void*>& streams = Streams();
  return static_cast<size_t>(index) < streams.size() ? streams[index] : nullptr;
}

CudaStreamGuard::CudaStreamGuard(const Device& device, void* stream)
    : device_index_(CudaIndex(device)), previous_(CurrentCudaStream(device)) {
  std::vector<void*>& streams = Streams();
  if (static_cast<size_t>(device_index_) >= streams.size()) {
    streams.resize(static_cast<size_t>(device_index_) + 1, nullptr);
  }
  streams[device_index_] = stream;
}

CudaStreamGuard::~CudaStreamGuard() { Streams()[device_index_] = previous_; }

}  // namespace mesh
