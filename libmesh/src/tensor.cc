#include "mesh/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/cuda/cuda_memory.h"
#include "common/check.h"
#include "cpu_pool.h"
#include "mesh/config.h"
#include "mesh/float16.h"

namespace mesh {
namespace {

// Validates a view's metadata and computes its element count. Everything the
// copy and DLPack code later multiplies is checked here once, so they can use
// plain int64 arithmetic.
absl::StatusOr<int64_t> ValidateView(const void* data, DType dtype, absl::Span<const int64_t> shape,
                                     absl::Span<const int64_t> strides) {
  if (strides.size() != shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid tensor: shape [", absl::StrJoin(shape, ", "), "] has ", shape.size(),
        " dims but strides [", absl::StrJoin(strides, ", "), "] have ", strides.size()));
  }
  int64_t numel = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("invalid tensor: shape [",
                                                     absl::StrJoin(shape, ", "),
                                                     "] has a negative size at dim ", d));
    }
    if (strides[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid tensor: strides [", absl::StrJoin(strides, ", "),
          "] have a negative stride at dim ", d, "; negative strides are not supported"));
    }
    if (__builtin_mul_overflow(numel, shape[d], &numel)) {
      return absl::InvalidArgumentError(absl::StrCat("invalid tensor: element count of shape [",
                                                     absl::StrJoin(shape, ", "), "] overflows"));
    }
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(ElementSize(dtype)), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid tensor: byte size of shape [",
                                                   absl::StrJoin(shape, ", "), "] overflows"));
  }
  if (numel > 0) {
    // Largest element offset, in bytes, must be addressable.
    int64_t max_offset = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      int64_t term = 0;
      if (__builtin_mul_overflow(shape[d] - 1, strides[d], &term) ||
          __builtin_add_overflow(max_offset, term, &max_offset)) {
        max_offset = -1;
        break;
      }
    }
    if (max_offset < 0 ||
        __builtin_mul_overflow(max_offset, static_cast<int64_t>(ElementSize(dtype)), &bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid tensor: shape [", absl::StrJoin(shape, ", "), "] with strides [",
                       absl::StrJoin(strides, ", "), "] spans more than 2^63 bytes"));
    }
    if (data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid tensor: null data pointer for a tensor with ", numel, " elements"));
    }
  }
  return numel;
}

// ---- Strided iteration. ------------------------------------------------------
//
// A layout reduced to what the loops need: dims of size 1 dropped, and
// neighbouring dims merged where every operand steps through them as one.
// Byte strides, innermost dim last.
struct Loop {
  DimVector sizes;
  std::vector<DimVector> strides;  // One per operand, in bytes.
};

Loop MakeLoop(absl::Span<const int64_t> shape, std::initializer_list<const Tensor*> operands) {
  Loop loop;
  loop.strides.resize(operands.size());
  // Walk outermost to innermost; merge dim d into the previous kept dim p
  // when stride[p] == stride[d] * size[d] for every operand.
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !loop.sizes.empty();
    size_t k = 0;
    for (const Tensor* t : operands) {
      const int64_t stride =
          t->stride(static_cast<int>(d)) * static_cast<int64_t>(t->element_size());
      if (merge && loop.strides[k].back() != stride * shape[d]) merge = false;
      ++k;
    }
    if (merge) {
      loop.sizes.back() *= shape[d];
      k = 0;
      for (const Tensor* t : operands) {
        loop.strides[k].back() =
            t->stride(static_cast<int>(d)) * static_cast<int64_t>(t->element_size());
        ++k;
      }
    } else {
      loop.sizes.push_back(shape[d]);
      k = 0;
      for (const Tensor* t : operands) {
        loop.strides[k].push_back(t->stride(static_cast<int>(d)) *
                                  static_cast<int64_t>(t->element_size()));
        ++k;
      }
    }
  }
  if (loop.sizes.empty()) {  // A single element (all sizes 1, or 0-dim).
    loop.sizes.push_back(1);
    for (DimVector& s : loop.strides) s.push_back(0);
  }
  return loop;
}

