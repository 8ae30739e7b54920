#include "agent/nvml.h"

#include <dlfcn.h>

#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mesh::agent {
// Named, not anonymous: NvmlSampler::Api, a class of the header's, holds
// these types.
namespace nvml_internal {

// The subset of nvml.h the agent uses. The ABI of these _v2 entry points is
// stable across driver versions; nvmlReturn_t is an enum whose success value
// is 0.
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
constexpr unsigned kNvmlBufferSize = 96;  // NVML_DEVICE_{UUID,NAME}_V2_BUFFER_SIZE

using InitFn = nvmlReturn_t (*)();
using ShutdownFn = nvmlReturn_t (*)();
using GetCountFn = nvmlReturn_t (*)(unsigned*);
using GetHandleFn = nvmlReturn_t (*)(unsigned, nvmlDevice_t*);
using GetStringFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned);
using GetMemoryFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using GetUnsignedFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned*);
struct nvmlUtilization_t {
  unsigned gpu;     // percent of time a kernel ran
  unsigned memory;  // percent of time memory was read or written
};
using GetUtilizationFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*);

// Closes the library on every return path.
struct Library {
  void* handle = nullptr;
  ~Library() {
    if (handle != nullptr) dlclose(handle);
  }
  template <typename Fn>
  Fn Get(const char* name) const {
    return reinterpret_cast<Fn>(dlsym(handle, name));
  }
};

}  // namespace nvml_internal

using nvml_internal::GetCountFn;
using nvml_internal::GetHandleFn;
using nvml_internal::GetMemoryFn;
using nvml_internal::GetStringFn;
using nvml_internal::GetUnsignedFn;
using nvml_internal::GetUtilizationFn;
using nvml_internal::InitFn;
using nvml_internal::kNvmlBufferSize;
using nvml_internal::Library;
using nvml_internal::nvmlDevice_t;
using nvml_internal::nvmlMemory_t;
using nvml_internal::nvmlReturn_t;
using nvml_internal::nvmlUtilization_t;
using nvml_internal::ShutdownFn;

absl::StatusOr<std::vector<GpuDevice>> DiscoverNvmlGpus(const char* library) {
  Library lib;
  lib.handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (lib.handle == nullptr) return std::vector<GpuDevice>{};  // no driver: no GPUs

  auto init = lib.Get<InitFn>("nvmlInit_v2");
  auto shutdown = lib.Get<ShutdownFn>("nvmlShutdown");
  auto get_count = lib.Get<GetCountFn>("nvmlDeviceGetCount_v2");
  auto get_handle = lib.Get<GetHandleFn>("nvmlDeviceGetHandleByIndex_v2");
  auto get_uuid = lib.Get<GetStringFn>("nvmlDeviceGetUUID");
  auto get_name = lib.Get<GetStringFn>("nvmlDeviceGetName");
  auto get_memory = lib.Get<GetMemoryFn>("nvmlDeviceGetMemoryInfo");
  auto get_minor = lib.Get<GetUnsignedFn>("nvmlDeviceGetMinorNumber");  // optional
  if (init == nullptr || shutdown == nullptr || get_count == nullptr || get_handle == nullptr ||
      get_uuid == nullptr || get_name == nullptr || get_memory == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(library, " lacks an NVML entry point the agent needs (driver too old?)"));
  }
  if (nvmlReturn_t rc = init(); rc != 0) {
    return absl::UnavailableError(absl::StrCat("nvmlInit_v2 failed with NVML error ", rc));
  }
  unsigned count = 0;
  if (nvmlReturn_t rc = get_count(&count); rc != 0) {
    shutdown();
    return absl::UnavailableError(
        absl::StrCat("nvmlDeviceGetCount_v2 failed with NVML error ", rc));
  }
  std::vector<GpuDevice> gpus;
  for (unsigned i = 0; i < count; ++i) {
    GpuDevice gpu;
    gpu.index = static_cast<int>(i);
    nvmlDevice_t device = nullptr;
    if (get_handle(i, &device) == 0) {
      std::array<char, kNvmlBufferSize> buffer{};
      if (get_uuid(device, buffer.data(), buffer.size()) == 0) gpu.uuid = buffer.data();
      buffer.fill('\0');
      if (get_name(device, buffer.data(), buffer.size()) == 0) gpu.model = buffer.data();
      nvmlMemory_t memory{};
      if (get_memory(device, &memory) == 0) gpu.memory_bytes = static_cast<int64_t>(memory.total);
      unsigned minor = 0;
      if (get_minor != nullptr && get_minor(device, &minor) == 0)
        gpu.minor = static_cast<int>(minor);
    }
    gpus.push_back(std::move(gpu));
  }
  shutdown();
  return gpus;
}

struct NvmlSampler::Api {
  nvml_internal::Library lib;
  nvml_internal::ShutdownFn shutdown = nullptr;
  nvml_internal::GetCountFn get_count = nullptr;
  nvml_internal::GetHandleFn get_handle = nullptr;
  nvml_internal::GetMemoryFn get_memory = nullptr;
  nvml_internal::GetUtilizationFn get_utilization = nullptr;
};

std::unique_ptr<NvmlSampler> NvmlSampler::Open(const char* library) {
  auto api = std::make_unique<Api>();
  api->lib.handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (api->lib.handle == nullptr) return nullptr;
  auto init = api->lib.Get<InitFn>("nvmlInit_v2");
  api->shutdown = api->lib.Get<ShutdownFn>("nvmlShutdown");
  api->get_count = api->lib.Get<GetCountFn>("nvmlDeviceGetCount_v2");
  api->get_handle = api->lib.Get<GetHandleFn>("nvmlDeviceGetHandleByIndex_v2");
  api->get_memory = api->lib.Get<GetMemoryFn>("nvmlDeviceGetMemoryInfo");
  api->get_utilization = api->lib.Get<GetUtilizationFn>("nvmlDeviceGetUtilizationRates");
  if (init == nullptr || api->shutdown == nullptr || api->get_count == nullptr ||
      api->get_handle == nullptr || api->get_memory == nullptr || api->get_utilization == nullptr ||
      init() != 0) {
    return nullptr;
  }
  return std::unique_ptr<NvmlSampler>(new NvmlSampler(std::move(api)));
}

NvmlSampler::NvmlSampler(std::unique_ptr<Api> api) : api_(std::move(api)) {}

NvmlSampler::~NvmlSampler() { api_->shutdown(); }

std::vector<GpuUsage> NvmlSampler::Sample() const {
  std::vector<GpuUsage> usage;
  unsigned count = 0;
  if (api_->get_count(&count) != 0) return usage;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t device = nullptr;
    nvmlUtilization_t rates{};
    nvmlMemory_t memory{};
    if (api_->get_handle(i, &device) != 0 || api_->get_utilization(device, &rates) != 0 ||
        api_->get_memory(device, &memory) != 0) {
      continue;
    }
    GpuUsage gpu;
    gpu.index = static_cast<int>(i);
    gpu.utilization = rates.gpu / 100.0;
    gpu.memory_used_bytes = static_cast<int64_t>(memory.used);
    usage.push_back(gpu);
  }
  return usage;
}

}  // namespace mesh::agent
