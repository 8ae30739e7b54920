// Where a tensor's memory lives: the host, or one CUDA device.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mesh {
namespace device_internal {
// Prints `what` and aborts; out of line so the header needs no logging.
[[noreturn]] void InvalidDevice(const char* what);
}  // namespace device_internal

enum class DeviceType : uint8_t {
  kCpu,   // Host memory, pageable or pinned.
  kCuda,  // Memory of one CUDA device, named by its runtime ordinal.
};

// A (type, index) pair, printed and parsed the way PyTorch does: "cpu",
// "cuda:0". The index is the CUDA runtime ordinal as this process sees it
// (after CUDA_VISIBLE_DEVICES). Invariant: a CPU device has index 0, so two
// CPU devices always compare equal.
//
// Thread safety: an immutable value type.
class Device {
 public:
  // The CPU.
  constexpr Device() = default;

  // Trusted construction; aborts on a negative index or a CPU index other
  // than 0. Use Parse for input from users.
  constexpr Device(DeviceType type, int index) : type_(type), index_(index) {
    if (index < 0) device_internal::InvalidDevice("negative device index");
    if (type == DeviceType::kCpu && index != 0) {
      device_internal::InvalidDevice("the CPU device has index 0");
    }
  }

  static constexpr Device Cpu() { return Device(); }
  static constexpr Device Cuda(int index) { return Device(DeviceType::kCuda, index); }

  // Accepts "cpu", "cpu:0" and "cuda:N". A bare "cuda" is rejected rather
  // than guessed: in a multi-GPU worker, "the current device" is exactly the
  // ambiguity that puts two ranks on one GPU.
  // Possible errors: INVALID_ARGUMENT naming the bad text.
  static absl::StatusOr<Device> Parse(absl::string_view text);

  constexpr DeviceType type() const { return type_; }
  constexpr int index() const { return index_; }
  constexpr bool is_cpu() const { return type_ == DeviceType::kCpu; }
  constexpr bool is_cuda() const { return type_ == DeviceType::kCuda; }

  // "cpu" or "cuda:N"; Parse(ToString()) returns the same device.
  std::string ToString() const;

  friend constexpr bool operator==(const Device& a, const Device& b) {
    return a.type_ == b.type_ && a.index_ == b.index_;
  }

  template <typename H>
  friend H AbslHashValue(H h, const Device& d) {
    return H::combine(std::move(h), d.type_, d.index_);
  }

  friend std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.ToString(); }

 private:
  DeviceType type_ = DeviceType::kCpu;
  int index_ = 0;
};

}  // namespace mesh