// Calls body(offsets, n) for each innermost row, where offsets[k] is the
// byte offset of the row's first element in operand k and n the row length.
template <size_t N, typename Body>
void ForEachRow(const Loop& loop, Body&& body) {
  const size_t outer = loop.sizes.size() - 1;
  DimVector index(outer, 0);
  int64_t offsets[N] = {};
  while (true) {
    body(offsets, loop.sizes[outer]);
    // Odometer over the outer dims, innermost outer dim fastest.
    size_t d = outer;
    while (d > 0) {
      --d;
      for (size_t k = 0; k < N; ++k) offsets[k] += loop.strides[k][d];
      if (++index[d] < loop.sizes[d]) break;
      for (size_t k = 0; k < N; ++k) offsets[k] -= loop.strides[k][d] * loop.sizes[d];
      index[d] = 0;
      if (d == 0) return;
    }
    if (outer == 0) return;
  }
}

template <size_t kBytes>
void CopyRow(char* dst, int64_t dst_stride, const char* src, int64_t src_stride, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * dst_stride, src + i * src_stride, kBytes);
  }
}

void CopyCpu(const Tensor& dst, const Tensor& src) {
  const size_t es = dst.element_size();
  if (dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.data(), src.data(), dst.nbytes());
    return;
  }
  const Loop loop = MakeLoop(dst.shape(), {&dst, &src});
  const int64_t ds = loop.strides[0].back();
  const int64_t ss = loop.strides[1].back();
  char* const dst_base = static_cast<char*>(dst.data());
  const char* const src_base = static_cast<const char*>(src.data());
  ForEachRow<2>(loop, [&](const int64_t* offsets, int64_t n) {
    char* d = dst_base + offsets[0];
    const char* s = src_base + offsets[1];
    if (ds == static_cast<int64_t>(es) && ss == static_cast<int64_t>(es)) {
      std::memcpy(d, s, static_cast<size_t>(n) * es);
      return;
    }
    switch (es) {
      case 1:
        CopyRow<1>(d, ds, s, ss, n);
        break;
      case 2:
        CopyRow<2>(d, ds, s, ss, n);
        break;
      case 4:
        CopyRow<4>(d, ds, s, ss, n);
        break;
      case 8:
        CopyRow<8>(d, ds, s, ss, n);
        break;
      default:
        MESH_CHECK(false, "unexpected element size");
    }
  });
}

// Writes `es` bytes of `pattern` to every element of a CPU tensor.
void FillCpu(const Tensor& t, const unsigned char* pattern, size_t es) {
  const Loop loop = MakeLoop(t.shape(), {&t});
  const int64_t stride = loop.strides[0].back();
  char* const base = static_cast<char*>(t.data());
  ForEachRow<1>(loop, [&](const int64_t* offsets, int64_t n) {
    char* row = base + offsets[0];
    for (int64_t i = 0; i < n; ++i) std::memcpy(row + i * stride, pattern, es);
  });
}

bool SameView(const Tensor& a, const Tensor& b) {
  return a.data() == b.data() && a.device() == b.device() &&
         std::equal(a.strides().begin(), a.strides().end(), b.strides().begin(), b.strides().end());
}

absl::Status CheckCopyArgs(const char* op, const Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": dtype mismatch: dst is ",
                                                   DTypeName(dst.dtype()), ", src is ",
                                                   DTypeName(src.dtype())));
  }
  if (!std::equal(dst.shape().begin(), dst.shape().end(), src.shape().begin(), src.shape().end())) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": shape mismatch: dst is ", dst.ShapeString(), ", src is ", src.ShapeString()));
  }
  for (int d = 0; d < dst.dim(); ++d) {
    if (dst.stride(d) == 0 && dst.size(d) > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": dst ", dst.DebugString(), " has stride 0 at dim ", d,
                       ", so several elements would be written to one location"));
    }
  }
  return absl::OkStatus();
}

absl::Status NonContiguousCuda(const char* op, const char* which, const Tensor& t) {
  return absl::UnimplementedError(
      absl::StrCat(op, ": ", which, " ", t.DebugString(),
                   " is a non-contiguous CUDA tensor; copies touching CUDA memory need the CUDA "
                   "side contiguous (make it contiguous on the device first)"));
}

#if !MESH_HAVE_CUDA
absl::Status NoCuda(const Device& device) {
  return absl::FailedPreconditionError(
      absl::StrCat("libmesh was built without CUDA (MESH_HAVE_CUDA=0), so ", device.ToString(),
                   " memory cannot be used; rebuild with MESH_WITH_CUDA=ON or use the cpu device"));
}
#endif

