#include "mesh/device.h"

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace mesh {
namespace device_internal {

void InvalidDevice(const char* what) {
  std::fprintf(stderr, "mesh::Device: %s\n", what);
  std::abort();
}

}  // namespace device_internal

absl::StatusOr<Device> Device::Parse(absl::string_view text) {
  if (text == "cpu" || text == "cpu:0") return Device::Cpu();
  absl::string_view rest = text;
  if (absl::ConsumePrefix(&rest, "cuda:")) {
    int index = 0;
    // SimpleAtoi accepts a sign and surrounding spaces; an ordinal is digits.
    const bool digits_only =
        !rest.empty() && rest.find_first_not_of("0123456789") == absl::string_view::npos;
    if (digits_only && absl::SimpleAtoi(rest, &index) && index >= 0) {
      return Device::Cuda(index);
    }
  }
  if (text == "cuda") {
    return absl::InvalidArgumentError(
        "device 'cuda' has no index: write 'cuda:N' with the CUDA ordinal, e.g. 'cuda:0'");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("invalid device '", text, "': expected 'cpu' or 'cuda:N' (N = 0, 1, ...)"));
}

std::string Device::ToString() const {
  if (is_cpu()) return "cpu";
  return absl::StrCat("cuda:", index_);
}

}  // namespace mesh
