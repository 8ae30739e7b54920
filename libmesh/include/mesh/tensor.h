// mesh::Tensor: a non-owning, strided view of memory on one device.
//
// A Tensor is what collectives read and write. It holds a data pointer, a
// dtype, a shape, strides and a device, like a DLPack DLTensor or a PyTorch
// tensor's metadata, and nothing else. It never copies, converts or frees
// data on its own. Ownership is optional and shared: a view may carry a
// "keep-alive" (a std::shared_ptr<void>) which every copy of the view, and
// every view derived from it (Narrow, ToDLPack), shares; the memory stays
// valid while any of them lives. Views made from raw pointers have none, and
// the caller keeps the memory alive.
//
//   data ──▶ element [0, 0, ...]   (any storage offset is already folded in)
//   element [i0, i1, ...] is at  data + (i0*stride[0] + i1*stride[1] + ...) * ElementSize(dtype)
//
// Strides count elements, not bytes, as in PyTorch. They are never negative;
// zero strides (broadcast views) are allowed for reading.
//
// Thread safety: Tensor is a value type. Copying and destroying views of the
// same memory from different threads is safe (the keep-alive is a
// shared_ptr); synchronising access to the elements is the caller's job.
// Constness follows std::span: a const Tensor is a view that cannot be
// re-pointed, not a view of const data.
//
// See docs/tensors.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "mesh/device.h"
#include "mesh/dtype.h"

namespace mesh {

// Shapes and strides. Six dimensions stay inline, which covers every tensor
// a collective sees in practice without a heap allocation per view.
using DimVector = absl::InlinedVector<int64_t, 6>;

// Row-major ("C-contiguous") strides for `shape`, in elements: the last
// dimension has stride 1. Dimensions of size 0 or 1 are treated as size 1
// when accumulating, so the result is what PyTorch reports for
// torch.empty(shape).stride(). Never fails; the caller validates shapes.
DimVector ContiguousStrides(absl::Span<const int64_t> shape);

class Tensor {
 public:
  // An empty 1-D float32 CPU tensor: shape [0], no data. Every operation on
  // it is a valid no-op, so a default-constructed member is harmless.
  Tensor();

  // Trusted construction for internal code that already knows the view is
  // valid. Aborts (MESH_CHECK) on anything Create would reject.
  Tensor(void* data, DType dtype, absl::Span<const int64_t> shape,
         absl::Span<const int64_t> strides, Device device,
         std::shared_ptr<void> keep_alive = nullptr);

  // Validated construction for views built from outside input.
  // Possible errors (all INVALID_ARGUMENT, each naming the offending dim):
  //   * a negative size;
  //   * strides.size() != shape.size();
  //   * a negative stride;
  //   * element count, byte size or largest element offset overflowing int64;
  //   * a null `data` for a tensor with at least one element.
  static absl::StatusOr<Tensor> Create(void* data, DType dtype, absl::Span<const int64_t> shape,
                                       absl::Span<const int64_t> strides, Device device,
                                       std::shared_ptr<void> keep_alive = nullptr);

  // Row-major view of `data`, for code that owns a buffer of the right size
  // (e.g. a std::vector). Aborts where Create would fail.
  static Tensor Contiguous(void* data, DType dtype, absl::Span<const int64_t> shape,
                           Device device = Device::Cpu(),
                           std::shared_ptr<void> keep_alive = nullptr);

  // Allocates an uninitialised row-major tensor that owns its memory through
  // the keep-alive: it is freed when the last view sharing it dies.
  //   * CPU: 64-byte aligned (cache line / AVX-512), size rounded up to 64;
  //     blocks of 64 KiB and more come from, and return to, a bounded cache
  //     of freed blocks (MESH_CPU_POOL_BYTES; docs/tensors.md).
  //   * CUDA: cudaMalloc on device.index() (256-byte aligned), freed with
  //     cudaFree on that same device whatever device is current then.
  // A zero-element tensor still gets a small, non-null allocation, because
  // some DLPack consumers reject null data pointers.
  // Possible errors:
  //   * INVALID_ARGUMENT for a bad shape or a byte size that overflows;
  //   * FAILED_PRECONDITION for a CUDA device when libmesh was built without
  //     CUDA, when no CUDA device is visible, or when the ordinal is not
  //     below the visible device count;
  //   * RESOURCE_EXHAUSTED when the allocation fails;
  //   * INTERNAL for any other CUDA error, with its name and string.
  // Thread safety: safe from any thread; the CUDA path restores the
  // calling thread's current device before it returns.
  static absl::StatusOr<Tensor> Empty(DType dtype, absl::Span<const int64_t> shape,
                                      Device device = Device::Cpu());

  // Empty, then every byte set to zero (which is 0, 0.0 or false for every
  // dtype). For CUDA, returns after the device memory is zeroed.
  // Possible errors: as Empty.
  static absl::StatusOr<Tensor> Zeros(DType dtype, absl::Span<const int64_t> shape,
                                      Device device = Device::Cpu());

  // ---- Metadata. -----------------------------------------------------------

