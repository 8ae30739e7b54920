// The wire contract compiles, round-trips, and exposes the service methods
// clients rely on.
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include "grpc/health/v1/health.pb.h"
#include "mesh/v1/admin.grpc.pb.h"
#include "mesh/v1/admin.pb.h"

namespace admin_proto_test {

TEST(AdminProto, ServerInfoRoundTripsThroughTheWire) {
  mesh::v1::GetServerInfoResponse in;
  in.set_version("1.2.3");
  in.set_protocol_version(1);
  in.set_start_time_unix_ms(1'700'000'000'123);
  in.set_uptime_seconds(12.5);
  in.set_hostname("host-a");
  in.set_pid(4242);
  in.add_features("gloo");
  in.add_features("nccl");

  std::string bytes;
  ASSERT_TRUE(in.SerializeToString(&bytes));
  mesh::v1::GetServerInfoResponse out;
  ASSERT_TRUE(out.ParseFromString(bytes));
  EXPECT_EQ(out.version(), "1.2.3");
  EXPECT_EQ(out.start_time_unix_ms(), 1'700'000'000'123);
  EXPECT_DOUBLE_EQ(out.uptime_seconds(), 12.5);
  EXPECT_EQ(out.hostname(), "host-a");
  EXPECT_EQ(out.pid(), 4242);
  ASSERT_EQ(out.features_size(), 2);
  EXPECT_EQ(out.features(1), "nccl");
}

TEST(AdminProto, PackageAndServiceNamesAreTheVersionedContract) {
  const auto* service =
      mesh::v1::GetServerInfoRequest::descriptor()->file()->FindServiceByName("AdminService");
  ASSERT_NE(service, nullptr);
  EXPECT_EQ(service->full_name(), "mesh.v1.AdminService");
  ASSERT_NE(service->FindMethodByName("GetServerInfo"), nullptr);
  EXPECT_STREQ(mesh::v1::AdminService::service_full_name(), "mesh.v1.AdminService");
}

TEST(AdminProto, GarbageBytesAreRejectedNotCrashedOn) {
  mesh::v1::GetServerInfoResponse out;
  const std::string garbage = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x0f";
  EXPECT_FALSE(out.ParseFromString(garbage));
}

TEST(HealthProto, MatchesTheStandardWireFormat) {
  // grpc.health.v1.HealthCheckRequest{service: "x"} is field 1, length 1.
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("x");
  EXPECT_EQ(request.SerializeAsString(), std::string("\x0a\x01x", 3));
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(response.ParseFromString(std::string("\x08\x02", 2)));
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
}

}  // namespace admin_proto_test
