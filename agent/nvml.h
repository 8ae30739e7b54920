// GPU discovery through NVML, loaded at run time.
//
// The agent must run on hosts without NVIDIA drivers, and must build where
// the NVML headers are absent, so libnvidia-ml.so.1 is dlopen()ed and the few
// entry points it needs are declared in nvml.cc. No library means no GPUs,
// which is not an error.
//
// Indices are NVML's enumeration order (PCI bus order). CUDA uses the same
// order only with CUDA_DEVICE_ORDER=PCI_BUS_ID; the agent sets
// CUDA_VISIBLE_DEVICES by these indices, so docs/agent.md recommends that
// setting for workers that rely on CUDA ordinals matching NVML's. NVML
// ignores CUDA_VISIBLE_DEVICES, so an agent started with it set still sees
// every GPU of the host; use --gpus to restrict.
//
// Thread safety: DiscoverNvmlGpus is safe to call from any thread; it opens
// and closes its own NVML session.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mesh::agent {

struct GpuDevice {
  int index = 0;             // NVML / CUDA ordinal on this host
  std::string uuid;          // "GPU-8c1f...", empty when unknown
  std::string model;         // "NVIDIA H100 80GB HBM3", empty when unknown
  int64_t memory_bytes = 0;  // total memory; 0 when unknown
  // Minor number of its device node, /dev/nvidia<minor>; -1 when unknown
  // (then taken to be the index).
  int minor = -1;
};

// The GPUs NVML reports, in index order. `library` is the file to dlopen.
// Returns an empty list when the library cannot be loaded.
// Possible errors: UNAVAILABLE when the library loads but lacks an entry
// point, or nvmlInit / nvmlDeviceGetCount fails (driver not loaded, version
// mismatch); the message carries NVML's return code. A device whose handle,
// name, UUID or memory cannot be read is still listed, with what is known.
absl::StatusOr<std::vector<GpuDevice>> DiscoverNvmlGpus(const char* library = "libnvidia-ml.so.1");

// What one GPU is doing now, as NVML reports it.
struct GpuUsage {
  int index = 0;
  // Share of the last sample period in which a kernel ran (0..1).
  double utilization = 0;
  // Device memory in use, by every process on it.
  int64_t memory_used_bytes = 0;
};

// Samples every GPU's utilization and memory use through one NVML session,
// held open (dlopen and nvmlInit once). Sample is thread-safe; a GPU whose
// values cannot be read is left out.
class NvmlSampler {
 public:
  // Null when the library cannot be loaded or NVML does not start (no
  // driver): no GPU usage, which is not an error.
  static std::unique_ptr<NvmlSampler> Open(const char* library = "libnvidia-ml.so.1");
  ~NvmlSampler();
  NvmlSampler(const NvmlSampler&) = delete;
  NvmlSampler& operator=(const NvmlSampler&) = delete;

  std::vector<GpuUsage> Sample() const;

 private:
  struct Api;
  explicit NvmlSampler(std::unique_ptr<Api> api);
  const std::unique_ptr<Api> api_;
};

}  // namespace mesh::agent
