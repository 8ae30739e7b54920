// Ring reduce-scatter over gloo unbound buffers (internal).
//
// gloo 0.5 has reduce-scatter only as the bound-buffer, float-templated
// ReduceScatterHalvingDoubling<T>, which cannot be aborted (see
// gloo_context.h) and chunks by its own rounding. This is the textbook ring
// with exact chunks: in step s (0 <= s <= n-2) rank r sends the partial sum
// of chunk (r-s-1) mod n to rank r+1 and receives chunk (r-s-2) mod n from
// rank r-1, adding its own input to it; after n-1 steps rank r holds chunk r
// reduced over all ranks. Each rank moves (n-1)/n of the input, the optimum.
//
// Chunks are cut into segments, and a segment is forwarded as soon as it is
// reduced, so the wire and the reduction overlap within a step and across
// steps.
//
//   step 0: send own input chunk          ──▶ r+1
//   step s: recv partial from r-1, add own input, forward to r+1 (segment by segment)
//   step n-2: the last reduction lands in `output`
//
// Scratch: two receive buffers and up to two accumulators of one chunk each.
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

// Runs the ring on `context` (size >= 2). Throws what gloo throws (see
// gloo_context.h for the abortable buffers it goes through).
void RingReduceScatter(const std::shared_ptr<::gloo::Context>& context,
                       const RingReduceScatterArgs& args);

}  // namespace mesh::gloo_backend
