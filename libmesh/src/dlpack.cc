#include "mesh/dlpack.h"

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mesh {
namespace {

// kDLBool in DLPack >= 0.8. A 0.6 consumer sees it as a plain number.
constexpr uint8_t kDLBoolCode = 6;

// What ToDLPack hangs off manager_ctx. `managed` comes first so the deleter
// can find the context from either pointer.
struct ExportContext {
  DLManagedTensor managed;
  DimVector shape;
  DimVector strides;
  DType dtype;  // The exact dtype, which DLPack 0.6 cannot say for bool.
  std::shared_ptr<void> keep_alive;
};

void DeleteExport(DLManagedTensor* managed) {
  delete static_cast<ExportContext*>(managed->manager_ctx);
}

const char* DeviceTypeName(int type) {
  switch (type) {
    case kDLCPU:
      return "kDLCPU";
    case kDLCUDA:
      return "kDLCUDA";
    case kDLCUDAHost:
      return "kDLCUDAHost";
    case kDLOpenCL:
      return "kDLOpenCL";
    case kDLVulkan:
      return "kDLVulkan";
    case kDLMetal:
      return "kDLMetal";
    case kDLVPI:
      return "kDLVPI";
    case kDLROCM:
      return "kDLROCM";
    case kDLROCMHost:
      return "kDLROCMHost";
    case kDLExtDev:
      return "kDLExtDev";
    case kDLCUDAManaged:
      return "kDLCUDAManaged";
    default:
      return "unknown";
  }
}

absl::StatusOr<Device> ImportDevice(DLDevice device) {
  switch (device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:  // Pinned host memory: ordinary CPU memory to us.
      return Device::Cpu();
    case kDLCUDA:
      if (device.device_id < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("FromDLPack: negative CUDA device_id ", device.device_id));
      }
      return Device::Cuda(device.device_id);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("FromDLPack: unsupported device type ", DeviceTypeName(device.device_type),
                       " (", static_cast<int>(device.device_type),
                       "); libmesh accepts kDLCPU, kDLCUDAHost and kDLCUDA"));
  }
}

absl::StatusOr<DType> ImportDType(const DLManagedTensor& managed) {
  const DLDataType type = managed.dl_tensor.dtype;
  if (type.code == kDLBoolCode && type.bits == 8 && type.lanes == 1) return DType::kBool;
  absl::StatusOr<DType> dtype = FromDLDataType(type);
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("FromDLPack: ", dtype.status().message()));
  }
  // Our own export knows what (kDLUInt, 8) meant.
  if (managed.deleter == &DeleteExport && *dtype == DType::kUInt8) {
    return static_cast<const ExportContext*>(managed.manager_ctx)->dtype;
  }
  return dtype;
}

absl::StatusOr<Tensor> Import(DLManagedTensor* managed, std::shared_ptr<void> keep_alive) {
  const DLTensor& dl = managed->dl_tensor;
  absl::StatusOr<Device> device = ImportDevice(dl.device);
  if (!device.ok()) return device.status();
  absl::StatusOr<DType> dtype = ImportDType(*managed);
  if (!dtype.ok()) return dtype.status();
  if (dl.ndim < 0) {
    return absl::InvalidArgumentError(absl::StrCat("FromDLPack: negative ndim ", dl.ndim));
  }
  if (dl.ndim > 0 && dl.shape == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromDLPack: shape is NULL for a tensor with ndim ", dl.ndim));
  }
  const absl::Span<const int64_t> shape(dl.shape, static_cast<size_t>(dl.ndim));
  const DimVector strides = dl.strides != nullptr ? DimVector(dl.strides, dl.strides + dl.ndim)
                                                  : ContiguousStrides(shape);
  void* data = dl.data;
  if (data != nullptr && dl.byte_offset != 0) {
    data = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(data) + dl.byte_offset);
  }
  absl::StatusOr<Tensor> tensor =
      Tensor::Create(data, *dtype, shape, strides, *device, std::move(keep_alive));
  if (!tensor.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("FromDLPack: ", tensor.status().message()));
  }
  return tensor;
}

}  // namespace

absl::StatusOr<Tensor> FromDLPack(DLManagedTensor* managed) {
  if (managed == nullptr) {
    return absl::InvalidArgumentError("FromDLPack: null DLManagedTensor");
  }
  // Ownership passes to the keep-alive now, so every error path below
  // releases the producer's memory by dropping it.
  std::shared_ptr<void> keep_alive(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensor*>(p);
    if (m->deleter != nullptr) m->deleter(m);
  });
  return Import(managed, std::move(keep_alive));
}

DLManagedTensor* ToDLPack(const Tensor& tensor) {
  auto* ctx = new ExportContext{
      .managed = {},
      .shape = DimVector(tensor.shape().begin(), tensor.shape().end()),
      .strides = DimVector(tensor.strides().begin(), tensor.strides().end()),
      .dtype = tensor.dtype(),
      .keep_alive = tensor.keep_alive(),
  };
  DLTensor& dl = ctx->managed.dl_tensor;
  dl.data = tensor.data();
  dl.device =
      tensor.device().is_cuda() ? DLDevice{kDLCUDA, tensor.device().index()} : DLDevice{kDLCPU, 0};
  dl.ndim = tensor.dim();
  dl.dtype = ToDLDataType(tensor.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = &DeleteExport;
  return &ctx->managed;
}

}  // namespace mesh
