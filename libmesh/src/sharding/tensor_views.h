// Views and copies of local tensors for the sharding executor: the shape
// arithmetic (Product, OuterSize), contiguous sub-buffers, narrowing a
// tensor from one layout to a piece of it, and fresh contiguous copies.
// Private to libmesh (libmesh/src/sharding/).
//
// Views (SubBuffer, NarrowTo, Box) alias the tensor they are taken from and
// keep its storage alive; nothing here communicates.
// Errors: those of Tensor::Narrow (INVALID_ARGUMENT for a range outside the
// tensor), Tensor::Empty and CopyStrided.
// Thread safety: pure functions; CopyOf reads its argument only.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "mesh/placement.h"
#include "mesh/tensor.h"

namespace mesh::sharding {

// "[8, 6]".
std::string ShapeStr(absl::Span<const int64_t> shape);

// The product of `dims` (1 for none).
int64_t Product(absl::Span<const int64_t> dims);

// Product of the dims before `d`: 1 means blocks along d are contiguous.
int64_t OuterSize(absl::Span<const int64_t> shape, int d);

// A contiguous view of the elements of `buffer` starting at element
// `offset`, shaped `shape` (Product(shape) elements; `buffer` must hold
// them). Keeps `buffer`'s storage alive.
Tensor SubBuffer(const Tensor& buffer, int64_t offset, absl::Span<const int64_t> shape);

// `t`, which holds `whole`, narrowed on dim d to `piece` (two layouts of one
// tensor, `piece` inside `whole`). An empty piece is narrowed at 0: an empty
// shard's offset is the global extent (ComputeLocalLayout), which lies
// outside any parent chunk.
absl::StatusOr<Tensor> NarrowTo(const Tensor& t, int d, const LocalLayout& piece,
                                const LocalLayout& whole);

// `t` narrowed to [offset, offset + shape) on every dim.
absl::StatusOr<Tensor> Box(const Tensor& t, absl::Span<const int64_t> offset,
                           absl::Span<const int64_t> shape);

// A freshly allocated contiguous copy of `t` (any strides) on its device.
absl::StatusOr<Tensor> CopyOf(const Tensor& t);

}  // namespace mesh::sharding
