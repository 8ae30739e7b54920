#include "backends/gloo/gloo_staging.h"

#include <cstring>

namespace mesh::gloo_backend {
namespace {

// Stands in for the data of zero-element tensors, which may be null.
alignas(64) unsigned char empty_buffer[64];

}  // namespace

absl::StatusOr<Staged> Staged::Of(const Tensor& tensor, bool copy_in) {
  Staged staged;
  staged.target_ = tensor;
  if (tensor.is_contiguous()) {
    staged.data_ = tensor.data();
    return staged;
  }
  absl::StatusOr<Tensor> copy = Tensor::Empty(tensor.dtype(), tensor.shape());
  if (!copy.ok()) return copy.status();
  staged.staging_ = *std::move(copy);
  staged.data_ = staged.staging_.data();
  staged.staged_ = true;
  if (copy_in) {
    if (absl::Status s = CopyTensor(staged.staging_, tensor); !s.ok()) return s;
  }
  return staged;
}

void* Staged::data() const { return data_ != nullptr ? data_ : empty_buffer; }

absl::Status Staged::CopyBack() const {
  if (!staged_) return absl::OkStatus();
  return CopyTensor(target_, staging_);
}

absl::Status CopyFlat(const Tensor& dst, const Tensor& src) {
  if (src.numel() == 0) return absl::OkStatus();
  if (dst.is_contiguous() && src.is_contiguous()) {
    if (dst.data() != src.data()) std::memmove(dst.data(), src.data(), src.nbytes());
    return absl::OkStatus();
  }
  absl::StatusOr<Staged> in = Staged::Of(src, /*copy_in=*/true);
  if (!in.ok()) return in.status();
  absl::StatusOr<Staged> out = Staged::Of(dst, /*copy_in=*/false);
  if (!out.ok()) return out.status();
  std::memcpy(out->data(), in->data(), src.nbytes());
  return out->CopyBack();
}

}  // namespace mesh::gloo_backend
