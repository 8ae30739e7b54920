#include "backends/gloo/gloo_ring.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "absl/functional/function_ref.h"
#include "backends/gloo/gloo_slots.h"
#include "common/check.h"
#include "cpu_pool.h"

namespace mesh::gloo_backend {
namespace {

// How a chunk of `chunk` bytes is cut: segments of `seg` bytes (whole
// elements, at most max_bytes, at least one element), the last one shorter.
struct Segmenting {
  Segmenting(size_t chunk_bytes, size_t element_size, size_t max_bytes)
      : chunk(chunk_bytes),
        seg(std::min(chunk_bytes, std::max(element_size, max_bytes / element_size * element_size))),
        count((chunk_bytes + seg - 1) / seg) {}
  size_t len(size_t k) const { return std::min(seg, chunk - k * seg); }
  size_t chunk;
  size_t seg;
  size_t count;
};

// Chunk index (r - step - delta) mod n.
size_t RingChunk(int r, int n, int step, int delta) {
  return static_cast<size_t>(((r - step - delta) % n + n) % n);
}

// The all-gather ring over `output` (n chunks), in three calls: PostRecvs
// (every receive), then any SendOwn(k) of this rank's chunk, then Forward
// (passes each arriving segment on and waits for every send).
class AllGatherRing {
 public:
  AllGatherRing(const std::shared_ptr<::gloo::Context>& context, uint8_t* output,
                const Segmenting& segs, uint32_t tag, std::chrono::milliseconds timeout)
      : n_(context->size),
        r_(context->rank),
        output_(output),
        segs_(segs),
        slot_(::gloo::Slot::build(kAllGatherSlotPrefix, tag)),
        timeout_(timeout),
        buf_(context->createUnboundBuffer(output, segs.chunk * static_cast<size_t>(n_))) {}

  // They land in distinct slots, so all can be posted before anything is
  // sent; the chunk that arrives in step s is rank (r-s-1)'s.
  void PostRecvs() {
    for (int s = 0; s < n_ - 1; ++s) {
      const size_t base = RingChunk(r_, n_, s, 1) * segs_.chunk;
      for (size_t k = 0; k < segs_.count; ++k) {
        buf_->recv(RecvFrom(), slot_, base + k * segs_.seg, segs_.len(k));
      }
    }
  }

  // Segment k of this rank's chunk, already in place in the output, to r+1.
  void SendOwn(size_t k) {
    buf_->send(SendTo(), slot_, static_cast<size_t>(r_) * segs_.chunk + k * segs_.seg,
               segs_.len(k));
    ++sends_;
  }

  void Forward() {
    for (int s = 0; s < n_ - 1; ++s) {
      const size_t base = RingChunk(r_, n_, s, 1) * segs_.chunk;
      for (size_t k = 0; k < segs_.count; ++k) {
        buf_->waitRecv(timeout_);
        if (s < n_ - 2) {
          buf_->send(SendTo(), slot_, base + k * segs_.seg, segs_.len(k));
          ++sends_;
        }
      }
    }
    for (; sends_ > 0; --sends_) buf_->waitSend(timeout_);
  }

  uint8_t* own() const { return output_ + static_cast<size_t>(r_) * segs_.chunk; }

 private:
  int SendTo() const { return (r_ + 1) % n_; }
  int RecvFrom() const { return (r_ + n_ - 1) % n_; }