// The one entry point from tensor code into the CUDA helpers. `device` is
// the CUDA side of the transfer.
absl::Status CudaMemcpy(const Device& device, void* dst, const void* src, size_t bytes, bool async,
                        void* stream) {
#if MESH_HAVE_CUDA
  return async ? cuda::MemcpyAsync(device.index(), dst, src, bytes, stream)
               : cuda::Memcpy(device.index(), dst, src, bytes);
#else
  (void)dst, (void)src, (void)bytes, (void)async, (void)stream;
  return NoCuda(device);
#endif
}

absl::StatusOr<std::shared_ptr<void>> Allocate(size_t bytes, const Device& device) {
  if (device.is_cpu()) {
    // From the CPU buffer pool (cpu_pool.h): 64-byte aligned, size rounded
    // up, returned to the pool when the last view dies.
    std::shared_ptr<void> p = internal::CpuPool::Global().Allocate(bytes);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of cpu memory"));
    }
    return p;
  }
#if MESH_HAVE_CUDA
  absl::StatusOr<void*> p = cuda::Malloc(device.index(), bytes);
  if (!p.ok()) return p.status();
  const int index = device.index();
  return std::shared_ptr<void>(*p, [index](void* q) { cuda::Free(index, q); });
#else
  return NoCuda(device);
#endif
}

}  // namespace

DimVector ContiguousStrides(absl::Span<const int64_t> shape) {
  DimVector strides(shape.size());
  // Unsigned arithmetic: wraps instead of overflowing on shapes Create will
  // reject anyway.
  uint64_t running = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = static_cast<int64_t>(running);
    if (shape[i] > 1) running *= static_cast<uint64_t>(shape[i]);
  }
  return strides;
}

Tensor::Tensor() : shape_{0}, strides_{1} {}

Tensor::Tensor(void* data, DType dtype, absl::Span<const int64_t> shape,
               absl::Span<const int64_t> strides, Device device, std::shared_ptr<void> keep_alive)
    : data_(data),
      dtype_(dtype),
      shape_(shape.begin(), shape.end()),
      strides_(strides.begin(), strides.end()),
      device_(device),
      keep_alive_(std::move(keep_alive)) {
  absl::StatusOr<int64_t> numel = ValidateView(data, dtype, shape, strides);
  MESH_CHECK(numel.ok(), std::string(numel.status().message()).c_str());
  numel_ = *numel;
}

absl::StatusOr<Tensor> Tensor::Create(void* data, DType dtype, absl::Span<const int64_t> shape,
                                      absl::Span<const int64_t> strides, Device device,
                                      std::shared_ptr<void> keep_alive) {
  if (absl::StatusOr<int64_t> numel = ValidateView(data, dtype, shape, strides); !numel.ok()) {
    return numel.status();
  }
  return Tensor(data, dtype, shape, strides, device, std::move(keep_alive));
}

Tensor Tensor::Contiguous(void* data, DType dtype, absl::Span<const int64_t> shape, Device device,
                          std::shared_ptr<void> keep_alive) {
  return Tensor(data, dtype, shape, ContiguousStrides(shape), device, std::move(keep_alive));
}

absl::StatusOr<Tensor> Tensor::Empty(DType dtype, absl::Span<const int64_t> shape, Device device) {
  const DimVector strides = ContiguousStrides(shape);
  // Validate with a stand-in pointer: the memory does not exist yet.
  static char placeholder;
  absl::StatusOr<int64_t> numel = ValidateView(&placeholder, dtype, shape, strides);
  if (!numel.ok()) return numel.status();
  const size_t bytes = static_cast<size_t>(*numel) * ElementSize(dtype);
  absl::StatusOr<std::shared_ptr<void>> memory = Allocate(bytes, device);
  if (!memory.ok()) return memory.status();
  void* data = memory->get();
  return Tensor(data, dtype, shape, strides, device, *std::move(memory));
}

absl::StatusOr<Tensor> Tensor::Zeros(DType dtype, absl::Span<const int64_t> shape, Device device) {
  absl::StatusOr<Tensor> t = Empty(dtype, shape, device);
  if (!t.ok()) return t;
  if (device.is_cpu()) {
    std::memset(t->data(), 0, t->nbytes());
    return t;
  }
#if MESH_HAVE_CUDA
  if (absl::Status s = cuda::Memset(device.index(), t->data(), 0, t->nbytes()); !s.ok()) return s;
#endif
  return t;
}

int64_t Tensor::size(int d) const {
  MESH_CHECK(d >= 0 && d < dim(), "Tensor::size: dim out of range");
  return shape_[d];
}

