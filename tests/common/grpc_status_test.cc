#include "common/grpc_status.h"

#include <gtest/gtest.h>

namespace mesh {
namespace grpc_status_test {

TEST(GrpcStatus, OkMapsToOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatus, EveryCanonicalCodeRoundTripsWithItsMessage) {
  for (int code = 1; code <= 16; ++code) {
    const absl::Status in(static_cast<absl::StatusCode>(code), "rank 3 (host-b) died");
    const grpc::Status wire = ToGrpcStatus(in);
    EXPECT_EQ(static_cast<int>(wire.error_code()), code);
    EXPECT_EQ(wire.error_message(), "rank 3 (host-b) died");
    EXPECT_EQ(FromGrpcStatus(wire), in) << "code " << code;
  }
}

TEST(GrpcStatus, SpecificCodesKeepTheirMeaning) {
  EXPECT_EQ(ToGrpcStatus(absl::AbortedError("stale generation")).error_code(),
            grpc::StatusCode::ABORTED);
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("kv full")).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(
      absl::IsUnavailable(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down"))));
}

TEST(GrpcStatus, OutOfRangeCodeFromABrokenPeerBecomesUnknown) {
  // 20 is outside the canonical codes yet inside the enum's value range, so
  // building it is not undefined behaviour.
  const grpc::Status weird(static_cast<grpc::StatusCode>(20), "what");
  const absl::Status status = FromGrpcStatus(weird);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(status.message(), "what");
}

}  // namespace grpc_status_test
}  // namespace mesh
