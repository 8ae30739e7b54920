// allreduce_2d: a small Mesh worker to copy.
//
// It joins its job from the MESH_* environment the agent sets (see
// docs/runtime.md), builds a 2-D DeviceMesh ("dp", "tp") and all-reduces
// along each dim and then the world, checking every sum. It exits 0 on
// success and 1 on any error; an error after joining is reported to the
// coordinator first, so the other ranks stop at once instead of waiting.
//
//   allreduce_2d [--device cpu|cuda] [--gloo-host ADDR] [--elements N] [--rounds N]
//
// --rounds repeats the world all-reduce (default 1), printing "rank R: round
// 1 ok" after the first, so a long run can be watched or interrupted.
//
// --device cpu (the default) runs Gloo over TCP on host tensors; --device
// cuda runs NCCL on CUDA tensors, each rank on its own GPU
// (NcclDefaultDeviceIndex: cuda:0 when the agent gave the process its own
// GPUs, as `meshctl submit --gpus-per-proc 1` does).
//
// The mesh is the job's own when it is 2-D, else (2, world/2) for an even
// world and (1, world) for an odd one.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "mesh/mesh.h"
#include "mesh/process_group_nccl.h"

namespace {

// Host-blocking wait: NCCL's Work::Wait only orders the caller's stream.
constexpr absl::Duration kWait = absl::Minutes(5);

// All-reduces `elements` copies of (rank + 1) over `group` on `device` and
// checks that every element is the sum of (member + 1) over its members.
absl::Status AllReduceAndCheck(mesh::ProcessGroup& group, int world_rank, int64_t elements,
                               const mesh::Device& device) {
  std::vector<float> data(static_cast<size_t>(elements), static_cast<float>(world_rank + 1));
  const mesh::Tensor host =
      mesh::Tensor::Contiguous(data.data(), mesh::DType::kFloat32, {elements});
  mesh::Tensor tensor = host;
  if (device.is_cuda()) {
    absl::StatusOr<mesh::Tensor> on_device =
        mesh::Tensor::Empty(mesh::DType::kFloat32, {elements}, device);
    if (!on_device.ok()) return on_device.status();
    if (absl::Status s = mesh::CopyTensor(*on_device, host); !s.ok()) return s;
    tensor = *on_device;
  }
  absl::StatusOr<mesh::ProcessGroup::WorkPtr> work = group.AllReduce(tensor, mesh::ReduceOp::kSum);
  if (!work.ok()) return work.status();
  if (absl::Status s = mesh::SynchronizeWork(**work, kWait); !s.ok()) return s;
  if (device.is_cuda()) {
    if (absl::Status s = mesh::CopyTensor(host, tensor); !s.ok()) return s;
  }
  float expected = 0;
  for (int member : group.global_ranks()) expected += static_cast<float>(member + 1);
  for (int64_t i = 0; i < elements; ++i) {
    if (data[i] != expected) {
      return absl::InternalError(absl::StrCat("group ", group.name(), ": element ", i, " is ",
                                              data[i], ", expected ", expected));
    }
  }
  return absl::OkStatus();
}

absl::Status Run(mesh::Runtime& runtime, int64_t elements, int64_t rounds, bool cuda) {
  const mesh::JoinInfo& info = runtime.info();
  const mesh::Device device =
      cuda ? mesh::Device::Cuda(mesh::NcclDefaultDeviceIndex(info.local_rank, info.local_world_size,
                                                             mesh::CudaDeviceCount()))
           : mesh::Device::Cpu();
  std::vector<int64_t> shape = info.mesh_shape;
  std::vector<std::string> names = info.mesh_dim_names;
  if (shape.size() != 2) {
    const int64_t outer = info.world_size % 2 == 0 ? 2 : 1;
    shape = {outer, info.world_size / outer};
    names = {"dp", "tp"};
  }
  absl::StatusOr<mesh::DeviceMesh> mesh = runtime.InitDeviceMesh(shape, names);
  if (!mesh.ok()) return mesh.status();

  for (const std::string& dim : mesh->dim_names()) {
    absl::StatusOr<std::shared_ptr<mesh::ProcessGroup>> group = mesh->GetGroup(dim);
    if (!group.ok()) return group.status();
    if (absl::Status s = AllReduceAndCheck(**group, info.rank, elements, device); !s.ok()) {
      return s;
    }
    std::printf("rank %d: %s group [%s] all-reduce on %s ok\n", info.rank, dim.c_str(),
                absl::StrJoin((*group)->global_ranks(), ", ").c_str(), device.ToString().c_str());
  }
  absl::StatusOr<std::shared_ptr<mesh::ProcessGroup>> world = runtime.World();
  if (!world.ok()) return world.status();
  for (int64_t round = 1; round <= rounds; ++round) {
    if (absl::Status s = AllReduceAndCheck(**world, info.rank, elements, device); !s.ok()) {
      return s;
    }
    if (round == 1) {
      std::printf("rank %d: round 1 ok\n", info.rank);
      std::fflush(stdout);
    }
  }
  // Nobody leaves while a peer may still need it.
  absl::StatusOr<mesh::ProcessGroup::WorkPtr> barrier = (*world)->Barrier();
  if (!barrier.ok()) return barrier.status();
  return mesh::SynchronizeWork(**barrier, kWait);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Mesh example worker: all-reduce along each dim of a 2-D device mesh"};
  std::string device = "cpu";
  std::string gloo_host;
  int64_t elements = 1 << 16;
  app.add_option("--device", device, "cpu: Gloo on host tensors; cuda: NCCL on this rank's GPU")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--gloo-host", gloo_host,
                 "Address for Gloo's sockets (default: this host's name)");
  int64_t rounds = 1;
  app.add_option("--elements", elements, "Floats per all-reduce")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "World all-reduces to run")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const bool cuda = device == "cuda";
  mesh::RuntimeOptions options;
  if (cuda) {
    options.backend = mesh::NcclBackend();
  } else {
    mesh::GlooOptions gloo;
    gloo.hostname = gloo_host;
    options.backend = mesh::GlooBackend(gloo);
  }
  absl::StatusOr<std::unique_ptr<mesh::Runtime>> runtime = mesh::Runtime::Init(std::move(options));
  if (!runtime.ok()) {
    std::fprintf(stderr, "allreduce_2d: %s\n", runtime.status().ToString().c_str());
    return 1;
  }
  const int rank = (*runtime)->rank();
  // Reports our own error to the job (a peer's is already its error), or
  // leaves cleanly.
  if (absl::Status s = (*runtime)->Finish(Run(**runtime, elements, rounds, cuda)); !s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return 1;
  }
  std::printf("rank %d: ok\n", rank);
  return 0;
}
