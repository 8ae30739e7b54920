// dtensor_redistribute: a small Mesh worker to copy, for sharded tensors.
//
// It joins its job from the MESH_* environment the agent sets (see
// docs/runtime.md), builds a 2-D DeviceMesh ("dp", "tp") and walks one
// tensor through docs/sharding.md:
//
//   1. a known global tensor, rows x cols float32 with element [r, c] =
//      r * 100 + c, which every rank builds itself (src_rank -1: no
//      communication), is distributed as (Shard(0), Replicate());
//   2. it is redistributed to (Replicate(), Shard(1)) by the plan rank 0
//      prints: on (2, 2), a local slice over "tp" first, which costs
//      nothing and halves what the all_gather over "dp" then moves;
//   3. every rank checks its local shard (shape, offset and every value)
//      before and after, and both FullTensor()s against the global tensor.
//
// It prints "rank R: ok" and exits 0 on success, and exits 1 on any error or
// mismatch; an error after joining is reported to the coordinator first, so
// the other ranks stop at once instead of waiting.
//
//   dtensor_redistribute [--device cpu|cuda] [--gloo-host ADDR] [--rows N] [--cols N]
//
// The mesh is (2, world / 2) for an even world, as (2, 2) for the usual 4
// ranks, and (1, world) for an odd one, so a single GPU runs it too. Sizes
// that do not divide evenly are fine: the shards follow torch.chunk.
// --device cpu (the default) runs Gloo on host tensors; --device cuda runs
// NCCL on CUDA tensors on this rank's GPU (NcclDefaultDeviceIndex), and the
// checks copy each result back to the host.
#include <algorithm>
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
#include "mesh/dtensor.h"
#include "mesh/mesh.h"
#include "mesh/placement.h"
#include "mesh/process_group_nccl.h"
#include "mesh/redistribute_plan.h"

namespace {

using mesh::Placement;

float Expected(int64_t row, int64_t col) { return static_cast<float>(row * 100 + col); }

// torch.chunk's rule, spelled out here rather than taken from the library so
// that the example checks it: chunk `index` of `size` split `parts` ways.
struct Span1D {
  int64_t offset;
  int64_t size;
};
Span1D ChunkRule(int64_t size, int64_t parts, int64_t index) {
  const int64_t chunk = (size + parts - 1) / parts;
  const int64_t begin = std::min(size, chunk * index);
  const int64_t end = std::min(size, begin + chunk);
  return {begin, end - begin};
}

// A host copy of a CUDA tensor; a host tensor as it is.
absl::StatusOr<mesh::Tensor> OnHost(const mesh::Tensor& t) {
  if (!t.device().is_cuda()) return t;
  absl::StatusOr<mesh::Tensor> host = mesh::Tensor::Empty(t.dtype(), t.shape());
  if (!host.ok()) return host.status();
  if (absl::Status s = mesh::CopyTensor(*host, t); !s.ok()) return s;
  return host;
}

// Checks that `tensor` is the [rows] x [cols] block of the global tensor at
// (rows.offset, cols.offset), element by element.
absl::Status CheckBlock(const std::string& what, const mesh::Tensor& tensor, Span1D rows,
                        Span1D cols) {
  absl::StatusOr<mesh::Tensor> on_host = OnHost(tensor);
  if (!on_host.ok()) return on_host.status();
  const mesh::Tensor& local = *on_host;
  const std::vector<int64_t> shape = {rows.size, cols.size};
  if (local.dim() != 2 || local.size(0) != rows.size || local.size(1) != cols.size) {
    return absl::InternalError(absl::StrCat(what, ": shape ", local.ShapeString(), ", expected [",
                                            absl::StrJoin(shape, ", "), "]"));
  }
  if (local.dtype() != mesh::DType::kFloat32 || !local.is_contiguous()) {
    return absl::InternalError(
        absl::StrCat(what, ": expected contiguous float32, got ", local.DebugString()));
  }
  const float* data = local.data_as<const float>();
  for (int64_t r = 0; r < rows.size; ++r) {
    for (int64_t c = 0; c < cols.size; ++c) {
      const float want = Expected(rows.offset + r, cols.offset + c);
      const float got = data[r * cols.size + c];
      if (got != want) {
        return absl::InternalError(absl::StrCat(what, ": element [", r, ", ", c, "] (global [",
                                                rows.offset + r, ", ", cols.offset + c, "]) is ",
                                                got, ", expected ", want));
      }
    }
  }
  return absl::OkStatus();
}

// The DTensor's own idea of where its shard sits must match the rule too.
absl::Status CheckLayout(const std::string& what, const mesh::DTensor& t, Span1D rows,
                         Span1D cols) {
  const mesh::LocalLayout want{{rows.size, cols.size}, {rows.offset, cols.offset}};
  if (!(t.local_layout() == want)) {
    return absl::InternalError(absl::StrCat(
        what, ": local layout shape [", absl::StrJoin(t.local_layout().shape, ", "), "] offset [",
        absl::StrJoin(t.local_layout().offset, ", "), "], expected shape [", rows.size, ", ",
        cols.size, "] offset [", rows.offset, ", ", cols.offset, "]"));
  }
  return CheckBlock(what, t.local(), rows, cols);
}

absl::Status Run(mesh::Runtime& runtime, int64_t rows, int64_t cols, bool cuda) {
  const mesh::JoinInfo& info = runtime.info();
  const int rank = runtime.rank();
  const int64_t dp = info.world_size % 2 == 0 ? 2 : 1;
  const int64_t tp = info.world_size / dp;
  absl::StatusOr<mesh::DeviceMesh> mesh = runtime.InitDeviceMesh({dp, tp}, {"dp", "tp"});
  if (!mesh.ok()) return mesh.status();
  const std::vector<int64_t>& coord = mesh->GetCoordinate();  // (dp, tp)

  // Every rank builds the same global tensor; src_rank -1 means each takes
  // its own shard of it without communication.
  std::vector<float> global_data(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) global_data[r * cols + c] = Expected(r, c);
  }
  mesh::Tensor global =
      mesh::Tensor::Contiguous(global_data.data(), mesh::DType::kFloat32, {rows, cols});
  if (cuda) {
    const mesh::Device device = mesh::Device::Cuda(mesh::NcclDefaultDeviceIndex(
        info.local_rank, info.local_world_size, mesh::CudaDeviceCount()));
    absl::StatusOr<mesh::Tensor> on_device =
        mesh::Tensor::Empty(mesh::DType::kFloat32, {rows, cols}, device);
    if (!on_device.ok()) return on_device.status();
    if (absl::Status s = mesh::CopyTensor(*on_device, global); !s.ok()) return s;
    global = *on_device;
  }
  const mesh::Placements src = {Placement::Shard(0), Placement::Replicate()};
  const mesh::Placements dst = {Placement::Replicate(), Placement::Shard(1)};

