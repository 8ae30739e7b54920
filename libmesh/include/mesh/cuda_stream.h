// The "current CUDA stream": which stream libmesh's CUDA backends order
// their work against, per host thread and per device.
//
// NCCL process groups (mesh/process_group_nccl.h) follow c10d's stream
// semantics. An op first makes the group's own stream wait for everything
// already enqueued on the caller's current stream (so the op sees the
// caller's writes to its tensors), and Work::Wait makes the caller's current
// stream wait for the op (so later work on it sees the result). Neither step
// blocks the host.
//
// The current stream is thread-local and kept per CUDA device. Unless a
// CudaStreamGuard says otherwise it is the legacy default stream (nullptr,
// CUDA's "stream 0") of that device, which is what plain cudaMemcpy,
// cudaMemset and kernel launches without a stream use; code that never
// touches streams therefore gets correct ordering without doing anything.
//
//   {
//     mesh::CudaStreamGuard guard(mesh::Device::Cuda(0), my_stream);
//     auto work = group->AllReduce(t, mesh::ReduceOp::kSum);  // waits for my_stream
//     (*work)->Wait();                                         // my_stream waits for it
//     my_kernel<<<..., my_stream>>>(t.data());                 // sees the sum
//   }
//
// Streams are type-erased (a cudaStream_t is a pointer) so that this header
// compiles in builds without CUDA. The special handles cudaStreamLegacy and
// cudaStreamPerThread are valid values too.
//
// Thread safety: every function acts on the calling thread's own state only.
#pragma once

#include "mesh/device.h"

namespace mesh {

// The calling thread's current stream for `device` (a cudaStream_t), or
// nullptr for the device's legacy default stream. `device` must be a CUDA
// device (checked: passing the CPU is a programmer error).
void* CurrentCudaStream(const Device& device);

// Makes `stream` the calling thread's current stream for `device` until the
// guard is destroyed, then restores the previous one. Guards nest; they must
// be destroyed on the thread that made them, in reverse order (they are
// scoped objects, so this is automatic). `stream` must belong to `device`
// and outlive the guard; libmesh does not check either, as CUDA offers no
// cheap way to (a foreign stream makes the ops' cudaEventRecord fail, which
// the op reports). `device` must be a CUDA device (checked).
class CudaStreamGuard {
 public:
  CudaStreamGuard(const Device& device, void* stream);
  ~CudaStreamGuard();

  CudaStreamGuard(const CudaStreamGuard&) = delete;
  CudaStreamGuard& operator=(const CudaStreamGuard&) = delete;

 private:
  const int device_index_;
  void* const previous_;
};

}  // namespace mesh
