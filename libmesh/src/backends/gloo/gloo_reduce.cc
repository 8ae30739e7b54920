#include "backends/gloo/gloo_reduce.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "mesh/float16.h"

namespace mesh::gloo_backend {
namespace {

// Integer arithmetic goes through the unsigned type, so overflow wraps
// instead of being undefined behaviour.
template <typename T>
T WrapAdd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}

template <typename T>
T WrapMul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  // uint8 promotes to int, where 255 * 255 cannot overflow; 32- and 64-bit
  // unsigned arithmetic wraps by definition.
  return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}

struct SumOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return WrapAdd(a, b);
    } else {
      return a + b;
    }
  }
};

struct ProdOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return WrapMul(a, b);
    } else {
      return a * b;
    }
  }
};

struct MinOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return (a < b || std::isnan(a)) ? a : b;
    } else {
      return b < a ? b : a;
    }
  }
};

struct MaxOp {
  template <typename T>
  static T Apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return (a > b || std::isnan(a)) ? a : b;
    } else {
      return a < b ? b : a;
    }
  }
};

template <typename T, typename Op>
void Reduce(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Op::Apply(x[i], y[i]);
}

// f16 / bf16: widen, combine in float, round back.
template <typename Half, typename Op>
void ReduceHalf(void* out, const void* a, const void* b, size_t n) {
  Half* o = static_cast<Half*>(out);
  const Half* x = static_cast<const Half*>(a);
  const Half* y = static_cast<const Half*>(b);
  for (size_t i = 0; i < n; ++i) {
    o[i] = Half(Op::Apply(static_cast<float>(x[i]), static_cast<float>(y[i])));
  }
}

// Logical and / or over bytes holding 0 or 1; any non-zero byte reads as
// true, and the result is always 0 or 1.
template <bool kAnd>
void ReduceBool(void* out, const void* a, const void* b, size_t n) {
  uint8_t* o = static_cast<uint8_t*>(out);
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    o[i] = kAnd ? static_cast<uint8_t>(x[i] != 0 && y[i] != 0)
                : static_cast<uint8_t>(x[i] != 0 || y[i] != 0);
  }
}

template <typename Op>
ReduceFn ForDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return &Reduce<float, Op>;
    case DType::kFloat64:
      return &Reduce<double, Op>;
    case DType::kFloat16:
      return &ReduceHalf<Float16, Op>;
    case DType::kBFloat16:
      return &ReduceHalf<BFloat16, Op>;
    case DType::kInt8:
      return &Reduce<int8_t, Op>;
    case DType::kUInt8:
      return &Reduce<uint8_t, Op>;
    case DType::kInt32:
      return &Reduce<int32_t, Op>;
    case DType::kInt64:
      return &Reduce<int64_t, Op>;
    case DType::kBool:
      break;  // Handled by the caller.
  }
  return nullptr;
}

template <typename T>
void Divide(void* data, size_t count, int divisor) {
  T* p = static_cast<T*>(data);
  if constexpr (std::is_integral_v<T>) {
    // C++ integer division truncates toward zero, as the header promises.
    const T d = static_cast<T>(divisor);
    for (size_t i = 0; i < count; ++i) p[i] = static_cast<T>(p[i] / d);
  } else {
    const T d = static_cast<T>(divisor);
    for (size_t i = 0; i < count; ++i) p[i] = p[i] / d;
  }
}

template <typename Half>
void DivideHalf(void* data, size_t count, int divisor) {
  Half* p = static_cast<Half*>(data);
  const float d = static_cast<float>(divisor);
  for (size_t i = 0; i < count; ++i) p[i] = Half(static_cast<float>(p[i]) / d);
}

}  // namespace

absl::Status CheckReduceSupported(DType dtype, ReduceOp op) {
  if (dtype == DType::kBool && op != ReduceOp::kMin && op != ReduceOp::kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce op '", ReduceOpName(op),
                     "' is not defined for bool; use min (logical and) or "
                     "max (logical or)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ReduceFn> MakeReduceFn(DType dtype, ReduceOp op) {
  if (absl::Status s = CheckReduceSupported(dtype, op); !s.ok()) return s;
  if (dtype == DType::kBool) {
    return op == ReduceOp::kMin ? ReduceFn(&ReduceBool<true>) : ReduceFn(&ReduceBool<false>);
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return ForDType<SumOp>(dtype);
    case ReduceOp::kProd:
      return ForDType<ProdOp>(dtype);
    case ReduceOp::kMin:
      return ForDType<MinOp>(dtype);
    case ReduceOp::kMax:
      return ForDType<MaxOp>(dtype);
  }
  return absl::InvalidArgumentError("unknown reduce op");
}

void DivideInPlace(DType dtype, void* data, size_t count, int divisor) {
  switch (dtype) {
    case DType::kFloat32:
      return Divide<float>(data, count, divisor);
    case DType::kFloat64:
      return Divide<double>(data, count, divisor);
    case DType::kFloat16:
      return DivideHalf<Float16>(data, count, divisor);
    case DType::kBFloat16:
      return DivideHalf<BFloat16>(data, count, divisor);
    case DType::kInt8:
      return Divide<int8_t>(data, count, divisor);
    case DType::kUInt8:
      return Divide<uint8_t>(data, count, divisor);
    case DType::kInt32:
      return Divide<int32_t>(data, count, divisor);
    case DType::kInt64:
      return Divide<int64_t>(data, count, divisor);
    case DType::kBool:
      return;  // Rejected before any op runs.
  }
}

}  // namespace mesh::gloo_backend