  void* data() const { return data_; }
  // Typed access; no check that T matches dtype() (gloo-style void* APIs
  // and reinterpretation as raw bytes both need it unchecked).
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Device& device() const { return device_; }
  absl::Span<const int64_t> shape() const { return shape_; }
  absl::Span<const int64_t> strides() const { return strides_; }
  // size(d) and stride(d) abort for d outside [0, dim()).
  int64_t size(int d) const;
  int64_t stride(int d) const;
  int dim() const { return static_cast<int>(shape_.size()); }
  // Product of the shape (1 for a 0-dim scalar, 0 if any size is 0).
  int64_t numel() const { return numel_; }
  size_t element_size() const { return ElementSize(dtype_); }
  // numel() * element_size(): the bytes of the logical elements. It equals
  // the extent of memory the view covers only when is_contiguous().
  size_t nbytes() const { return static_cast<size_t>(numel_) * element_size(); }

  // True when the view is row-major with no gaps, so that nbytes() bytes
  // starting at data() are exactly its elements in order. As in PyTorch,
  // strides of size-1 dimensions are ignored and a zero-element tensor is
  // contiguous.
  bool is_contiguous() const;

  // The shared owner of the memory, or null for a borrowed view.
  const std::shared_ptr<void>& keep_alive() const { return keep_alive_; }

  // ---- Views. --------------------------------------------------------------

  // Elements [start, start + length) along dimension `dim`, as torch.narrow.
  // The result shares data and keep-alive. `start == size(dim)` with
  // `length == 0` is allowed (the empty trailing shard of torch.chunk).
  // Possible errors: INVALID_ARGUMENT when dim is outside [0, dim()), start
  // is outside [0, size(dim)], length < 0, or start + length > size(dim).
  absl::StatusOr<Tensor> Narrow(int dim, int64_t start, int64_t length) const;

  // "float32[2, 3] strides [3, 1] cuda:0", for logs and error messages.
  std::string DebugString() const;
  // "[2, 3]".
  std::string ShapeString() const;

  friend std::ostream& operator<<(std::ostream& os, const Tensor& t) {
    return os << t.DebugString();
  }

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kFloat32;
  DimVector shape_;
  DimVector strides_;
  Device device_;
  int64_t numel_ = 0;
  std::shared_ptr<void> keep_alive_;
};

// Copies the elements of `src` into `dst`, which must have the same dtype and
// shape (no broadcasting, no type conversion). Returns after the copy is
// complete, on CPU and CUDA alike.
//
// The rule for strides:
//   * CPU -> CPU: any strides on either side.
//   * A copy touching CUDA memory needs the CUDA side(s) contiguous. The
//     CPU side may have any strides: it is gathered into (or scattered from)
//     a contiguous host staging buffer around one cudaMemcpy.
//   * `dst` must not have a zero stride on a dimension longer than 1
//     (several elements would share one location), and `dst` and `src` must
//     not otherwise overlap, unless they are the same view (a no-op).
// Zero-element copies succeed without touching any device.
// Possible errors:
//   * INVALID_ARGUMENT: dtype or shape mismatch, or a zero-stride `dst`;
//   * UNIMPLEMENTED: a non-contiguous CUDA tensor;
//   * FAILED_PRECONDITION: CUDA tensors in a build without CUDA, or a device
//     that is not visible;
//   * INTERNAL: a CUDA error, with its name.
// Thread safety: safe from any thread for disjoint destinations.
absl::Status CopyTensor(const Tensor& dst, const Tensor& src);

// Whether the memory spans of `a` and `b` intersect: each span runs from
// data() to its last element's end (strides are non-negative), so two
// interleaved views count as overlapping even when no element is shared.
// False when either has no elements or they are on different devices.
bool SpansOverlap(const Tensor& a, const Tensor& b);

// Like CopyTensor, but a copy touching CUDA memory is only enqueued on
// `cuda_stream` (a cudaStream_t; nullptr is the legacy default stream) with
// cudaMemcpyAsync, and both sides must be contiguous (no staging buffer could
// outlive the call). The stream must belong to the CUDA side's device (dst's
// when both are CUDA). The caller keeps both tensors' memory alive and
// unmodified until the stream reaches the copy; for pageable host memory
// CUDA may complete the copy before returning. CPU -> CPU copies run
// synchronously and ignore the stream.
// Possible errors: as CopyTensor, plus UNIMPLEMENTED for a non-contiguous CPU
// side of a copy that touches CUDA memory.
absl::Status CopyTensorAsync(const Tensor& dst, const Tensor& src, void* cuda_stream);

// Sets every element of `t` to `value`, converted to t.dtype(): rounded to
// nearest even for f32 (out-of-range values become +-infinity), via float
// for f16/bf16 (so a value within a float ulp of a tie may round twice),
// `value != 0` for bool, and required to be an integer in range for integer
// dtypes. CPU tensors may have any strides; CUDA tensors must be contiguous
// (filled through a host staging buffer) and the call returns after the
// device memory is written. Meant for tests and initialisation, not hot
// paths.
// Possible errors: INVALID_ARGUMENT for a value the dtype cannot hold (NaN,
// infinity, a fraction or an out-of-range value for an integer dtype);
// otherwise as CopyTensor, for CUDA tensors.
absl::Status Fill(const Tensor& t, double value);

}  // namespace mesh