  absl::StatusOr<mesh::DTensor> x = mesh::DistributeTensor(global, *mesh, src);
  if (!x.ok()) return x.status();
  // (S(0), R): rows chunked over dp, replicated over tp.
  if (absl::Status s = CheckLayout(absl::StrCat("rank ", rank, " ", x->DebugString()), *x,
                                   ChunkRule(rows, dp, coord[0]), {0, cols});
      !s.ok()) {
    return s;
  }

  // The plan is a value: every rank could print it; rank 0 does.
  absl::StatusOr<mesh::RedistributePlan> plan =
      mesh::PlanRedistribute(x->shape(), x->dtype(), mesh->shape(), src, dst);
  if (!plan.ok()) return plan.status();
  if (rank == 0) {
    std::printf("plan %s -> %s for %s:\n%s\n", mesh::PlacementsToString(src).c_str(),
                mesh::PlacementsToString(dst).c_str(), global.DebugString().c_str(),
                plan->ToString().c_str());
    std::fflush(stdout);
  }

  absl::StatusOr<mesh::DTensor> y = mesh::Redistribute(*x, dst);
  if (!y.ok()) return y.status();
  if (y->placements() != dst) {
    return absl::InternalError(
        absl::StrCat("Redistribute returned ", mesh::PlacementsToString(y->placements())));
  }
  // (R, S(1)): whole rows, columns chunked over tp.
  if (absl::Status s = CheckLayout(absl::StrCat("rank ", rank, " ", y->DebugString()), *y,
                                   {0, rows}, ChunkRule(cols, tp, coord[1]));
      !s.ok()) {
    return s;
  }
  // The input is untouched by the redistribution.
  if (absl::Status s = CheckBlock(absl::StrCat("rank ", rank, " input after Redistribute"),
                                  x->local(), ChunkRule(rows, dp, coord[0]), {0, cols});
      !s.ok()) {
    return s;
  }

  for (const mesh::DTensor* t : {&*x, &*y}) {
    absl::StatusOr<mesh::Tensor> full = t->FullTensor();
    if (!full.ok()) return full.status();
    const std::string what =
        absl::StrCat("rank ", rank, " FullTensor of ", mesh::PlacementsToString(t->placements()));
    if (absl::Status s = CheckBlock(what, *full, {0, rows}, {0, cols}); !s.ok()) return s;
  }
  std::printf("rank %d: coordinate (%lld, %lld): %s -> %s\n", rank,
              static_cast<long long>(coord[0]), static_cast<long long>(coord[1]),
              x->local().ShapeString().c_str(), y->local().ShapeString().c_str());

  // Nobody leaves while a peer may still need it.
  absl::StatusOr<std::shared_ptr<mesh::ProcessGroup>> world = runtime.World();
  if (!world.ok()) return world.status();
  absl::StatusOr<mesh::ProcessGroup::WorkPtr> barrier = (*world)->Barrier();
  if (!barrier.ok()) return barrier.status();
  // Host-blocking: NCCL's Work::Wait only orders the caller's stream.
  return mesh::SynchronizeWork(**barrier, absl::Minutes(5));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Mesh example worker: distribute a tensor on a (2, 2) mesh and redistribute it"};
  std::string device = "cpu";
  std::string gloo_host;
  int64_t rows = 8;
  int64_t cols = 6;
  app.add_option("--device", device, "cpu: Gloo on host tensors; cuda: NCCL on this rank's GPU")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--gloo-host", gloo_host,
                 "Address for Gloo's sockets (default: this host's name)");
  app.add_option("--rows", rows, "Rows of the global tensor")->check(CLI::NonNegativeNumber);
  app.add_option("--cols", cols, "Columns of the global tensor")->check(CLI::NonNegativeNumber);
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
    std::fprintf(stderr, "dtensor_redistribute: %s\n", runtime.status().ToString().c_str());
    return 1;
  }
  const int rank = (*runtime)->rank();
  // Reports our own error to the job (a peer's is already its error), or
  // leaves cleanly.
  if (absl::Status s = (*runtime)->Finish(Run(**runtime, rows, cols, cuda)); !s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return 1;
  }
  std::printf("rank %d: ok\n", rank);
  return 0;
}
