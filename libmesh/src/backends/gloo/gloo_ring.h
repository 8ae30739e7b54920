// Ring collectives over gloo unbound buffers (internal): reduce-scatter,
// all-gather, and the out-of-place all-reduce made of the two.
//
// Why not gloo's own:
//   - gloo 0.5 has reduce-scatter only as the bound-buffer, float-templated
//     ReduceScatterHalvingDoubling<T>, which cannot be aborted (see
//     gloo_context.h) and chunks by its own rounding.
//   - gloo's allgather sends a whole chunk per step and waits for it before
//     the next step, so the steps' wire times add up with no overlap.
//   - gloo's allreduce is in place only; an out-of-place caller (DTensor's
//     Partial -> Replicate, whose input is immutable) would copy first.
//
// All three cut each chunk into segments and forward a segment the moment
// it is ready, so the wire, the reduction and the next step overlap:
//
// Reduce-scatter (n ranks, n chunks). In step s (0 <= s <= n-2) rank r
// sends the partial sum of chunk (r-s-1) mod n to r+1 and receives chunk
// (r-s-2) mod n from r-1, adding its own input to it; after n-1 steps rank
// r holds chunk r reduced over all ranks.
//
//   step 0:   send own input chunk                             ──▶ r+1
//   step s:   recv partial from r-1, add own input, forward    ──▶ r+1
//   step n-2: the last reduction lands in the output
//
// All-gather. Every receive is posted up front (each lands in its own slot
// of the output); in step s rank r receives chunk (r-s-1) mod n from r-1
// and forwards each segment to r+1 unless s == n-2.
//
// All-reduce = reduce-scatter into this rank's chunk of the output, then an
// in-place all-gather, fused: each segment of the last reduction step goes
// on to r+1 as soon as it is reduced, so the all-gather starts while the
// reduce-scatter is still finishing (two separate collectives would leave
// one step's worth of idle wire between them).
//
// Each rank moves (n-1)/n of the data per phase, the optimum. Scratch (from
// the CPU pool): reduce-scatter and all-reduce use two receive buffers and
// up to two accumulators of one chunk each; all-gather none.
//
// Messages: each collective uses its own gloo slot prefix (gloo_slots.h),
// clear of gloo's and of Send/Recv, and relies on gloo matching one peer's
// messages on one slot first in, first out.
//
// Errors: these throw what gloo throws (an IoException on timeout or a
// closed pair; see gloo_context.h for the abortable buffers they go
// through). Preconditions are MESH_CHECKed.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include <gloo/context.h>

#include "backends/gloo/gloo_reduce.h"

namespace mesh::gloo_backend {

struct RingReduceScatterArgs {
  // n * count elements, read only. May not overlap `output` except that
  // `output` may be exactly this rank's chunk of it.
  const void* input = nullptr;
  void* output = nullptr;  // count elements.
  size_t count = 0;        // Elements per rank; > 0.
  size_t element_size = 0;
  ReduceFn reduce;
  std::chrono::milliseconds timeout{0};
  // Upper bound of one segment; rounded down to whole elements (at least
  // one element).
  size_t max_segment_bytes = 512 * 1024;
  uint32_t tag = 0;
};

// Runs the ring reduce-scatter on `context` (size >= 2).
void RingReduceScatter(const std::shared_ptr<::gloo::Context>& context,
                       const RingReduceScatterArgs& args);

struct RingAllGatherArgs {
  // `count` elements. Either exactly this rank's chunk of `output` (the
  // in-place form) or a buffer that does not overlap `output`.
  const void* input = nullptr;
  void* output = nullptr;  // n * count elements; chunk j from rank j.
  size_t count = 0;        // Elements per rank; > 0.
  size_t element_size = 0;
  std::chrono::milliseconds timeout{0};
  size_t max_segment_bytes = 512 * 1024;  // As for reduce-scatter.
  uint32_t tag = 0;
};

// Runs the ring all-gather on `context` (size >= 2).
void RingAllGather(const std::shared_ptr<::gloo::Context>& context, const RingAllGatherArgs& args);

struct RingAllReduceArgs {
  // n * count elements each. `input` is read only and may not overlap
  // `output` (use gloo's in-place allreduce for that).
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;  // Elements per rank's chunk; > 0 (n * count in all).
  size_t element_size = 0;
  ReduceFn reduce;
  std::chrono::milliseconds timeout{0};
  size_t max_segment_bytes = 512 * 1024;  // As for reduce-scatter.
  uint32_t tag = 0;
};

// Runs the fused out-of-place ring all-reduce on `context` (size >= 2).
void RingAllReduce(const std::shared_ptr<::gloo::Context>& context, const RingAllReduceArgs& args);

}  // namespace mesh::gloo_backend
