// Pure helpers of the NCCL backend: dtype and reduction mapping, error
// conversion, the non-blocking config. Built only with NCCL; needs no GPU.
#include "backends/nccl/nccl_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>

namespace mesh::nccl {
namespace nccl_util_test {

using ::testing::HasSubstr;

TEST(NcclTypes, EveryDTypeMapsToTheNcclTypeOfItsWidthAndKind) {
  EXPECT_EQ(ToNcclDataType(DType::kFloat32), ncclFloat32);
  EXPECT_EQ(ToNcclDataType(DType::kFloat64), ncclFloat64);
  EXPECT_EQ(ToNcclDataType(DType::kFloat16), ncclFloat16);
  EXPECT_EQ(ToNcclDataType(DType::kBFloat16), ncclBfloat16);
  EXPECT_EQ(ToNcclDataType(DType::kInt8), ncclInt8);
  EXPECT_EQ(ToNcclDataType(DType::kUInt8), ncclUint8);
  EXPECT_EQ(ToNcclDataType(DType::kInt32), ncclInt32);
  EXPECT_EQ(ToNcclDataType(DType::kInt64), ncclInt64);
  // bool is one byte holding 0 or 1, so min/max on uint8 are and/or.
  EXPECT_EQ(ToNcclDataType(DType::kBool), ncclUint8);
}

TEST(NcclTypes, ReductionsMapOneToOne) {
  EXPECT_EQ(ToNcclRedOp(ReduceOp::kSum), ncclSum);
  EXPECT_EQ(ToNcclRedOp(ReduceOp::kProd), ncclProd);
  EXPECT_EQ(ToNcclRedOp(ReduceOp::kMin), ncclMin);
  EXPECT_EQ(ToNcclRedOp(ReduceOp::kMax), ncclMax);
  EXPECT_EQ(ToNcclRedOp(ReduceOp::kAvg), ncclAvg);
}

TEST(NcclTypes, HeadersOfThisBuildHaveBfloat16AndAvg) {
  // libmesh builds against NCCL >= 2.14 (checked at compile time), which
  // has both; the caps exist for older headers' sake.
  const NcclCaps caps = BuiltCaps();
  EXPECT_TRUE(caps.bfloat16);
  EXPECT_TRUE(caps.avg);
}

TEST(NcclErrors, CodesSayWhetherRetryingCanHelp) {
  EXPECT_EQ(CodeForNcclResult(ncclSuccess), absl::StatusCode::kOk);
  EXPECT_EQ(CodeForNcclResult(ncclSystemError), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CodeForNcclResult(ncclRemoteError), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CodeForNcclResult(ncclInvalidArgument), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeForNcclResult(ncclInvalidUsage), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CodeForNcclResult(ncclUnhandledCudaError), absl::StatusCode::kInternal);
  EXPECT_EQ(CodeForNcclResult(ncclInternalError), absl::StatusCode::kInternal);
}

TEST(NcclErrors, MessageNamesTheOperationAndNcclsReason) {
  const absl::Status s =
      NcclError(RealNcclApi(), "issuing all_reduce #3", ncclRemoteError, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("issuing all_reduce #3: NCCL error 6: "));
  EXPECT_THAT(std::string(s.message()), HasSubstr(ncclGetErrorString(ncclRemoteError)));
}

TEST(NcclErrors, CreationReportsInternalFailuresAsUnavailable) {
  EXPECT_EQ(
      NcclError(RealNcclApi(), "x", ncclInternalError, nullptr, absl::StatusCode::kUnavailable)
          .code(),
      absl::StatusCode::kUnavailable);
  EXPECT_EQ(
      NcclError(RealNcclApi(), "x", ncclUnhandledCudaError, nullptr, absl::StatusCode::kUnavailable)
          .code(),
      absl::StatusCode::kUnavailable);
  // Usage errors keep their codes: retrying will not fix them.
  EXPECT_EQ(NcclError(RealNcclApi(), "x", ncclInvalidUsage, nullptr, absl::StatusCode::kUnavailable)
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(NcclConfig, IsNonBlockingAndNamed) {
  const char* name = "mesh/tp/1";
  ncclConfig_t config = NonBlockingConfig(name);
  EXPECT_EQ(config.blocking, 0);
  EXPECT_EQ(config.magic, 0xcafebeefu);  // NCCL rejects configs not from its initializer.
  EXPECT_EQ(config.size, sizeof(ncclConfig_t));
#if MESH_NCCL_HAS_COMM_NAME
  EXPECT_EQ(config.commName, name);
#endif
  // Everything else keeps NCCL's defaults.
  EXPECT_EQ(config.splitShare, NCCL_CONFIG_UNDEF_INT);
  EXPECT_EQ(config.cgaClusterSize, NCCL_CONFIG_UNDEF_INT);
}

TEST(NcclSplit, AvailableWithTheLoadedLibrary) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(SplitAvailable(RealNcclApi()), version >= NCCL_VERSION(2, 19, 0));
}

}  // namespace nccl_util_test
}  // namespace mesh::nccl
