// DTensor: a tensor sharded over a DeviceMesh, as PyTorch's
// torch.distributed.tensor.DTensor: a global shape, one placement per mesh
// dim (mesh/placement.h) and the calling rank's local tensor.
//
//   auto mesh = runtime->InitDeviceMesh({2, 2}, {"dp", "tp"});
//   auto x = mesh::DistributeTensor(global, *mesh, {Shard(0), Replicate()});
//   auto y = mesh::Redistribute(*x, {Replicate(), Shard(1)});   // one plan
//   auto full = y->FullTensor();                                // every rank
//
// Collective calls: DistributeTensor (unless every rank passes the global
// tensor and src_rank is -1), FromLocal with verify or without a global
// shape, Redistribute, FullTensor. Every rank of the mesh makes them in the
// same order with matching arguments, as with any collective; a mismatch is
// a usage error that surfaces as a transport error or a timeout.
//
// Memory: a DTensor owns its local tensor's memory (through the Tensor's
// keep-alive) or shares the caller's (FromLocal without a copy). Results of
// Redistribute and FullTensor are freshly allocated on the DTensor's device.
//
// Devices: CPU tensors go through the mesh's groups as they are (Gloo);
// CUDA tensors need CUDA groups (NCCL). Dtypes: every mesh::DType the
// groups support; Partial(avg) needs a floating dtype.
//
// Errors common to the collective calls: the process groups' errors
// (ABORTED naming a failed peer, DEADLINE_EXCEEDED after the group timeout,
// UNAVAILABLE), returned as they are.
//
// Thread safety: a DTensor is an immutable value (copies share the local
// memory); collective calls on one mesh must be issued in the same order on
// every rank, as for ProcessGroup.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "mesh/device_mesh.h"
#include "mesh/placement.h"
#include "mesh/redistribute_plan.h"
#include "mesh/tensor.h"

namespace mesh {

struct FromLocalOptions {
  // The global shape. Empty: inferred (collective) from every rank's local
  // shape, which is always right for even layouts; give it for uneven ones
  // whose local shapes alone are ambiguous. When given, each rank's local
  // shape must equal what ComputeLocalLayout says for its coordinate.
  std::vector<int64_t> global_shape;
  // Collective check that ranks which should hold equal data do: replicas
  // along every Replicate dim compare their local tensors bit for bit, and
  // every rank's local shape is checked against the global shape.
  // FAILED_PRECONDITION naming the first mesh dim and ranks that disagree.
  bool verify = false;
  // Copy the local tensor into memory the DTensor owns (else it shares the
  // caller's; the caller then must not change it while the DTensor lives).
  bool copy = false;
};

struct DistributeOptions {
  // The mesh rank (DeviceMesh coordinate order = world rank order within the
  // mesh) that holds the global tensor; the others' `global` is ignored and
  // may be an empty tensor of any shape. -1: every rank passes the same
  // global tensor, and each takes its own shard without communication.
  int src_rank = -1;
  // For the scatter and broadcast from src_rank; zero: the groups' default.
  absl::Duration timeout = absl::ZeroDuration();
};

struct RedistributeOptions {
  // Plans come from here (else from a process-wide cache).
  RedistributePlanCache* cache = nullptr;
  // Per collective; zero: the groups' default.
  absl::Duration timeout = absl::ZeroDuration();
};

class DTensor {
 public:
  const DeviceMesh& mesh() const { return mesh_; }
  const Placements& placements() const { return placements_; }
  // The global shape and its row-major strides.
  absl::Span<const int64_t> shape() const { return shape_; }
  DimVector stride() const { return ContiguousStrides(shape_); }
  DType dtype() const { return local_.dtype(); }
  const Device& device() const { return local_.device(); }
  // This rank's shard (or replica, or partial value), contiguous.
  const Tensor& local() const { return local_; }
  Tensor ToLocal() const { return local_; }
  // Where local() sits in the global tensor.
  const LocalLayout& local_layout() const { return layout_; }

  // Wraps this rank's local tensor; see FromLocalOptions. The local tensor
  // must be contiguous (INVALID_ARGUMENT otherwise).
  // Possible errors: INVALID_ARGUMENT for placements that do not fit the mesh
  // or the tensor's rank, or local shapes that cannot form a global tensor
  // (the message names the mesh dim, the tensor dim and the ranks' sizes);
  // FAILED_PRECONDITION from verify; the groups' errors.
  static absl::StatusOr<DTensor> FromLocal(Tensor local, const DeviceMesh& mesh,
                                           Placements placements, FromLocalOptions options = {});

  // Collective: the whole global tensor on every rank (Partial dims reduced,
  // Shard dims gathered), freshly allocated and contiguous.
  absl::StatusOr<Tensor> FullTensor(absl::Duration timeout = absl::ZeroDuration()) const;

  // "DTensor(shape=[8, 6], placements=[S(0), R], local=[4, 6], float32, cpu)".
  std::string DebugString() const;

 private:
  friend absl::StatusOr<DTensor> MakeDTensor(DeviceMesh mesh, Placements placements,
                                             DimVector shape, Tensor local);
  DTensor(DeviceMesh mesh, Placements placements, DimVector shape, LocalLayout layout,
          Tensor local);

  DeviceMesh mesh_;
  Placements placements_;
  DimVector shape_;
  LocalLayout layout_;
  Tensor local_;
};

// Distributes `global` over `mesh` with `placements`; see DistributeOptions.
// Replicate and Shard dims take the data as it is; a Partial dim holds the
// global value as Replicate→Partial defines it (sum: on coordinate 0 only).
// Possible errors: INVALID_ARGUMENT for placements that do not fit, a
// src_rank outside the mesh, or (on the source, or on every rank with -1) a
// global tensor that is not contiguous; the groups' errors.
absl::StatusOr<DTensor> DistributeTensor(const Tensor& global, const DeviceMesh& mesh,
                                         Placements placements, DistributeOptions options = {});

// Collective: `input` laid out with `placements`, by the plan
// PlanRedistribute makes (see mesh/redistribute_plan.h).
// Possible errors: those of PlanRedistribute; the groups' errors.
absl::StatusOr<DTensor> Redistribute(const DTensor& input, Placements placements,
                                     RedistributeOptions options = {});

}  // namespace mesh
