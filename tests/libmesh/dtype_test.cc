#include "mesh/dtype.h"

#include <gtest/gtest.h>

namespace mesh {
namespace dtype_test {

TEST(DType, ElementSizesMatchTheCTypes) {
  EXPECT_EQ(ElementSize(DType::kFloat32), sizeof(float));
  EXPECT_EQ(ElementSize(DType::kFloat64), sizeof(double));
  EXPECT_EQ(ElementSize(DType::kFloat16), 2u);
  EXPECT_EQ(ElementSize(DType::kBFloat16), 2u);
  EXPECT_EQ(ElementSize(DType::kInt8), 1u);
  EXPECT_EQ(ElementSize(DType::kUInt8), 1u);
  EXPECT_EQ(ElementSize(DType::kInt32), 4u);
  EXPECT_EQ(ElementSize(DType::kInt64), 8u);
  EXPECT_EQ(ElementSize(DType::kBool), 1u);
}

TEST(DType, NamesRoundTrip) {
  for (DType dtype : kAllDTypes) {
    auto parsed = ParseDType(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << DTypeName(dtype);
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(*ParseDType("bf16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("i64"), DType::kInt64);
  EXPECT_EQ(ParseDType("float128").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDType("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DType, FloatingPointClassification) {
  EXPECT_TRUE(IsFloatingPoint(DType::kBFloat16));
  EXPECT_TRUE(IsFloatingPoint(DType::kFloat16));
  EXPECT_FALSE(IsFloatingPoint(DType::kInt32));
  EXPECT_FALSE(IsFloatingPoint(DType::kBool));
}

TEST(DType, DLPackRoundTripForEveryTypeButAmbiguousBool) {
  for (DType dtype : kAllDTypes) {
    const DLDataType dl = ToDLDataType(dtype);
    EXPECT_EQ(dl.lanes, 1);
    EXPECT_EQ(dl.bits, ElementSize(dtype) * 8);
    auto back = FromDLDataType(dl);
    ASSERT_TRUE(back.ok());
    if (dtype == DType::kBool && dl.code == kDLUInt) {
      // DLPack < 0.8 cannot tell bool from uint8; importing reads uint8.
      EXPECT_EQ(*back, DType::kUInt8);
    } else {
      EXPECT_EQ(*back, dtype) << DTypeName(dtype);
    }
  }
  EXPECT_EQ(ToDLDataType(DType::kBFloat16).code, kDLBfloat);
}

TEST(DType, UnsupportedDLPackTypesAreRejected) {
  EXPECT_EQ(FromDLDataType(DLDataType{kDLFloat, 32, 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromDLDataType(DLDataType{kDLUInt, 16, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromDLDataType(DLDataType{kDLComplex, 64, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace dtype_test
}  // namespace mesh
