// GlooContext: a gloo::Context whose blocking waits can be ended from another
// thread (internal to libmesh's Gloo backend).
//
// Why this exists: gloo's collectives block inside UnboundBuffer::waitRecv /
// waitSend until data arrives or gloo's per-op timeout fires. Closing the
// group's connections (gloo::Context::closeConnections) makes the *peers*
// fail at once, but not this process's own blocked thread: a locally closed
// tcp pair never signals its pending buffers. So the context interposes on
// every unbound buffer gloo creates through it (its own collectives create
// their scratch buffers through the context too) and keeps a registry of the
// live ones. Abort() marks the context aborted, wakes every pending wait with
// UnboundBuffer::abortWait{Recv,Send}, and closes the connections; from then
// on every wait, send and recv on a buffer of this context throws
// AbortedError, so the running collective unwinds within microseconds.
//
// The interposed buffers also remember which peers each has a send or recv
// outstanding with, so that a transport error names the peer rank(s) an op
// was waiting on (gloo's own message names only an address).
//
// Only algorithms built on unbound buffers are abortable this way; the old
// bound-buffer algorithms (AllreduceHalvingDoubling<T>, ...) are not used.
//
// Thread safety: Abort() and aborted() may be called from any thread while
// one thread runs ops; gloo's own rules apply to everything else.
#pragma once

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

#include "absl/synchronization/mutex.h"

namespace mesh::gloo_backend {

// Thrown by a buffer of an aborted context. The group replaces it with the
// abort reason.
struct AbortedError : public ::gloo::Exception {
  AbortedError() : ::gloo::Exception("gloo context aborted") {}
};

// gloo's transport error (or timeout), plus the peer ranks (context ranks)
// the failed buffer had operations outstanding with.
struct PeerIoError : public ::gloo::IoException {
  PeerIoError(const std::string& what, std::vector<int> peers)
      : ::gloo::IoException(what), peers(std::move(peers)) {}
  std::vector<int> peers;
};

class AbortRegistry;

class GlooContext final : public ::gloo::rendezvous::Context {
 public:
  GlooContext(int rank, int size);
  ~GlooContext() override;

  // gloo's full-mesh rendezvous through `store`, then the interposition
  // described above. Throws what gloo throws (IoException for connect
  // timeouts, the store adapter's exceptions for store failures).
  void Connect(::gloo::rendezvous::Store& store, std::shared_ptr<::gloo::transport::Device> device);

  // Ends every pending and future wait of this context and closes its
  // connections so that peers fail promptly too. Idempotent; never blocks
  // on peers.
  void Abort();
  bool aborted() const;

 private:
  const std::shared_ptr<AbortRegistry> registry_;
};

}  // namespace mesh::gloo_backend
