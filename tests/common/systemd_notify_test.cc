// The sd_notify wrapper against a real AF_UNIX datagram socket that the test
// binds and names in NOTIFY_SOCKET, as systemd does for a Type=notify unit.
#include "common/systemd_notify.h"

#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <optional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace mesh::systemd {
namespace systemd_notify_test {

using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(5);

// A datagram socket bound in a fresh directory, named by NOTIFY_SOCKET while
// it lives; the environment variables are restored on destruction.
class NotifySocket {
 public:
  NotifySocket() {
    char dir_template[] = "/tmp/mesh-sd-notify-XXXXXX";
    const char* dir = mkdtemp(dir_template);
    EXPECT_NE(dir, nullptr);
    dir_ = dir != nullptr ? dir : "";
    path_ = dir_ + "/notify";
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd_, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path_.c_str());
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  }
  ~NotifySocket() {
    unsetenv("NOTIFY_SOCKET");
    close(fd_);
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }

  // The next datagram, or nullopt when none arrives within `timeout`.
  std::optional<std::string> Receive(absl::Duration timeout = kWait) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) != 1) {
      return std::nullopt;
    }
    char buffer[4096];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    if (n < 0) return std::nullopt;
    return std::string(buffer, static_cast<size_t>(n));
  }

 private:
  std::string dir_;
  std::string path_;
  int fd_ = -1;
};

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(SystemdNotifyTest, ReadyStoppingAndWatchdogArrive) {
  NotifySocket socket;
  ASSERT_TRUE(NotifyReady("serving on 127.0.0.1:7450").ok());
  EXPECT_EQ(socket.Receive(), "READY=1\nSTATUS=serving on 127.0.0.1:7450");
  ASSERT_TRUE(NotifyReady().ok());
  EXPECT_EQ(socket.Receive(), "READY=1");
  ASSERT_TRUE(NotifyWatchdog().ok());
  EXPECT_EQ(socket.Receive(), "WATCHDOG=1");
  ASSERT_TRUE(NotifyStatus("draining").ok());
  EXPECT_EQ(socket.Receive(), "STATUS=draining");
  ASSERT_TRUE(NotifyStopping().ok());
  EXPECT_EQ(socket.Receive(), "STOPPING=1");
}

TEST(SystemdNotifyTest, WithoutNotifySocketEverythingIsANoOp) {
  unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(NotifyReady("x").ok());
  EXPECT_TRUE(NotifyWatchdog().ok());
  EXPECT_TRUE(NotifyStopping().ok());
  EXPECT_TRUE(NotifyStatus("x").ok());
}

TEST(SystemdNotifyTest, ASocketNobodyListensOnIsUnavailable) {
  ScopedEnv env("NOTIFY_SOCKET", "/nonexistent-mesh-dir/notify");
  const absl::Status status = NotifyReady();
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("READY=1"));
}

TEST(SystemdNotifyTest, WatchdogIntervalComesFromWatchdogUsecForThisPid) {
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  ASSERT_TRUE(WatchdogInterval().ok());
  EXPECT_EQ(*WatchdogInterval(), absl::ZeroDuration());  // No watchdog.

  ScopedEnv usec("WATCHDOG_USEC", "2500000");
  ASSERT_TRUE(WatchdogInterval().ok());
  EXPECT_EQ(*WatchdogInterval(), absl::Milliseconds(2500));  // No PID: ours.
  {
    ScopedEnv pid("WATCHDOG_PID", absl::StrCat(getpid()));
    ASSERT_TRUE(WatchdogInterval().ok());
    EXPECT_EQ(*WatchdogInterval(), absl::Milliseconds(2500));
  }
  {
    // Set for another process (we inherited it): off for us.
    ScopedEnv pid("WATCHDOG_PID", absl::StrCat(getpid() + 1));
    ASSERT_TRUE(WatchdogInterval().ok());
    EXPECT_EQ(*WatchdogInterval(), absl::ZeroDuration());
  }
}

TEST(SystemdNotifyTest, MalformedWatchdogUsecIsInvalidArgument) {
  {
    ScopedEnv usec("WATCHDOG_USEC", "soon");
    EXPECT_TRUE(absl::IsInvalidArgument(WatchdogInterval().status()));
    EXPECT_EQ(WatchdogPinger::StartIfEnabled([] { return true; }), nullptr);
  }
  {
    ScopedEnv usec("WATCHDOG_USEC", "1000000");
    ScopedEnv pid("WATCHDOG_PID", "not-a-pid");
    EXPECT_TRUE(absl::IsInvalidArgument(WatchdogInterval().status()));
  }
}

TEST(SystemdNotifyTest, PingerIsOffWithoutWatchdogUsec) {
  unsetenv("WATCHDOG_USEC");
  EXPECT_EQ(WatchdogPinger::StartIfEnabled([] { return true; }), nullptr);
}

TEST(SystemdNotifyTest, PingerPingsWhileHealthyAndStopsOnStop) {
  NotifySocket socket;
  ScopedEnv usec("WATCHDOG_USEC", "100000");  // 100 ms: pings every 50 ms.
  std::unique_ptr<WatchdogPinger> pinger = WatchdogPinger::StartIfEnabled([] { return true; });
  ASSERT_NE(pinger, nullptr);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(socket.Receive(), "WATCHDOG=1") << "ping " << i;
  pinger->Stop();
  // Drain what was sent before Stop returned; then nothing more comes.
  while (socket.Receive(absl::ZeroDuration()).has_value()) {
  }
  EXPECT_EQ(socket.Receive(absl::Milliseconds(200)), std::nullopt);
  pinger->Stop();  // Idempotent.
}

TEST(SystemdNotifyTest, PingerWithholdsPingsWhileUnhealthy) {
  NotifySocket socket;
  std::atomic<bool> healthy{false};
  absl::Mutex mu;
  int checks = 0;
  std::unique_ptr<WatchdogPinger> pinger = WatchdogPinger::Start(absl::Milliseconds(20), [&] {
    absl::MutexLock lock(&mu);
    ++checks;
    return healthy.load();
  });
  // Three unhealthy checks in, nothing has been sent.
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                        +[](int* n) { return *n >= 3; }, &checks),
                                    kWait));
  }
  EXPECT_EQ(socket.Receive(absl::ZeroDuration()), std::nullopt);
  // Healthy again: pings resume.
  healthy = true;
  EXPECT_EQ(socket.Receive(), "WATCHDOG=1");
}

}  // namespace systemd_notify_test
}  // namespace mesh::systemd
