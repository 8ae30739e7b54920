#include "bench/dtensor_pack_bench.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "mesh/config.h"
#include "mesh/tensor.h"
#include "sharding/strided_copy.h"

#if MESH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mesh::bench {

namespace {

double Gbps(int64_t bytes, const LatencyStats& s) {
  return s.p50_us > 0 ? static_cast<double>(bytes) / (s.p50_us * 1e3) : 0;
}

// Why there is nothing to measure here, or empty when there is a device.
std::string SkipReason(int device) {
#if MESH_HAVE_CUDA
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return absl::StrCat("no CUDA device (", cudaGetErrorString(err), ")");
  }
  if (device >= count) return absl::StrCat("no CUDA device ", device, " (", count, " visible)");
  return "";
#else
  (void)device;
  return "built without CUDA";
#endif
}

// Checks dst == src element for element by copying both to the host.
absl::Status CheckSame(const Tensor& dst, const Tensor& src, const char* what) {
  auto a = Tensor::Empty(DType::kFloat32, dst.shape());
  auto b = Tensor::Empty(DType::kFloat32, src.shape());
  if (!a.ok()) return a.status();
  if (!b.ok()) return b.status();
  if (absl::Status s = sharding::CopyStrided(*a, dst); !s.ok()) return s;
  if (absl::Status s = sharding::CopyStrided(*b, src); !s.ok()) return s;
  if (std::memcmp(a->data(), b->data(), a->nbytes()) != 0) {
    return absl::InternalError(absl::StrCat(what, " produced a block unlike its source"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DTensorPackResult> RunDTensorPackBench(const DTensorPackOptions& options) {
  if (options.iterations <= 0 || options.warmup < 0 || options.width <= 0 ||
      options.sizes.empty() ||
      std::any_of(options.sizes.begin(), options.sizes.end(),
                  [&](int64_t b) { return b < options.width * 4; })) {
    return absl::InvalidArgumentError(
        "iterations and width must be > 0, warmup >= 0, and every size at least one row "
        "(width * 4 bytes)");
  }
  DTensorPackResult result;
  result.device = options.device;
  result.skip_reason = SkipReason(options.device);
  if (!result.skip_reason.empty()) {
    result.skipped = true;
    return result;
  }
  const Device device = Device::Cuda(options.device);
  for (int64_t size : options.sizes) {
    DTensorPackRow row;
    row.rows = size / (options.width * 4);
    row.bytes = row.rows * options.width * 4;
    const int64_t rows = row.rows, width = options.width;
    // The tensor the block is a Shard(1) chunk of, the packed buffer, and a
    // contiguous source for the ceiling.
    auto full = Tensor::Empty(DType::kFloat32, {rows, 2 * width}, device);
    auto packed = Tensor::Empty(DType::kFloat32, {rows, width}, device);
    auto source = Tensor::Empty(DType::kFloat32, {rows, width}, device);
    if (!full.ok()) return full.status();
    if (!packed.ok()) return packed.status();
    if (!source.ok()) return source.status();
    // Deterministic data, so a wrong pack shows.
    {
      std::vector<float> host(static_cast<size_t>(rows * 2 * width));
      for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 1000);
      const Tensor h = Tensor::Contiguous(host.data(), DType::kFloat32, {rows, 2 * width});
      if (absl::Status s = CopyTensor(*full, h); !s.ok()) return s;
    }
    // Shard(1), second of two chunks: columns [width, 2 * width).
    const Tensor block(static_cast<float*>(full->data()) + width, DType::kFloat32, {rows, width},
                       {2 * width, 1}, device, full->keep_alive());

    std::vector<absl::Duration> copy, pack, unpack;
    for (int i = 0; i < options.warmup + options.iterations; ++i) {
      const bool measured = i >= options.warmup;
      absl::Time start = absl::Now();
      if (absl::Status s = CopyTensor(*source, *packed); !s.ok()) return s;
      if (measured) copy.push_back(absl::Now() - start);
      start = absl::Now();
      if (absl::Status s = sharding::CopyStrided(*packed, block); !s.ok()) return s;
      if (measured) pack.push_back(absl::Now() - start);
      start = absl::Now();
      if (absl::Status s = sharding::CopyStrided(block, *packed); !s.ok()) return s;
      if (measured) unpack.push_back(absl::Now() - start);
    }
    if (absl::Status s = sharding::CopyStrided(*packed, block); !s.ok()) return s;
    if (absl::Status s = CheckSame(*packed, block, "pack"); !s.ok()) return s;
    row.copy = Summarize(std::move(copy));
    row.pack = Summarize(std::move(pack));
    row.unpack = Summarize(std::move(unpack));
    row.copy_gbps = Gbps(row.bytes, row.copy);
    row.pack_gbps = Gbps(row.bytes, row.pack);
    row.unpack_gbps = Gbps(row.bytes, row.unpack);
    row.pack_fraction = row.copy_gbps > 0 ? row.pack_gbps / row.copy_gbps : 0;
    row.unpack_fraction = row.copy_gbps > 0 ? row.unpack_gbps / row.copy_gbps : 0;
    result.rows.push_back(row);
  }
  return result;
}

nlohmann::json ToJson(const DTensorPackResult& result) {
  nlohmann::json rows = nlohmann::json::array();
  for (const DTensorPackRow& r : result.rows) {
    rows.push_back({{"bytes", r.bytes},
                    {"rows", r.rows},
                    {"copy", ToJson(r.copy)},
                    {"pack", ToJson(r.pack)},
                    {"unpack", ToJson(r.unpack)},
                    {"copy_gbps", r.copy_gbps},
                    {"pack_gbps", r.pack_gbps},
                    {"unpack_gbps", r.unpack_gbps},
                    {"pack_fraction", r.pack_fraction},
                    {"unpack_fraction", r.unpack_fraction}});
  }
  nlohmann::json json = {{"benchmark", "dtensor_pack"}, {"skipped", result.skipped}};
  if (result.skipped) json["skip_reason"] = result.skip_reason;
  json["device"] = result.device;
  json["rows"] = rows;
  return json;
}

}  // namespace mesh::bench