  const int n_;
  const int r_;
  uint8_t* const output_;
  const Segmenting segs_;
  const uint64_t slot_;
  const std::chrono::milliseconds timeout_;
  std::unique_ptr<::gloo::transport::UnboundBuffer> buf_;
  size_t sends_ = 0;
};

// Receive slots of the reduce-scatter: segments land in a small ring of
// segment-sized buffers, each re-posted as soon as its segment is reduced,
// so what the kernel just wrote is still in cache when it is read (gloo's
// ring keeps two in flight for the same reason).
constexpr size_t kRecvSlots = 2;

// The reduce-scatter ring; `on_final(k)` runs once segment k of this rank's
// fully reduced chunk has landed in args.output.
//
// Partial sums: with `partials` (n chunks, e.g. an all-reduce's output),
// step s's partial of chunk c is written to chunk c of it and sent from
// there; each chunk is written once, so nothing waits. Without, two pooled
// chunk-sized accumulators alternate between steps, and the one written in
// step s is rewritten in step s+2 only after its sends completed.
//
// Progress: a rank blocked on an accumulator at step s needs its successor
// to post receives of step s-1 or earlier, which never waits on anything of
// step s or later, so the waits around the ring cannot form a cycle.
void ReduceScatterRing(const std::shared_ptr<::gloo::Context>& context,
                       const RingReduceScatterArgs& args, uint8_t* partials,
                       absl::FunctionRef<void(size_t)> on_final) {
  const int n = context->size;
  const int r = context->rank;
  const size_t elem = args.element_size;
  const Segmenting segs(args.count * elem, elem, args.max_segment_bytes);
  const size_t chunk = segs.chunk;
  const int send_to = (r + 1) % n;
  const int recv_from = (r + n - 1) % n;
  const uint64_t slot = ::gloo::Slot::build(kReduceScatterSlotPrefix, args.tag);
  const int last_step = n - 2;
  const size_t total = static_cast<size_t>(n - 1) * segs.count;  // Segments received.

  const uint8_t* input = static_cast<const uint8_t*>(args.input);
  uint8_t* output = static_cast<uint8_t*>(args.output);

  const int num_acc = partials != nullptr ? 0 : std::min(n - 2, 2);
  // From the CPU buffer pool: a fresh allocation of this size is an mmap
  // that every call would page-fault in again.
  const std::shared_ptr<void> scratch_block = internal::CpuPool::Global().Allocate(
      segs.seg * kRecvSlots + chunk * static_cast<size_t>(num_acc));
  MESH_CHECK(scratch_block != nullptr, "ring reduce-scatter: cannot allocate scratch");
  uint8_t* const scratch = static_cast<uint8_t*>(scratch_block.get());
  auto tmp_buf = context->createUnboundBuffer(scratch, segs.seg * kRecvSlots);
  uint8_t* const acc_base = scratch + segs.seg * kRecvSlots;
  std::array<std::unique_ptr<::gloo::transport::UnboundBuffer>, 2> acc_buf;
  for (int i = 0; i < num_acc; ++i) {
    acc_buf[i] = context->createUnboundBuffer(acc_base + static_cast<size_t>(i) * chunk, chunk);
  }
  std::unique_ptr<::gloo::transport::UnboundBuffer> partials_buf;
  if (partials != nullptr) {
    partials_buf = context->createUnboundBuffer(partials, chunk * static_cast<size_t>(n));
  }
  // gloo never writes through a buffer that only sends.
  auto in_buf =
      context->createUnboundBuffer(const_cast<uint8_t*>(input), chunk * static_cast<size_t>(n));

  // Segment g of the stream from r-1 (step g / count, segment g % count)
  // lands in slot g % kRecvSlots.
  auto post_recv = [&](size_t g) {
    tmp_buf->recv(recv_from, slot, (g % kRecvSlots) * segs.seg, segs.len(g % segs.count));
  };
  for (size_t g = 0; g < std::min(total, kRecvSlots); ++g) post_recv(g);

  const size_t first = RingChunk(r, n, 0, 1) * chunk;
  for (size_t k = 0; k < segs.count; ++k) {
    in_buf->send(send_to, slot, first + k * segs.seg, segs.len(k));
  }

  std::array<size_t, 2> acc_sends_pending{0, 0};
  size_t partial_sends = 0;
  for (int s = 0; s <= last_step; ++s) {
    const bool last = s == last_step;
    const int p = s % 2;
    const size_t c = RingChunk(r, n, s, 2);  // The chunk reduced in this step.
    uint8_t* dest = output;
    ::gloo::transport::UnboundBuffer* dest_buf = nullptr;
    size_t dest_offset = 0;
    if (!last && partials != nullptr) {
      dest = partials + c * chunk;
      dest_buf = partials_buf.get();
      dest_offset = c * chunk;
    } else if (!last) {
      for (; acc_sends_pending[p] > 0; --acc_sends_pending[p]) acc_buf[p]->waitSend(args.timeout);
      dest = acc_base + static_cast<size_t>(p) * chunk;
      dest_buf = acc_buf[p].get();
    }
    const uint8_t* own = input + c * chunk;
    // Segments complete in posting order: one peer, one slot, one TCP
    // stream, and gloo matches receives first in, first out.
    for (size_t k = 0; k < segs.count; ++k) {
      const size_t g = static_cast<size_t>(s) * segs.count + k;
      tmp_buf->waitRecv(args.timeout);
      const size_t off = k * segs.seg;
      args.reduce(dest + off, own + off, scratch + (g % kRecvSlots) * segs.seg, segs.len(k) / elem);
      if (g + kRecvSlots < total) post_recv(g + kRecvSlots);
      if (last) {
        on_final(k);
      } else {
        dest_buf->send(send_to, slot, dest_offset + off, segs.len(k));
        ++(partials != nullptr ? partial_sends : acc_sends_pending[p]);
      }
    }
  }

  for (size_t k = 0; k < segs.count; ++k) in_buf->waitSend(args.timeout);
  for (int p = 0; p < num_acc; ++p) {
    for (; acc_sends_pending[p] > 0; --acc_sends_pending[p]) acc_buf[p]->waitSend(args.timeout);
  }
  for (; partial_sends > 0; --partial_sends) partials_buf->waitSend(args.timeout);
}

}  // namespace

void RingReduceScatter(const std::shared_ptr<::gloo::Context>& context,
                       const RingReduceScatterArgs& args) {
  MESH_CHECK(context->size >= 2, "ring reduce-scatter needs two or more ranks");
  MESH_CHECK(args.count > 0 && args.element_size > 0, "ring reduce-scatter of nothing");
  ReduceScatterRing(context, args, /*partials=*/nullptr, [](size_t) {});
}

void RingAllGather(const std::shared_ptr<::gloo::Context>& context, const RingAllGatherArgs& args) {
  MESH_CHECK(context->size >= 2, "ring all-gather needs two or more ranks");
  MESH_CHECK(args.count > 0 && args.element_size > 0, "ring all-gather of nothing");
  const Segmenting segs(args.count * args.element_size, args.element_size, args.max_segment_bytes);
  AllGatherRing ring(context, static_cast<uint8_t*>(args.output), segs, args.tag, args.timeout);
  ring.PostRecvs();
  if (args.input == ring.own()) {
    for (size_t k = 0; k < segs.count; ++k) ring.SendOwn(k);
    ring.Forward();
    return;
  }
  // Send from the input while it is copied into place, so that the copy
  // overlaps the wire. gloo never writes through a buffer that only sends.
  auto in_buf = context->createUnboundBuffer(const_cast<void*>(args.input), segs.chunk);
  for (size_t k = 0; k < segs.count; ++k) {
    in_buf->send((context->rank + 1) % context->size,
                 ::gloo::Slot::build(kAllGatherSlotPrefix, args.tag), k * segs.seg, segs.len(k));
  }
  std::memcpy(ring.own(), args.input, segs.chunk);
  ring.Forward();
  for (size_t k = 0; k < segs.count; ++k) in_buf->waitSend(args.timeout);
}

void RingAllReduce(const std::shared_ptr<::gloo::Context>& context, const RingAllReduceArgs& args) {
  MESH_CHECK(context->size >= 2, "ring all-reduce needs two or more ranks");
  MESH_CHECK(args.count > 0 && args.element_size > 0, "ring all-reduce of nothing");
  MESH_CHECK(args.input != args.output, "ring all-reduce is out of place only");
  const Segmenting segs(args.count * args.element_size, args.element_size, args.max_segment_bytes);
  AllGatherRing gather(context, static_cast<uint8_t*>(args.output), segs, args.tag, args.timeout);
  gather.PostRecvs();
  RingReduceScatterArgs scatter;
  scatter.input = args.input;
  scatter.output = gather.own();
  scatter.count = args.count;
  scatter.element_size = args.element_size;
  scatter.reduce = args.reduce;
  scatter.timeout = args.timeout;
  scatter.max_segment_bytes = args.max_segment_bytes;
  scatter.tag = args.tag;
  // The output doubles as the accumulators: chunk c holds this rank's
  // partial of c until the all-gather brings c's final value, which can only
  // exist after r+1 has received that partial (it is part of the sum).
  ReduceScatterRing(context, scatter, static_cast<uint8_t*>(args.output),
                    [&](size_t k) { gather.SendOwn(k); });
  gather.Forward();
}

}  // namespace mesh::gloo_backend
