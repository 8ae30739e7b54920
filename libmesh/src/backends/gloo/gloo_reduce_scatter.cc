#include "backends/gloo/gloo_reduce_scatter.h"

#include <algorithm>
#include <array>
#include <vector>

#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include "common/check.h"
#include "cpu_pool.h"

namespace mesh::gloo_backend {
namespace {

// gloo's own collectives use slot prefixes 0x01..0x08; ours stay clear of
// them so a reduce-scatter can never match another collective's messages.
constexpr uint8_t kReduceScatterSlotPrefix = 0x20;

}  // namespace

void RingReduceScatter(const std::shared_ptr<::gloo::Context>& context,
                       const RingReduceScatterArgs& args) {
  const int n = context->size;
  const int r = context->rank;
  MESH_CHECK(n >= 2, "ring reduce-scatter needs two or more ranks");
  MESH_CHECK(args.count > 0 && args.element_size > 0, "ring reduce-scatter of nothing");

  const size_t elem = args.element_size;
  const size_t chunk = args.count * elem;
  const size_t seg = std::min(chunk, std::max(elem, args.max_segment_bytes / elem * elem));
  const size_t nseg = (chunk + seg - 1) / seg;
  auto seg_len = [&](size_t k) { return std::min(seg, chunk - k * seg); };
  auto chunk_index = [&](int step, int delta) { return ((r - step - delta) % n + n) % n; };
  const int send_to = (r + 1) % n;
  const int recv_from = (r + n - 1) % n;
  const uint64_t slot = ::gloo::Slot::build(kReduceScatterSlotPrefix, args.tag);
  const int last_step = n - 2;

  const uint8_t* input = static_cast<const uint8_t*>(args.input);
  uint8_t* output = static_cast<uint8_t*>(args.output);

  // Receive buffers alternate between even and odd steps so that the next
  // step's receives can be posted while this step's are being reduced.
  // Accumulators alternate likewise: the one written in step s is forwarded
  // during step s and rewritten in step s+2, after its sends completed.
  const int num_tmp = n > 2 ? 2 : 1;
  const int num_acc = std::min(n - 2, 2);
  // From the CPU buffer pool: a fresh allocation of this size is an mmap
  // that every call would page-fault in again.
  const std::shared_ptr<void> scratch_block =
      internal::CpuPool::Global().Allocate(chunk * (num_tmp + num_acc));
  MESH_CHECK(scratch_block != nullptr, "ring reduce-scatter: cannot allocate scratch");
  uint8_t* const scratch = static_cast<uint8_t*>(scratch_block.get());
  std::array<uint8_t*, 2> tmp{};
  std::array<uint8_t*, 2> acc{};
  std::array<std::unique_ptr<::gloo::transport::UnboundBuffer>, 2> tmp_buf;
  std::array<std::unique_ptr<::gloo::transport::UnboundBuffer>, 2> acc_buf;
  for (int i = 0; i < num_tmp; ++i) {
    tmp[i] = scratch + i * chunk;
    tmp_buf[i] = context->createUnboundBuffer(tmp[i], chunk);
  }
  for (int i = 0; i < num_acc; ++i) {
    acc[i] = scratch + (num_tmp + i) * chunk;
    acc_buf[i] = context->createUnboundBuffer(acc[i], chunk);
  }
  // gloo never writes through a buffer that only sends.
  auto in_buf = context->createUnboundBuffer(const_cast<uint8_t*>(input), chunk * n);

  auto post_recvs = [&](int step) {
    auto& buf = tmp_buf[step % 2];
    for (size_t k = 0; k < nseg; ++k) buf->recv(recv_from, slot, k * seg, seg_len(k));
  };

  std::array<size_t, 2> acc_sends_pending{0, 0};
  post_recvs(0);
  const size_t first = static_cast<size_t>(chunk_index(0, 1)) * chunk;
  for (size_t k = 0; k < nseg; ++k) in_buf->send(send_to, slot, first + k * seg, seg_len(k));

  for (int s = 0; s <= last_step; ++s) {
    if (s + 1 <= last_step) post_recvs(s + 1);
    const bool last = s == last_step;
    const int p = s % 2;
    uint8_t* dest = last ? output : acc[p];
    if (!last) {
      for (; acc_sends_pending[p] > 0; --acc_sends_pending[p]) acc_buf[p]->waitSend(args.timeout);
    }
    const uint8_t* own = input + static_cast<size_t>(chunk_index(s, 2)) * chunk;
    // Segments complete in posting order: one peer, one slot, one TCP
    // stream, and gloo matches receives first in, first out.
    for (size_t k = 0; k < nseg; ++k) {
      tmp_buf[p]->waitRecv(args.timeout);
      const size_t off = k * seg;
      args.reduce(dest + off, own + off, tmp[p] + off, seg_len(k) / elem);
      if (!last) {
        acc_buf[p]->send(send_to, slot, off, seg_len(k));
        ++acc_sends_pending[p];
      }
    }
  }

  for (size_t k = 0; k < nseg; ++k) in_buf->waitSend(args.timeout);
  for (int p = 0; p < num_acc; ++p) {
    for (; acc_sends_pending[p] > 0; --acc_sends_pending[p]) acc_buf[p]->waitSend(args.timeout);
  }
}

}  // namespace mesh::gloo_backend
