// Helpers of the NCCL GPU tests (label gpu): device tensors from and to
// host values, and whether NCCL and enough devices are there.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "mesh/build_info.h"
#include "mesh/cuda_stream.h"
#include "mesh/device.h"
#include "mesh/float16.h"
#include "mesh/tensor.h"

namespace mesh::nccl_gpu_test {

inline constexpr Device kCuda0 = Device::Cuda(0);
inline constexpr absl::Duration kSync = absl::Seconds(60);

#define ASSERT_OK(expr)                          \
  do {                                           \
    const absl::Status _s = (expr);              \
    ASSERT_TRUE(_s.ok()) << #expr << ": " << _s; \
  } while (false)

// ---- Host <-> device helpers. ------------------------------------------------

inline void SetElement(const Tensor& cpu, int64_t i, double v) {
  switch (cpu.dtype()) {
    case DType::kFloat32:
      cpu.data_as<float>()[i] = static_cast<float>(v);
      return;
    case DType::kFloat64:
      cpu.data_as<double>()[i] = v;
      return;
    case DType::kFloat16:
      cpu.data_as<Float16>()[i] = Float16(static_cast<float>(v));
      return;
    case DType::kBFloat16:
      cpu.data_as<BFloat16>()[i] = BFloat16(static_cast<float>(v));
      return;
    case DType::kInt8:
      cpu.data_as<int8_t>()[i] = static_cast<int8_t>(v);
      return;
    case DType::kUInt8:
      cpu.data_as<uint8_t>()[i] = static_cast<uint8_t>(v);
      return;
    case DType::kInt32:
      cpu.data_as<int32_t>()[i] = static_cast<int32_t>(v);
      return;
    case DType::kInt64:
      cpu.data_as<int64_t>()[i] = static_cast<int64_t>(v);
      return;
    case DType::kBool:
      cpu.data_as<uint8_t>()[i] = v != 0 ? 1 : 0;
      return;
  }
}

inline double GetElement(const Tensor& cpu, int64_t i) {
  switch (cpu.dtype()) {
    case DType::kFloat32:
      return cpu.data_as<float>()[i];
    case DType::kFloat64:
      return cpu.data_as<double>()[i];
    case DType::kFloat16:
      return static_cast<float>(cpu.data_as<Float16>()[i]);
    case DType::kBFloat16:
      return static_cast<float>(cpu.data_as<BFloat16>()[i]);
    case DType::kInt8:
      return cpu.data_as<int8_t>()[i];
    case DType::kUInt8:
      return cpu.data_as<uint8_t>()[i];
    case DType::kInt32:
      return cpu.data_as<int32_t>()[i];
    case DType::kInt64:
      return static_cast<double>(cpu.data_as<int64_t>()[i]);
    case DType::kBool:
      return cpu.data_as<uint8_t>()[i];
  }
  return NAN;
}

// A contiguous device tensor holding `values` (converted to dtype).
inline absl::StatusOr<Tensor> Upload(DType dtype, std::vector<int64_t> shape,
                                     const std::vector<double>& values, Device device = kCuda0) {
  absl::StatusOr<Tensor> host = Tensor::Empty(dtype, shape);
  if (!host.ok()) return host.status();
  if (static_cast<size_t>(host->numel()) != values.size()) {
    return absl::InvalidArgumentError("value count does not match the shape");
  }
  for (int64_t i = 0; i < host->numel(); ++i) SetElement(*host, i, values[i]);
  absl::StatusOr<Tensor> dev = Tensor::Empty(dtype, shape, device);
  if (!dev.ok()) return dev.status();
  if (absl::Status s = CopyTensor(*dev, *host); !s.ok()) return s;
  return dev;
}

// The tensor's values, read on the legacy default stream (which
// Work::Wait has ordered after the op when it is the current stream).
inline std::vector<double> Download(const Tensor& dev) {
  absl::StatusOr<Tensor> host = Tensor::Empty(dev.dtype(), dev.shape());
  EXPECT_TRUE(host.ok()) << host.status();
  if (!host.ok()) return {};
  const absl::Status s = CopyTensor(*host, dev);
  EXPECT_TRUE(s.ok()) << s;
  std::vector<double> out(host->numel());
  for (int64_t i = 0; i < host->numel(); ++i) out[i] = GetElement(*host, i);
  return out;
}

inline std::vector<double> Iota(int n, double start = 1) {
  std::vector<double> v(n);
  for (int i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

inline bool HaveNcclAndDevice(int devices = 1) {
  return GetBuildInfo().has_nccl && CudaDeviceCount() >= devices;
}

}  // namespace mesh::nccl_gpu_test
