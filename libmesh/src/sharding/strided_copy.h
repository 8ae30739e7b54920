// Copies between a contiguous buffer and a "box" of a contiguous tensor (a
// view narrowed along one dim), on CPU and CUDA alike. Private to libmesh;
// the sharding executor (plan_steps.cc, exchange.cc) packs and unpacks
// shards with it.
//
// CopyTensor already copies any strides CPU -> CPU, but on CUDA it needs
// both sides contiguous, and a Shard(d) block of a contiguous tensor is not
// contiguous once d > 0. Such a block is always "2-D" in memory: `rows`
// runs of `width` contiguous bytes, `pitch` bytes apart. Within one device
// the CUDA path copies it with Mesh's 2-D copy kernel (backends/cuda/
// copy_2d.h), at the device's copy bandwidth; across devices or to the host,
// and in builds without nvcc, with cudaMemcpy2D. Neither stages through the
// host.
//
// Errors: as CopyTensor; UNIMPLEMENTED for a CUDA view that is not 2-D in
// that sense (no caller produces one).
// Thread safety: safe from any thread for disjoint destinations.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "mesh/tensor.h"

namespace mesh::sharding {

// A view's memory as rows of contiguous elements: element (r, c) is at
// data + r * pitch + c, all counted in elements.
struct Rows {
  int64_t rows = 0;
  int64_t width = 0;
  int64_t pitch = 0;
};

// The view as Rows, or nullopt when it needs more than one stride besides
// the innermost (or its innermost stride is not 1). A contiguous view is one
// row.
std::optional<Rows> AsRows(const Tensor& t);

// Copies src into dst (same dtype and shape): CopyTensor where it applies,
// the 2-D copy kernel or cudaMemcpy2D for a CUDA copy with a non-contiguous
// side. Returns once the copy is complete.
absl::Status CopyStrided(const Tensor& dst, const Tensor& src);

}  // namespace mesh::sharding