int64_t Tensor::stride(int d) const {
  MESH_CHECK(d >= 0 && d < dim(), "Tensor::stride: dim out of range");
  return strides_[d];
}

bool Tensor::is_contiguous() const {
  if (numel_ == 0) return true;
  int64_t expected = 1;
  for (int d = dim(); d-- > 0;) {
    if (shape_[d] == 1) continue;
    if (strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

absl::StatusOr<Tensor> Tensor::Narrow(int d, int64_t start, int64_t length) const {
  if (d < 0 || d >= dim()) {
    return absl::InvalidArgumentError(absl::StrCat("Narrow: dim ", d, " is out of range for ",
                                                   DebugString(), " (", dim(), " dims)"));
  }
  const int64_t size = shape_[d];
  if (start < 0 || start > size || length < 0 || length > size - start) {
    return absl::InvalidArgumentError(absl::StrCat("Narrow: elements [", start, ", ", start, " + ",
                                                   length, ") of dim ", d, " are outside [0, ",
                                                   size, ") for ", DebugString()));
  }
  Tensor out = *this;
  out.shape_[d] = length;
  out.numel_ = size == 0 ? 0 : numel_ / size * length;
  // Byte arithmetic on uintptr_t: a zero-length view at the end may point
  // one past the last element, which is fine to hold but not to dereference.
  const auto byte_offset =
      static_cast<uintptr_t>(start) * static_cast<uintptr_t>(strides_[d]) * element_size();
  if (out.data_ != nullptr) {
    out.data_ = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(data_) + byte_offset);
  }
  return out;
}

std::string Tensor::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape_, ", "), "]");
}

std::string Tensor::DebugString() const {
  return absl::StrCat(DTypeName(dtype_), ShapeString(), " strides [", absl::StrJoin(strides_, ", "),
                      "] ", device_.ToString());
}

bool SpansOverlap(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || !(a.device() == b.device())) return false;
  // As integers: pointers into unrelated objects do not compare with <.
  auto begin = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()); };
  auto end = [&](const Tensor& t) {
    int64_t last = 0;
    for (int d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    return begin(t) + static_cast<uintptr_t>((last + 1) * static_cast<int64_t>(t.element_size()));
  };
  return begin(a) < end(b) && begin(b) < end(a);
}

absl::Status CopyTensor(const Tensor& dst, const Tensor& src) {
  static constexpr char kOp[] = "CopyTensor";
  if (absl::Status s = CheckCopyArgs(kOp, dst, src); !s.ok()) return s;
  if (dst.numel() == 0 || SameView(dst, src)) return absl::OkStatus();
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    CopyCpu(dst, src);
    return absl::OkStatus();
  }
  if (dst.device().is_cuda() && !dst.is_contiguous()) return NonContiguousCuda(kOp, "dst", dst);
  if (src.device().is_cuda() && !src.is_contiguous()) return NonContiguousCuda(kOp, "src", src);
  const Device& cuda_device = dst.device().is_cuda() ? dst.device() : src.device();
  if (dst.is_contiguous() && src.is_contiguous()) {
    return CudaMemcpy(cuda_device, dst.data(), src.data(), dst.nbytes(), false, nullptr);
  }
  // Exactly one side is a non-contiguous CPU tensor: stage through a
  // contiguous host buffer.
  absl::StatusOr<Tensor> staging = Tensor::Empty(dst.dtype(), dst.shape(), Device::Cpu());
  if (!staging.ok()) return staging.status();
  if (src.device().is_cpu()) {  // Gather, then host -> device.
    CopyCpu(*staging, src);
    return CudaMemcpy(cuda_device, dst.data(), staging->data(), dst.nbytes(), false, nullptr);
  }
  // Device -> host, then scatter.
  if (absl::Status s =
          CudaMemcpy(cuda_device, staging->data(), src.data(), src.nbytes(), false, nullptr);
      !s.ok()) {
    return s;
  }
  CopyCpu(dst, *staging);
  return absl::OkStatus();
}

