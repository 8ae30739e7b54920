// Scheduling of gloo's TCP device thread (internal to libmesh's Gloo backend).
//
// Why this exists: gloo's TCP transport (Debian's libgloo, the same library
// torch links) serves every socket of a device from one epoll thread. When a
// socket is readable, that thread tries to take the pair's mutex with
// try_lock and, if the collective's own thread holds it (Pair::send and
// Pair::recv hold it across their writev), returns to epoll_wait at once:
// the socket is still readable, so the thread spins through epoll_wait until
// the holder lets go. The holder is often not running: its writev to
// loopback wakes the peer's device thread, which preempts it on the same CPU.
// On a small, busy machine the spinning thread then takes the CPU the holder
// needs, and the holder gets it back only at the next scheduler tick: a
// 64 KiB all_reduce took 3-5 ms instead of ~0.15 ms, in a state that, once
// entered, persisted for hundreds of ops (measured with uprobes on libgloo:
// 600k failed try_locks for 200 ops, Pair::send/recv holding the lock for
// 4-9 ms where the median is 3 us; docs/performance.md, "Small messages").
//
// The fix here: run the device thread under SCHED_BATCH. A SCHED_BATCH
// thread that wakes up never preempts the running thread (Linux skips wakeup
// preemption for it); it runs when the CPU is idle, when the running thread
// blocks, or at the next tick. So the device thread no longer knocks the
// collective thread off its CPU in the middle of a locked send, and the spin
// has nothing to wait for. Its nice value (its CPU share) is unchanged, and
// switching between SCHED_OTHER and SCHED_BATCH needs no privilege.
//
// Thread safety: thread-safe; each call talks to the device's own thread.
#pragma once

#include <sys/types.h>

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gloo::transport {
class Device;
}  // namespace gloo::transport

namespace mesh::gloo_backend {

// Switches the event-loop thread of `device` (a gloo TCP device) to
// SCHED_BATCH, from that thread itself, and returns its thread id. Waits up
// to `timeout` for the thread to run the switch.
//
// Errors: INVALID_ARGUMENT when `device` is null or not a TCP device;
// DEADLINE_EXCEEDED when the device thread did not get to it in time (the
// switch may still happen later); INTERNAL when the thread could not change
// its policy (errno's text) or gloo refused to watch the wake-up descriptor.
absl::StatusOr<pid_t> SetDeviceThreadBatchPolicy(
    const std::shared_ptr<::gloo::transport::Device>& device,
    absl::Duration timeout = absl::Seconds(10));

}  // namespace mesh::gloo_backend
