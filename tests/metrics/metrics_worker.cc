// metrics_worker: a Mesh worker for tests/metrics that makes every worker
// metric family it can appear (docs/metrics.md, "Worker") and then stays up
// until the test has scraped it. (mesh_redistribute_steps_total is created
// at 0 for every op when metrics are on.)
//
// It joins its job (Gloo on 127.0.0.1), all-reduces over the world and
// runs a barrier on a 1-D device mesh, writes its /metrics port to
// $METRICS_TEST_DIR/worker-<rank>.port, then waits for $METRICS_TEST_DIR/release to exist (at most
// 60 s, so an abandoned test leaves no worker behind) and leaves the job. Exits 0 on success, 1 on
// any error (reported on stderr).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/mesh.h"

namespace {

constexpr absl::Duration kReleaseTimeout = absl::Seconds(60);

absl::Status Exercise(mesh::Runtime& runtime) {
  const int world = runtime.world_size();
  absl::StatusOr<std::shared_ptr<mesh::ProcessGroup>> group = runtime.World();
  if (!group.ok()) return group.status();
  std::vector<float> data(64, 1.0f);
  mesh::Tensor tensor = mesh::Tensor::Contiguous(data.data(), mesh::DType::kFloat32,
                                                 {static_cast<int64_t>(data.size())});
  absl::StatusOr<mesh::ProcessGroup::WorkPtr> work =
      (*group)->AllReduce(tensor, mesh::ReduceOp::kSum);
  if (!work.ok()) return work.status();
  if (absl::Status s = (*work)->Wait(); !s.ok()) return s;
  if (data[0] != static_cast<float>(world)) {
    return absl::InternalError(absl::StrCat("all_reduce gave ", data[0], ", expected ", world));
  }

  // Groups of a device mesh too (their collectives are metered the same).
  absl::StatusOr<mesh::DeviceMesh> device_mesh = runtime.InitDeviceMesh({world}, {"dp"});
  if (!device_mesh.ok()) return device_mesh.status();
  absl::StatusOr<std::shared_ptr<mesh::ProcessGroup>> dp = device_mesh->GetGroup("dp");
  if (!dp.ok()) return dp.status();
  absl::StatusOr<mesh::ProcessGroup::WorkPtr> barrier = (*dp)->Barrier();
  if (!barrier.ok()) return barrier.status();
  return (*barrier)->Wait();
}

absl::Status WaitForRelease(mesh::Runtime& runtime, const std::string& dir) {
  const std::string port_file = absl::StrCat(dir, "/worker-", runtime.rank(), ".port");
  const std::string tmp = port_file + ".tmp";
  std::ofstream(tmp) << runtime.metrics_port() << "\n";
  if (std::rename(tmp.c_str(), port_file.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", port_file));
  }
  const absl::Time deadline = absl::Now() + kReleaseTimeout;
  while (access((dir + "/release").c_str(), F_OK) != 0) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no ", dir, "/release after ", absl::FormatDuration(kReleaseTimeout)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::OkStatus();
}

}  // namespace

int main() {
  const char* dir = std::getenv("METRICS_TEST_DIR");
  if (dir == nullptr || *dir == '\0') {
    std::fprintf(stderr, "metrics_worker: METRICS_TEST_DIR is not set\n");
    return 1;
  }
  mesh::RuntimeOptions options;
  mesh::GlooOptions gloo;
  gloo.hostname = "127.0.0.1";
  options.backend = mesh::GlooBackend(gloo);
  absl::StatusOr<std::unique_ptr<mesh::Runtime>> runtime = mesh::Runtime::Init(std::move(options));
  if (!runtime.ok()) {
    std::fprintf(stderr, "metrics_worker: %s\n", runtime.status().ToString().c_str());
    return 1;
  }
  absl::Status status = Exercise(**runtime);
  if (status.ok()) status = WaitForRelease(**runtime, dir);
  if (status = (*runtime)->Finish(status); !status.ok()) {
    std::fprintf(stderr, "metrics_worker rank %d: %s\n", (*runtime)->rank(),
                 status.ToString().c_str());
    return 1;
  }
  return 0;
}
