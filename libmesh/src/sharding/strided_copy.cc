#include "sharding/strided_copy.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "mesh/config.h"

#if MESH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#if MESH_HAVE_CUDA_KERNELS
#include "backends/cuda/copy_2d.h"
#endif

namespace mesh::sharding {

std::optional<Rows> AsRows(const Tensor& t) {
  // Merge dims from the innermost outwards while they are packed; size-1
  // dims have meaningless strides and are skipped.
  struct Seg {
    int64_t size;
    int64_t stride;
  };
  std::vector<Seg> segs;
  for (int d = t.dim() - 1; d >= 0; --d) {
    const int64_t size = t.size(d);
    if (size == 1) continue;
    if (size == 0) return Rows{0, 0, 0};
    if (!segs.empty() && segs.back().stride * segs.back().size == t.stride(d)) {
      segs.back().size *= size;
      continue;
    }
    segs.push_back(Seg{size, t.stride(d)});
  }
  if (segs.empty()) return Rows{1, 1, 1};
  if (segs[0].stride != 1 || segs.size() > 2) return std::nullopt;
  if (segs.size() == 1) return Rows{1, segs[0].size, segs[0].size};
  return Rows{segs[1].size, segs[0].size, segs[1].stride};
}

absl::Status CopyStrided(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0 && src.numel() == 0 && dst.dtype() == src.dtype()) {
    return absl::OkStatus();
  }
  const bool cuda = dst.device().is_cuda() || src.device().is_cuda();
  if (!cuda || (dst.is_contiguous() && src.is_contiguous())) return CopyTensor(dst, src);
  if (dst.dtype() != src.dtype() || dst.shape() != src.shape()) {
    // CopyTensor words the mismatch.
    return CopyTensor(dst, src);
  }
  std::optional<Rows> d = AsRows(dst);
  std::optional<Rows> s = AsRows(src);
  if (!d || !s) {
    return absl::UnimplementedError(absl::StrCat("strided CUDA copy of ", src.DebugString(),
                                                 " into ", dst.DebugString(), ": not a 2-D view"));
  }
  // A contiguous side takes the other side's row width.
  if (d->rows == 1 && s->rows != 1) *d = Rows{s->rows, s->width, s->width};
  if (s->rows == 1 && d->rows != 1) *s = Rows{d->rows, d->width, d->width};
  if (d->rows != s->rows || d->width != s->width) {
    return absl::UnimplementedError(absl::StrCat("strided CUDA copy of ", src.DebugString(),
                                                 " into ", dst.DebugString(),
                                                 ": row layouts differ"));
  }
#if MESH_HAVE_CUDA
  const int64_t es = static_cast<int64_t>(dst.element_size());
  const int device = dst.device().is_cuda() ? dst.device().index() : src.device().index();
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  cudaError_t err = cudaSetDevice(device);
  const size_t dpitch = static_cast<size_t>(d->pitch * es);
  const size_t spitch = static_cast<size_t>(s->pitch * es);
  const size_t width = static_cast<size_t>(d->width * es);
  const size_t rows = static_cast<size_t>(d->rows);
  const char* how = "cudaMemcpy2D";
  if (err == cudaSuccess) {
#if MESH_HAVE_CUDA_KERNELS
    // Both sides on one device: Mesh's kernel, which keeps narrow rows at
    // copy bandwidth (the copy engine behind cudaMemcpy2D halves it).
    if (dst.device() == src.device()) {
      how = "the strided copy kernel";
      err = static_cast<cudaError_t>(
          cuda::Copy2DAsync(dst.data(), dpitch, src.data(), spitch, width, rows, nullptr));
    } else {
      err = cudaMemcpy2D(dst.data(), dpitch, src.data(), spitch, width, rows, cudaMemcpyDefault);
    }
#else
    err = cudaMemcpy2D(dst.data(), dpitch, src.data(), spitch, width, rows, cudaMemcpyDefault);
#endif
  }
  // A device-to-device cudaMemcpy2D may return before the copy is done,
  // and the kernel always does.
  if (err == cudaSuccess) err = cudaStreamSynchronize(nullptr);
  if (previous >= 0) cudaSetDevice(previous);
  if (err != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat(how, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("libmesh was built without CUDA");
#endif
}

}  // namespace mesh::sharding