absl::Status CopyTensorAsync(const Tensor& dst, const Tensor& src, void* cuda_stream) {
  static constexpr char kOp[] = "CopyTensorAsync";
  if (absl::Status s = CheckCopyArgs(kOp, dst, src); !s.ok()) return s;
  if (dst.numel() == 0 || SameView(dst, src)) return absl::OkStatus();
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    CopyCpu(dst, src);
    return absl::OkStatus();
  }
  for (const auto& [which, t] : {std::pair<const char*, const Tensor*>{"dst", &dst},
                                 std::pair<const char*, const Tensor*>{"src", &src}}) {
    if (t->is_contiguous()) continue;
    if (t->device().is_cuda()) return NonContiguousCuda(kOp, which, *t);
    return absl::UnimplementedError(absl::StrCat(
        kOp, ": ", which, " ", t->DebugString(),
        " is a non-contiguous CPU tensor in a copy touching CUDA memory; use CopyTensor, which "
        "stages it, or pass a contiguous tensor"));
  }
  const Device& cuda_device = dst.device().is_cuda() ? dst.device() : src.device();
  return CudaMemcpy(cuda_device, dst.data(), src.data(), dst.nbytes(), true, cuda_stream);
}

namespace {

// double -> float rounding to nearest even, with out-of-range values going to
// infinity explicitly: a plain cast of an out-of-range double is undefined.
float DoubleToFloat(double value) {
  // FLT_MAX plus half its ulp: at and beyond it, round-to-nearest-even gives
  // infinity (FLT_MAX has an odd significand, so the tie goes up).
  constexpr double kOverflow = static_cast<double>(std::numeric_limits<float>::max()) + 0x1p103;
  if (std::isfinite(value) && std::fabs(value) >= kOverflow) {
    return std::signbit(value) ? -std::numeric_limits<float>::infinity()
                               : std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(value);
}

// `value` as the bytes of one element of `dtype`.
absl::Status EncodeScalar(DType dtype, double value, unsigned char* out) {
  auto integer = [&](auto type_tag) -> absl::Status {
    using T = decltype(type_tag);
    // The bounds as doubles: min is a power of two (exact); max + 1 is too.
    constexpr double kMin = static_cast<double>(std::numeric_limits<T>::min());
    constexpr double kMaxPlusOne = static_cast<double>(std::numeric_limits<T>::max() / 2 + 1) * 2;
    if (!(value >= kMin && value < kMaxPlusOne) || std::trunc(value) != value) {
      return absl::InvalidArgumentError(
          absl::StrCat("Fill: value ", value, " is not representable as ", DTypeName(dtype)));
    }
    const T v = static_cast<T>(value);
    std::memcpy(out, &v, sizeof(v));
    return absl::OkStatus();
  };
  switch (dtype) {
    case DType::kFloat32: {
      const float v = DoubleToFloat(value);
      std::memcpy(out, &v, sizeof(v));
      return absl::OkStatus();
    }
    case DType::kFloat64:
      std::memcpy(out, &value, sizeof(value));
      return absl::OkStatus();
    case DType::kFloat16: {
      const Float16 v(DoubleToFloat(value));
      std::memcpy(out, &v, sizeof(v));
      return absl::OkStatus();
    }
    case DType::kBFloat16: {
      const BFloat16 v(DoubleToFloat(value));
      std::memcpy(out, &v, sizeof(v));
      return absl::OkStatus();
    }
    case DType::kInt8:
      return integer(int8_t{});
    case DType::kUInt8:
      return integer(uint8_t{});
    case DType::kInt32:
      return integer(int32_t{});
    case DType::kInt64:
      return integer(int64_t{});
    case DType::kBool:
      out[0] = value != 0 ? 1 : 0;
      return absl::OkStatus();
  }
  MESH_CHECK(false, "unknown dtype");
  return absl::InternalError("unreachable");
}

}  // namespace

absl::Status Fill(const Tensor& t, double value) {
  unsigned char pattern[8];
  if (absl::Status s = EncodeScalar(t.dtype(), value, pattern); !s.ok()) return s;
  if (t.numel() == 0) return absl::OkStatus();
  if (t.device().is_cpu()) {
    FillCpu(t, pattern, t.element_size());
    return absl::OkStatus();
  }
  if (!t.is_contiguous()) return NonContiguousCuda("Fill", "tensor", t);
  absl::StatusOr<Tensor> staging = Tensor::Empty(t.dtype(), t.shape(), Device::Cpu());
  if (!staging.ok()) return staging.status();
  FillCpu(*staging, pattern, t.element_size());
  return CudaMemcpy(t.device(), t.data(), staging->data(), t.nbytes(), false, nullptr);
}

}  // namespace mesh
