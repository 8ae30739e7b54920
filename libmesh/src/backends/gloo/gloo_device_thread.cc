#include "backends/gloo/gloo_device_thread.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <utility>

#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/loop.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/duration_format.h"

namespace mesh::gloo_backend {
namespace {

namespace tcp = ::gloo::transport::tcp;

// What the device thread reports back.
struct Outcome {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  pid_t tid ABSL_GUARDED_BY(mu) = 0;
  absl::Status status ABSL_GUARDED_BY(mu);
};

// Watches an eventfd on the device's epoll loop; the loop calls
// handleEvents on its own thread, which is the point.
class SwitchPolicyHandler final : public tcp::Handler {
 public:
  SwitchPolicyHandler(int fd, std::shared_ptr<Outcome> outcome)
      : fd_(fd), outcome_(std::move(outcome)) {}
  ~SwitchPolicyHandler() override { ::close(fd_); }

  int fd() const { return fd_; }

  void handleEvents(int /*events*/) override {
    // Drain the counter: the descriptor is level-triggered, and a readable
    // one would make the loop call us again at once.
    uint64_t value = 0;
    while (::read(fd_, &value, sizeof(value)) < 0 && errno == EINTR) {
    }
    absl::MutexLock lock(&outcome_->mu);
    if (outcome_->done) return;
    struct sched_param param {};
    param.sched_priority = 0;
    // pid 0: the calling thread (sched_setscheduler is per thread on Linux).
    if (sched_setscheduler(0, SCHED_BATCH, &param) != 0) {
      outcome_->status = absl::InternalError(absl::StrCat(
          "gloo: cannot switch the device thread to SCHED_BATCH: ", std::strerror(errno)));
    }
    outcome_->tid = static_cast<pid_t>(::syscall(SYS_gettid));
    outcome_->done = true;
  }

 private:
  const int fd_;
  const std::shared_ptr<Outcome> outcome_;
};

}  // namespace

absl::StatusOr<pid_t> SetDeviceThreadBatchPolicy(
    const std::shared_ptr<::gloo::transport::Device>& device, absl::Duration timeout) {
  auto* tcp_device = dynamic_cast<tcp::Device*>(device.get());
  if (tcp_device == nullptr) {
    return absl::InvalidArgumentError("gloo: SetDeviceThreadBatchPolicy needs a TCP device");
  }
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("gloo: eventfd: ", std::strerror(errno)));
  }
  auto outcome = std::make_shared<Outcome>();
  auto handler = std::make_unique<SwitchPolicyHandler>(fd, outcome);
  try {
    tcp_device->registerDescriptor(fd, EPOLLIN, handler.get());
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("gloo: cannot watch an eventfd: ", e.what()));
  }
  const uint64_t one = 1;
  while (::write(fd, &one, sizeof(one)) < 0 && errno == EINTR) {
  }

  pid_t tid = 0;
  absl::Status status;
  {
    absl::MutexLock lock(&outcome->mu);
    if (!outcome->mu.AwaitWithTimeout(absl::Condition(&outcome->done), timeout)) {
      // The loop is stuck in some other handler. Unregistering would wait
      // for its next tick, so leave the handler registered (it stays
      // harmless and owns the descriptor) rather than block past `timeout`.
      static_cast<void>(handler.release());
      return absl::DeadlineExceededError(absl::StrCat("gloo: the device thread did not run within ",
                                                      FormatDurationShort(timeout)));
    }
    tid = outcome->tid;
    status = outcome->status;
  }
  // Returns after the loop's next tick, so the handler is never called
  // again once it is destroyed below.
  try {
    tcp_device->unregisterDescriptor(fd, handler.get());
  } catch (const std::exception&) {
    // The descriptor is closed with the handler either way.
  }
  handler.reset();
  if (!status.ok()) return status;
  return tid;
}

}  // namespace mesh::gloo_backend
