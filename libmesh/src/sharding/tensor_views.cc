#include "sharding/tensor_views.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sharding/status_macros.h"
#include "sharding/strided_copy.h"

namespace mesh::sharding {

std::string ShapeStr(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t Product(absl::Span<const int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims) p *= d;
  return p;
}

int64_t OuterSize(absl::Span<const int64_t> shape, int d) {
  return Product(shape.subspan(0, static_cast<size_t>(d)));
}

Tensor SubBuffer(const Tensor& buffer, int64_t offset, absl::Span<const int64_t> shape) {
  auto* base = static_cast<unsigned char*>(buffer.data()) +
               offset * static_cast<int64_t>(buffer.element_size());
  return Tensor::Contiguous(base, buffer.dtype(), shape, buffer.device(), buffer.keep_alive());
}

absl::StatusOr<Tensor> NarrowTo(const Tensor& t, int d, const LocalLayout& piece,
                                const LocalLayout& whole) {
  if (piece.shape[d] == 0) return t.Narrow(d, 0, 0);
  return t.Narrow(d, piece.offset[d] - whole.offset[d], piece.shape[d]);
}

absl::StatusOr<Tensor> Box(const Tensor& t, absl::Span<const int64_t> offset,
                           absl::Span<const int64_t> shape) {
  Tensor view = t;
  for (int d = 0; d < t.dim(); ++d) {
    if (offset[d] == 0 && shape[d] == t.size(d)) continue;
    DT_ASSIGN_OR_RETURN(view, view.Narrow(d, offset[d], shape[d]));
  }
  return view;
}

absl::StatusOr<Tensor> CopyOf(const Tensor& t) {
  DT_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(t.dtype(), t.shape(), t.device()));
  DT_RETURN_IF_ERROR(CopyStrided(out, t));
  return out;
}

}  // namespace mesh::sharding
