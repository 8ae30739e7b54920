// Helper process for gloo_peer_death_test: two ranks from the MESH_*
// environment over Gloo (TCP, or shared memory with --shm). After a world
// barrier, rank 1 exits at once without leaving; rank 0 all-reduces, which
// must fail promptly because its peer is gone. Rank 0 prints
//   "rank 0: failed after <ms> ms: <status>"   (exit 0: the expected outcome)
// or "rank 0: all-reduce succeeded"           (exit 1).
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "mesh/mesh.h"

int main(int argc, char** argv) {
  const bool shm = argc > 1 && std::string(argv[1]) == "--shm";
  mesh::RuntimeOptions options;
  mesh::GlooOptions gloo;
  gloo.hostname = "127.0.0.1";
  gloo.shared_memory = shm;
  options.backend = mesh::GlooBackend(gloo);
  options.group_options.timeout = absl::Seconds(60);
  auto runtime = mesh::Runtime::Init(std::move(options));
  if (!runtime.ok()) {
    std::printf("init: %s\n", runtime.status().ToString().c_str());
    return 2;
  }
  auto world = (*runtime)->World();
  if (!world.ok()) {
    std::printf("world: %s\n", world.status().ToString().c_str());
    return 2;
  }
  // The runtime wraps its groups (metrics, progress); ask the Gloo group itself.
  const auto* gloo_group = dynamic_cast<const mesh::ProcessGroupGloo*>(&(*world)->Underlying());
  if (gloo_group == nullptr) {
    std::printf("the world group is not a Gloo group\n");
    return 2;
  }
  if (shm && !gloo_group->uses_shared_memory()) {
    std::printf("shared memory was not used\n");
    return 2;
  }
  auto barrier = (*world)->Barrier();
  if (!barrier.ok() || !(*barrier)->Wait().ok()) {
    std::printf("barrier failed\n");
    return 2;
  }
  if ((*runtime)->rank() == 1) _exit(7);  // Dies without Leave or cleanup.

  std::vector<float> data(1 << 22, 1.0f);
  const absl::Time start = absl::Now();
  auto work = (*world)->AllReduce(mesh::Tensor::Contiguous(data.data(), mesh::DType::kFloat32,
                                                           {static_cast<int64_t>(data.size())}),
                                  mesh::ReduceOp::kSum);
  absl::Status status = work.ok() ? (*work)->Wait() : work.status();
  if (status.ok()) {
    std::printf("rank 0: all-reduce succeeded\n");
    return 1;
  }
  std::printf("rank 0: failed after %lld ms: %s\n",
              static_cast<long long>(absl::ToInt64Milliseconds(absl::Now() - start)),
              status.ToString().c_str());
  std::fflush(stdout);
  _exit(0);  // The runtime would wait to leave a failed job; skip it.
}
