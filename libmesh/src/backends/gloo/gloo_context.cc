#include "backends/gloo/gloo_context.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <gloo/transport/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "absl/base/thread_annotations.h"

namespace mesh::gloo_backend {

namespace gt = ::gloo::transport;

// The registry of a context's live buffers, shared by the context and every
// buffer (a buffer may outlive the context's use of it inside gloo).
class AbortRegistry {
 public:
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  void ThrowIfAborted() const {
    if (aborted()) throw AbortedError();
  }

  void Add(gt::UnboundBuffer* buffer) {
    absl::MutexLock lock(&mu_);
    live_.insert(buffer);
  }

  void Remove(gt::UnboundBuffer* buffer) {
    absl::MutexLock lock(&mu_);
    live_.erase(buffer);
  }

  // The flag is set before the buffers are poked, and every wait checks the
  // flag before it blocks, so a wait either sees the flag or is poked: the
  // abort flags of gloo's buffers are sticky until a wait consumes them.
  void Abort() {
    aborted_.store(true, std::memory_order_release);
    absl::MutexLock lock(&mu_);
    for (gt::UnboundBuffer* buffer : live_) {
      buffer->abortWaitRecv();
      buffer->abortWaitSend();
    }
  }

 private:
  std::atomic<bool> aborted_{false};
  absl::Mutex mu_;
  std::set<gt::UnboundBuffer*> live_ ABSL_GUARDED_BY(mu_);
};

namespace {

// Forwards to gloo's tcp buffer. Gloo's tcp pair casts the buffer it is
// handed to its own type, so the inner buffer, never this one, must reach the
// pair: the inner buffer's send/recv do exactly that.
class InterposedBuffer final : public gt::UnboundBuffer {
 public:
  InterposedBuffer(std::unique_ptr<gt::UnboundBuffer> inner,
                   std::shared_ptr<AbortRegistry> registry)
      : gt::UnboundBuffer(inner->ptr, inner->size),
        inner_(std::move(inner)),
        registry_(std::move(registry)) {
    registry_->Add(inner_.get());
  }

  ~InterposedBuffer() override { registry_->Remove(inner_.get()); }

  using gt::UnboundBuffer::waitRecv;
  using gt::UnboundBuffer::waitSend;

  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    return Wait(/*recv=*/true, rank, timeout);
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    return Wait(/*recv=*/false, rank, timeout);
  }

  void abortWaitRecv() override { inner_->abortWaitRecv(); }
  void abortWaitSend() override { inner_->abortWaitSend(); }

  void send(int dst_rank, uint64_t slot, size_t offset, size_t nbytes) override {
    registry_->ThrowIfAborted();
    Track(pending_sends_, dst_rank);
    inner_->send(dst_rank, slot, offset, nbytes);
  }

  void recv(int src_rank, uint64_t slot, size_t offset, size_t nbytes) override {
    registry_->ThrowIfAborted();
    Track(pending_recvs_, src_rank);
    inner_->recv(src_rank, slot, offset, nbytes);
  }

  void recv(std::vector<int> src_ranks, uint64_t slot, size_t offset, size_t nbytes) override {
    registry_->ThrowIfAborted();
    // Recv-from-any: the suspects are unknown until it completes.
    inner_->recv(std::move(src_ranks), slot, offset, nbytes);
  }

 private:
  bool Wait(bool recv, int* rank, std::chrono::milliseconds timeout) {
    registry_->ThrowIfAborted();
    int peer = -1;
    bool completed = false;
    try {
      completed = recv ? inner_->waitRecv(&peer, timeout) : inner_->waitSend(&peer, timeout);
    } catch (const ::gloo::IoException& e) {
      registry_->ThrowIfAborted();
      throw PeerIoError(e.what(), Suspects(recv ? pending_recvs_ : pending_sends_));
    }
    if (!completed) {
      // Only Abort() pokes buffers, and it sets the flag first.
      registry_->ThrowIfAborted();
      throw AbortedError();
    }
    Untrack(recv ? pending_recvs_ : pending_sends_, peer);
    if (rank != nullptr) *rank = peer;
    return true;
  }

  void Track(std::vector<int>& pending, int peer) {
    absl::MutexLock lock(&mu_);
    pending.push_back(peer);
  }

  void Untrack(std::vector<int>& pending, int peer) {
    absl::MutexLock lock(&mu_);
    auto it = std::find(pending.begin(), pending.end(), peer);
    if (it != pending.end()) pending.erase(it);
  }

  std::vector<int> Suspects(const std::vector<int>& pending) {
    absl::MutexLock lock(&mu_);
    std::vector<int> peers = pending;
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    return peers;
  }

  const std::unique_ptr<gt::UnboundBuffer> inner_;
  const std::shared_ptr<AbortRegistry> registry_;
  // Posting (send/recv) and waiting may happen on different threads for
  // point-to-point ops.
  absl::Mutex mu_;
  std::vector<int> pending_sends_ ABSL_GUARDED_BY(mu_);
  std::vector<int> pending_recvs_ ABSL_GUARDED_BY(mu_);
};

// Delegates everything to gloo's transport context except buffer creation.
class InterposingTransportContext final : public gt::Context {
 public:
  InterposingTransportContext(std::shared_ptr<gt::Context> inner,
                              std::shared_ptr<AbortRegistry> registry)
      : gt::Context(inner->rank, inner->size),
        inner_(std::move(inner)),
        registry_(std::move(registry)) {
    setTimeout(inner_->getTimeout());
  }

  std::unique_ptr<gt::Pair>& getPair(int rank) override { return inner_->getPair(rank); }
  std::unique_ptr<gt::Pair>& createPair(int rank) override { return inner_->createPair(rank); }

  std::unique_ptr<gt::UnboundBuffer> createUnboundBuffer(void* ptr, size_t size) override {
    return std::make_unique<InterposedBuffer>(inner_->createUnboundBuffer(ptr, size), registry_);
  }

 private:
  const std::shared_ptr<gt::Context> inner_;
  const std::shared_ptr<AbortRegistry> registry_;
};

}  // namespace

GlooContext::GlooContext(int rank, int size)
    : ::gloo::rendezvous::Context(rank, size), registry_(std::make_shared<AbortRegistry>()) {}

GlooContext::~GlooContext() = default;

void GlooContext::Connect(::gloo::rendezvous::Store& store,
                          std::shared_ptr<::gloo::transport::Device> device) {
  connectFullMesh(store, device);
  transportContext_ =
      std::make_shared<InterposingTransportContext>(std::move(transportContext_), registry_);
}

void GlooContext::Abort() {
  registry_->Abort();
  if (transportContext_ == nullptr) return;  // Never connected.
  // Hard-closes every pair (SO_LINGER 0: peers see a reset at once).
  try {
    closeConnections();
  } catch (const std::exception&) {
    // A pair that already failed may complain; it is closed either way.
  }
}

bool GlooContext::aborted() const { return registry_->aborted(); }

}  // namespace mesh::gloo_backend
