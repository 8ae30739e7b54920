// fault_b_worker: the libmesh worker of the fault-b network tests. It joins
// its job (rendezvous), runs a coordinator barrier, all-reduces a vector
// over Gloo and checks the sum, then leaves. Exits 0 on success, 1 on any
// error (reported on stderr and to the coordinator).
//
// With FAULT_B_HOLD_SECONDS=<s>, it then stays up that long, running a
// barrier and an all_reduce every 200 ms and checking the runtime's health
// (heartbeats, the job watch) each time, so a false failure shows.
//
// Gloo binds the address this host uses to reach the coordinator (found
// with a connected UDP socket), so a rank inside a network namespace
// advertises its veth address and not 127.0.0.1.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/mesh.h"

namespace {

// The local address of a route to MESH_COORDINATOR's host (an IPv4
// literal in these tests).
absl::StatusOr<std::string> LocalAddressTowardsCoordinator() {
  const char* coordinator = std::getenv("MESH_COORDINATOR");
  if (coordinator == nullptr) return absl::FailedPreconditionError("MESH_COORDINATOR is not set");
  std::string host(coordinator);
  host = host.substr(0, host.rfind(':'));
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(9);
  if (inet_pton(AF_INET, host.c_str(), &remote.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 literal: ", host));
  }
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  sockaddr_in local{};
  socklen_t length = sizeof(local);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof(remote)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
  close(fd);
  if (!ok) return absl::UnavailableError(absl::StrCat("no route to ", host));
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return std::string(text);
}

absl::Status Exercise(mesh::Runtime& runtime) {
  absl::StatusOr<std::shared_ptr<mesh::ProcessGroup>> group = runtime.World();
  if (!group.ok()) return group.status();
  absl::StatusOr<mesh::ProcessGroup::WorkPtr> barrier = (*group)->Barrier();
  if (!barrier.ok()) return barrier.status();
  if (absl::Status s = (*barrier)->Wait(); !s.ok()) return s;
  const int world = runtime.world_size();
  std::vector<float> data(1024, static_cast<float>(runtime.rank() + 1));
  mesh::Tensor tensor = mesh::Tensor::Contiguous(data.data(), mesh::DType::kFloat32,
                                                 {static_cast<int64_t>(data.size())});
  absl::StatusOr<mesh::ProcessGroup::WorkPtr> work =
      (*group)->AllReduce(tensor, mesh::ReduceOp::kSum);
  if (!work.ok()) return work.status();
  if (absl::Status s = (*work)->Wait(); !s.ok()) return s;
  const float expected = static_cast<float>(world * (world + 1) / 2);
  for (float value : data) {
    if (value != expected) {
      return absl::InternalError(absl::StrCat("all_reduce gave ", value, ", expected ", expected));
    }
  }
  std::printf("rank %d: barrier and all_reduce ok (sum %g)\n", runtime.rank(), expected);
  return absl::OkStatus();
}

}  // namespace

int main() {
  absl::StatusOr<std::string> address = LocalAddressTowardsCoordinator();
  if (!address.ok()) {
    std::fprintf(stderr, "fault_b_worker: %s\n", address.status().ToString().c_str());
    return 1;
  }
  mesh::RuntimeOptions options;
  mesh::GlooOptions gloo;
  gloo.hostname = *address;
  options.backend = mesh::GlooBackend(gloo);
  options.join_timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<mesh::Runtime>> runtime = mesh::Runtime::Init(std::move(options));
  if (!runtime.ok()) {
    std::fprintf(stderr, "fault_b_worker: %s\n", runtime.status().ToString().c_str());
    return 1;
  }
  absl::Status status = Exercise(**runtime);
  double hold_seconds = 0;
  if (const char* hold = std::getenv("FAULT_B_HOLD_SECONDS");
      hold != nullptr && !absl::SimpleAtod(hold, &hold_seconds)) {
    status = absl::InvalidArgumentError(absl::StrCat("FAULT_B_HOLD_SECONDS=", hold));
  }
  const absl::Time end = absl::Now() + absl::Seconds(hold_seconds);
  int rounds = 0;
  while (status.ok() && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(200));
    status = (*runtime)->health();
    if (status.ok()) status = Exercise(**runtime);
    ++rounds;
  }
  if (status.ok() && hold_seconds > 0) {
    std::printf("rank %d: held %.1f s, %d rounds, healthy\n", (*runtime)->rank(), hold_seconds,
                rounds);
  }
  if (status = (*runtime)->Finish(status); !status.ok()) {
    std::fprintf(stderr, "fault_b_worker rank %d: %s\n", (*runtime)->rank(),
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
