// Executes one step of a redistribute plan (mesh/redistribute_plan.h) on
// this rank: the collective or local op that changes the placement of one
// mesh dim. Private to libmesh (libmesh/src/sharding/); Redistribute
// (dtensor.cc) runs a plan's steps through RunStep in order.
//
// Every step runs on the step's mesh dim group. Peers along that dim differ
// only in their coordinate there, so each rank can compute every peer's
// layout (ComputeLocalLayout with the coordinate changed) and needs no size
// exchange: splits and offsets come from the global shape alone. Decisions
// that skip communication (nothing to move) are taken from those shared
// numbers too, so every member of a group skips or joins together.
//
// On CPU groups over TCP, strided pieces move point to point (exchange.h);
// elsewhere each step packs, runs the group's collective and unpacks.
// CUDA: packing and unpacking use CopyStrided (a 2-D copy kernel); the one
// reduction done locally (an uneven reduce_scatter) would need a kernel, so
// on CUDA an uneven reduce_scatter pads every chunk to ceil(n / k) and uses
// the group's ReduceScatter: the padding crosses the wire, a little more
// than the plan's bytes_per_rank. Host-side waits use SynchronizeWork.
//
// Collective: every rank of the step's group calls RunStep with the same
// step and global shape. Errors: those of the group (GetGroup, the
// collectives, Work::Wait), of the layout arithmetic and of allocation.
// Thread safety: one thread per group at a time, as for the groups.
// Ownership: the result is freshly allocated; the input is never written.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "mesh/device_mesh.h"
#include "mesh/placement.h"
#include "mesh/redistribute_plan.h"
#include "mesh/tensor.h"

namespace mesh::sharding {

// What one step runs against. Borrowed: everything must outlive the call.
struct StepContext {
  const DeviceMesh& mesh;
  absl::Span<const int64_t> shape;  // The global shape.
  const RedistributeStep& step;
  absl::Duration timeout;  // Per collective; zero: the group's default.
};

// `local`, this rank's block under c.step.before, as its block under
// c.step.after (contiguous, on local's device).
absl::StatusOr<Tensor> RunStep(const StepContext& c, const Tensor& local);

// Applies Replicate -> Partial to a value every rank holds: Partial(sum) and
// Partial(prod) keep it on coordinate 0 of each such dim only, and put the
// op's identity (0, 1) everywhere else; min, max and avg keep it on every
// rank. Local: no communication. Returns `local` itself when it stays.
absl::StatusOr<Tensor> ApplyPartials(const DeviceMesh& mesh, absl::Span<const Placement> placements,
                                     Tensor local);

}  // namespace mesh::sharding
