// systemd service notifications (sd_notify(3)) for mesh-coordinator and
// mesh-agent: readiness for Type=notify units, STOPPING=1 when shutdown
// starts, and watchdog pings for WatchdogSec=.
//
// Everything here is a no-op when the process was not started by systemd
// with a notification socket (NOTIFY_SOCKET unset): the same binary runs
// under systemd, in a container, or by hand. The socket may be a path or an
// abstract name ("@..."), as libsystemd handles both.
//
//   NotifyReady("serving on 0.0.0.0:7450")   once the service accepts work
//   WatchdogPinger::StartIfEnabled(healthy)   WATCHDOG=1 at half the interval
//   NotifyStopping()                          when shutdown begins
//
// Errors: the Notify* calls return OK when the message was sent or when
// there is no socket to send it to, and UNAVAILABLE (with the errno text)
// when sending failed (also logged as a warning, so callers may ignore it:
// a lost readiness message makes systemd time the unit out, which is the
// right failure).
// WatchdogInterval returns INVALID_ARGUMENT for a malformed WATCHDOG_USEC
// or WATCHDOG_PID.
//
// Thread safety: the functions are thread-safe (each sends one datagram).
// WatchdogPinger: Stop() and the destructor from one thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace mesh::systemd {

// Sends READY=1, plus STATUS=<status> when `status` is not empty.
absl::Status NotifyReady(std::string_view status = "");

// Sends STOPPING=1: systemd then waits for the process to exit (up to
// TimeoutStopSec) instead of treating the exit as a crash.
absl::Status NotifyStopping();

// Sends WATCHDOG=1. Harmless when the unit has no WatchdogSec.
absl::Status NotifyWatchdog();

// Sends STATUS=<status>, shown by `systemctl status`.
absl::Status NotifyStatus(std::string_view status);

// The interval within which systemd expects WATCHDOG=1 (the unit's
// WatchdogSec, from WATCHDOG_USEC), or absl::ZeroDuration() when the
// watchdog is off for this process: WATCHDOG_USEC unset, or WATCHDOG_PID
// naming another process (a child that inherited the environment).
absl::StatusOr<absl::Duration> WatchdogInterval();

// A thread that calls `healthy()` every `interval / 2` and sends
// WATCHDOG=1 only when it returns true. A hung process is thereby caught
// two ways: a `healthy` that blocks (e.g. on a deadlocked mutex) sends
// nothing, and so does one that reports a fault. systemd then kills and
// restarts the service (Restart=on-failure).
class WatchdogPinger {
 public:
  // Starts pinging every `interval / 2`. `healthy` runs on the pinger's
  // thread and must be thread-safe with whatever it inspects.
  static std::unique_ptr<WatchdogPinger> Start(absl::Duration interval,
                                               absl::AnyInvocable<bool()> healthy);

  // Start(WatchdogInterval(), healthy) when the watchdog is on; null when
  // it is off or WATCHDOG_USEC is malformed (logged).
  static std::unique_ptr<WatchdogPinger> StartIfEnabled(absl::AnyInvocable<bool()> healthy);

  // Stops the thread (Stop()).
  ~WatchdogPinger();

  WatchdogPinger(const WatchdogPinger&) = delete;
  WatchdogPinger& operator=(const WatchdogPinger&) = delete;

  // No more pings after this returns; waits for a running `healthy()` call.
  // Idempotent. Call it when shutdown starts, before NotifyStopping.
  void Stop();

 private:
  WatchdogPinger(absl::Duration period, absl::AnyInvocable<bool()> healthy);
  void Run();

  const absl::Duration period_;
  absl::AnyInvocable<bool()> healthy_;
  absl::Notification stop_;
  std::thread thread_;  // Last: started after the members it reads.
};

}  // namespace mesh::systemd
