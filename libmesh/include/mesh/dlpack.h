// Zero-copy conversion between mesh::Tensor and DLPack (0.6, the
// DLManagedTensor protocol), the format PyTorch, JAX, CuPy and NumPy exchange.
//
// Ownership follows the DLPack contract: whoever holds a DLManagedTensor
// calls its deleter exactly once when done with it.
//   * FromDLPack consumes the DLManagedTensor. Its deleter runs when the last
//     Tensor view sharing the import dies, or before FromDLPack returns if
//     the import fails.
//   * ToDLPack produces a DLManagedTensor that shares the tensor's
//     keep-alive; the consumer calls its deleter, which releases that share
//     and the shape/strides arrays.
// Data is never copied: the data pointers on both sides are identical.
//
// dtype mapping (mesh/dtype.h): bool travels as kDLUInt, 8 bits, because
// DLPack 0.6 has no kDLBool; that is also what PyTorch < 1.10 emitted for
// bool. Importing (kDLUInt, 8) therefore yields uint8, except for a tensor
// that libmesh itself exported, which comes back as bool. Code 6 with 8 bits
// (kDLBool of DLPack >= 0.8, as PyTorch >= 2.2 emits) is imported as bool.
//
// Thread safety: both functions are safe from any thread. The deleters they
// install may run on any thread.
//
// See docs/tensors.md.
#pragma once

#include <memory>

#include <dlpack/dlpack.h>

#include "absl/status/statusor.h"
#include "mesh/tensor.h"

namespace mesh {

// Takes ownership of `managed` and returns a view of its memory whose
// keep-alive calls managed->deleter (when non-null) once the last copy of the
// view is gone.
//
// Accepted devices: kDLCPU and kDLCUDAHost (pinned host memory, seen as
// cpu), kDLCUDA (cuda:device_id). strides == NULL means row-major;
// byte_offset is added to data.
// Possible errors (INVALID_ARGUMENT; the deleter has already run):
//   * `managed` is null (nothing to delete);
//   * another device type (ROCm, Metal, CUDA managed, ...), named;
//   * a negative CUDA device_id;
//   * a dtype libmesh does not support, or lanes != 1;
//   * ndim < 0, or shape NULL with ndim > 0;
//   * a shape or strides that Tensor::Create rejects (negative strides
//     included).
absl::StatusOr<Tensor> FromDLPack(DLManagedTensor* managed);

// Exports `tensor` without copying. The result is never null. It holds a
// share of tensor.keep_alive(), so an owning tensor's memory stays valid
// until the consumer calls the deleter even if every mesh::Tensor is gone;
// for a borrowed view the caller must keep the memory alive that long.
// Strides are always filled in; byte_offset is 0 and data == tensor.data().
DLManagedTensor* ToDLPack(const Tensor& tensor);

// unique_ptr that calls a DLManagedTensor's deleter, for C++ code that holds
// an export without handing it on.
struct DLManagedTensorDeleter {
  void operator()(DLManagedTensor* managed) const {
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  }
};
using DLManagedTensorPtr = std::unique_ptr<DLManagedTensor, DLManagedTensorDeleter>;

}  // namespace mesh
