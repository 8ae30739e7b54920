#include "common/systemd_notify.h"

#include <cerrno>
#include <cstring>
#include <string>

#include <systemd/sd-daemon.h>

#include <spdlog/spdlog.h>

#include "common/duration_format.h"

namespace mesh::systemd {
namespace {

// sd_notify returns > 0 when sent, 0 when NOTIFY_SOCKET is unset, and a
// negative errno when sending failed.
absl::Status Send(const std::string& message) {
  const int r = sd_notify(/*unset_environment=*/0, message.c_str());
  if (r >= 0) return absl::OkStatus();
  return absl::UnavailableError("sd_notify(\"" + message +
                                "\") to $NOTIFY_SOCKET failed: " + std::strerror(-r));
}

}  // namespace

absl::Status NotifyReady(std::string_view status) {
  std::string message = "READY=1";
  if (!status.empty()) message += "\nSTATUS=" + std::string(status);
  return Send(message);
}

absl::Status NotifyStopping() { return Send("STOPPING=1"); }

absl::Status NotifyWatchdog() { return Send("WATCHDOG=1"); }

absl::Status NotifyStatus(std::string_view status) { return Send("STATUS=" + std::string(status)); }

absl::StatusOr<absl::Duration> WatchdogInterval() {
  uint64_t usec = 0;
  const int r = sd_watchdog_enabled(/*unset_environment=*/0, &usec);
  if (r < 0) {
    return absl::InvalidArgumentError(std::string("WATCHDOG_USEC or WATCHDOG_PID is malformed: ") +
                                      std::strerror(-r));
  }
  if (r == 0) return absl::ZeroDuration();
  return absl::Microseconds(static_cast<int64_t>(usec));
}

std::unique_ptr<WatchdogPinger> WatchdogPinger::Start(absl::Duration interval,
                                                      absl::AnyInvocable<bool()> healthy) {
  return std::unique_ptr<WatchdogPinger>(new WatchdogPinger(interval / 2, std::move(healthy)));
}

std::unique_ptr<WatchdogPinger> WatchdogPinger::StartIfEnabled(absl::AnyInvocable<bool()> healthy) {
  absl::StatusOr<absl::Duration> interval = WatchdogInterval();
  if (!interval.ok()) {
    spdlog::warn("systemd watchdog off: {}", interval.status().ToString());
    return nullptr;
  }
  if (*interval <= absl::ZeroDuration()) return nullptr;
  spdlog::info("systemd watchdog: pinging every {}", FormatDurationShort(*interval / 2));
  return Start(*interval, std::move(healthy));
}

WatchdogPinger::WatchdogPinger(absl::Duration period, absl::AnyInvocable<bool()> healthy)
    : period_(period), healthy_(std::move(healthy)), thread_([this] { Run(); }) {}

WatchdogPinger::~WatchdogPinger() { Stop(); }

void WatchdogPinger::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void WatchdogPinger::Run() {
  bool reported_unhealthy = false;
  // First ping at once: the interval runs from the service's start.
  do {
    if (healthy_()) {
      NotifyWatchdog().IgnoreError();  // Logged by Send.
      reported_unhealthy = false;
    } else if (!reported_unhealthy) {
      // Once per unhealthy spell, not on every tick.
      spdlog::error("health check failed: withholding systemd watchdog pings");
      reported_unhealthy = true;
    }
  } while (!stop_.WaitForNotificationWithTimeout(period_));
}

}  // namespace mesh::systemd
