// Element types of libmesh tensors.
//
// The set matches what collectives and DLPack exchange in practice:
// f32, f64, f16, bf16, i8, u8, i32, i64 and bool.
#pragma once

#include <cstddef>
#include <cstdint>

#include <dlpack/dlpack.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mesh {

enum class DType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kBool,
};

// All dtypes, in declaration order; handy for parameterized tests.
inline constexpr DType kAllDTypes[] = {DType::kFloat32,  DType::kFloat64, DType::kFloat16,
                                       DType::kBFloat16, DType::kInt8,    DType::kUInt8,
                                       DType::kInt32,    DType::kInt64,   DType::kBool};

// Bytes per element: 4, 8, 2, 2, 1, 1, 4, 8, 1.
size_t ElementSize(DType dtype);

// Short, stable names as used by PyTorch: "float32", "bfloat16", "bool", ...
absl::string_view DTypeName(DType dtype);

// Inverse of DTypeName; also accepts the short forms "f32", "f64", "f16",
// "bf16", "i8", "u8", "i32", "i64".
// Possible errors: INVALID_ARGUMENT for an unknown name.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// True for the floating-point dtypes (f32, f64, f16, bf16).
bool IsFloatingPoint(DType dtype);

// DLPack type descriptor with lanes = 1.
DLDataType ToDLDataType(DType dtype);

// Inverse of ToDLDataType.
// Possible errors: INVALID_ARGUMENT for vector lanes or a type libmesh does
// not support (complex, float8, uint16, ...).
absl::StatusOr<DType> FromDLDataType(DLDataType type);

}  // namespace mesh
