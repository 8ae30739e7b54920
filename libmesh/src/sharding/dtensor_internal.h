// What the DTensor entry points (dtensor.cc, distribute_tensor.cc) share
// beyond mesh/dtensor.h: building a DTensor from a local block, and the
// dtype check that every entry point applies to its placements. Private to
// libmesh (libmesh/src/sharding/).
//
// Thread safety: pure functions (no communication).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "mesh/device_mesh.h"
#include "mesh/dtensor.h"
#include "mesh/dtype.h"
#include "mesh/placement.h"
#include "mesh/tensor.h"

namespace mesh {

// The DTensor that holds `local` as this rank's block of a global tensor of
// `shape` with `placements` over `mesh` (DTensor's friend: the one way to
// make one). Takes `local` as it is, no copy.
// Possible errors: INVALID_ARGUMENT when `local`'s shape is not this rank's
// layout, `local` is not contiguous, or CheckDTypeForPlacements fails; those
// of ComputeLocalLayout.
absl::StatusOr<DTensor> MakeDTensor(DeviceMesh mesh, Placements placements, DimVector shape,
                                    Tensor local);

namespace sharding {

// INVALID_ARGUMENT naming the mesh dim when a Partial placement's op is not
// defined for `dtype`: Partial(avg) needs a floating dtype, and bool allows
// only Partial(min) and Partial(max).
absl::Status CheckDTypeForPlacements(absl::Span<const Placement> placements, DType dtype);

}  // namespace sharding
}  // namespace mesh
