#include "mesh/dtype.h"

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mesh {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  const char* short_name;
  uint8_t dl_code;
  uint8_t bits;
};

// DLPack 0.6 (Debian's libdlpack-dev) has no bool type code; kDLBool (6)
// arrived in 0.8. Use it when the header has it, else travel as uint8.
#if DLPACK_VERSION >= 80
constexpr uint8_t kBoolCode = kDLBool;
#else
constexpr uint8_t kBoolCode = kDLUInt;
#endif

constexpr DTypeInfo kInfo[] = {
    {DType::kFloat32, "float32", "f32", kDLFloat, 32},
    {DType::kFloat64, "float64", "f64", kDLFloat, 64},
    {DType::kFloat16, "float16", "f16", kDLFloat, 16},
    {DType::kBFloat16, "bfloat16", "bf16", kDLBfloat, 16},
    {DType::kInt8, "int8", "i8", kDLInt, 8},
    {DType::kUInt8, "uint8", "u8", kDLUInt, 8},
    {DType::kInt32, "int32", "i32", kDLInt, 32},
    {DType::kInt64, "int64", "i64", kDLInt, 64},
    {DType::kBool, "bool", "bool", kBoolCode, 8},
};

const DTypeInfo& Info(DType dtype) {
  const auto index = static_cast<size_t>(dtype);
  if (index >= std::size(kInfo)) std::abort();  // Not a valid enumerator.
  return kInfo[index];
}

}  // namespace

size_t ElementSize(DType dtype) { return Info(dtype).bits / 8; }

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const DTypeInfo& info : kInfo) {
    if (name == info.name || name == info.short_name) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name,
                   "': expected one of float32, float64, float16, bfloat16, int8, uint8, "
                   "int32, int64, bool"));
}

bool IsFloatingPoint(DType dtype) {
  const uint8_t code = Info(dtype).dl_code;
  return code == kDLFloat || code == kDLBfloat;
}

DLDataType ToDLDataType(DType dtype) {
  const DTypeInfo& info = Info(dtype);
  return DLDataType{info.dl_code, info.bits, 1};
}

absl::StatusOr<DType> FromDLDataType(DLDataType type) {
  if (type.lanes != 1) {
    return absl::InvalidArgumentError(absl::StrCat("DLPack tensors with ", type.lanes,
                                                   " lanes are not supported; lanes must be 1"));
  }
  for (const DTypeInfo& info : kInfo) {
    // uint8 and (in old DLPack) bool share a code; the first match, uint8,
    // wins, which is the only safe reading of such a tensor.
    if (info.dl_code == type.code && info.bits == type.bits) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported DLPack dtype (code ", type.code, ", ", type.bits, " bits)"));
}

}  // namespace mesh
