// Element-wise reduction kernels for the Gloo backend (internal).
//
// gloo takes a type-erased reduction, void(out, a, b, n), because its
// algorithms only move bytes; these are ours, one per (dtype, op):
//
//   kSum, kAvg  a + b. Integers wrap around (two's complement, as PyTorch),
//               never undefined behaviour. kAvg reduces with kSum; the caller
//               divides the result by the group size (DivideInPlace).
//   kProd       a * b, wrapping for integers.
//   kMin, kMax  NaN-propagating for floating point (as torch.minimum /
//               torch.maximum). For bool: logical and / or.
//   f16, bf16   widened to float, combined, rounded back to nearest even. A
//               ring passes partial results between ranks in the tensor's
//               own dtype, so accumulation is float within each step and
//               16-bit between steps (PyTorch's Gloo backend does the same).
//   bool        only kMin / kMax; kSum, kAvg and kProd are INVALID_ARGUMENT
//               (mesh/process_group.h).
//
// `out` may alias `a` or `b` exactly (gloo reduces in place); partial
// overlap is not allowed.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mesh/dtype.h"
#include "mesh/process_group.h"

namespace mesh::gloo_backend {

using ReduceFn = std::function<void(void* out, const void* a, const void* b, size_t n)>;

// OK, or INVALID_ARGUMENT naming the dtype and op (bool with sum/avg/prod).
absl::Status CheckReduceSupported(DType dtype, ReduceOp op);

// The kernel for (dtype, op); kAvg gives the kSum kernel.
// Possible errors: as CheckReduceSupported.
absl::StatusOr<ReduceFn> MakeReduceFn(DType dtype, ReduceOp op);

// data[i] /= divisor for `count` elements: floating point divides (f16/bf16
// in float, rounded back); integers truncate toward zero. Not for bool.
void DivideInPlace(DType dtype, void* data, size_t count, int divisor);

}  // namespace mesh::gloo_backend
