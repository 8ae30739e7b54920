// CUDA memory helpers behind mesh::Tensor: allocation, copies and memset on a
// named device. Private to libmesh.
//
// The header is CUDA-free so that tensor.cc compiles in every build; the
// definitions (cuda_memory.cc) exist only when MESH_HAVE_CUDA, and callers
// must not reference them otherwise.
//
// Every function makes `device` current for its duration and restores the
// thread's previous current device before returning, so callers on a
// thread that drives another GPU are not disturbed.
//
// Errors: FAILED_PRECONDITION when no CUDA device is visible or `device` is
// not below the visible count; RESOURCE_EXHAUSTED when cudaMalloc runs out of
// memory; INTERNAL with the CUDA error name and string otherwise.
//
// Thread safety: safe from any thread.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mesh::cuda {

// FAILED_PRECONDITION unless `device` is a visible CUDA ordinal.
absl::Status CheckDevice(int device);

// cudaMalloc of max(bytes, 1) bytes on `device`.
absl::StatusOr<void*> Malloc(int device, size_t bytes);

// cudaFree on `device`. Errors are ignored: this runs from destructors, and
// at process exit the runtime may already be unloading
// (cudaErrorCudartUnloading), when leaking is the only correct action.
void Free(int device, void* ptr) noexcept;

// cudaMemset, then waits for it (the legacy default stream) to finish.
absl::Status Memset(int device, void* ptr, int value, size_t bytes);

// cudaMemcpy with cudaMemcpyDefault (unified addressing picks the
// direction), then waits for the legacy default stream, because a
// device-to-device cudaMemcpy may return before the copy is done.
absl::Status Memcpy(int device, void* dst, const void* src, size_t bytes);

// cudaMemcpyAsync with cudaMemcpyDefault on `stream` (a cudaStream_t).
absl::Status MemcpyAsync(int device, void* dst, const void* src, size_t bytes, void* stream);

}  // namespace mesh::cuda
