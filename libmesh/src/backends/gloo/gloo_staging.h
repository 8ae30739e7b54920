// Contiguous stand-ins for strided tensors, and gloo's typed-pointer setters
// (internal to the Gloo backend).
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "mesh/tensor.h"

namespace mesh::gloo_backend {

// gloo's option setters are templated on the element type only to learn
// sizeof(T); its algorithms move bytes. An opaque element of the right size
// serves every dtype of that size.
template <size_t N>
struct Elem {
  unsigned char bytes[N];
};

// Calls f(Elem<element_size>{}) for element sizes 1, 2, 4 and 8.
template <typename F>
decltype(auto) DispatchElementSize(size_t element_size, F&& f) {
  switch (element_size) {
    case 1:
      return f(Elem<1>{});
    case 2:
      return f(Elem<2>{});
    case 4:
      return f(Elem<4>{});
    default:
      return f(Elem<8>{});
  }
}

// A contiguous view of a tensor's elements: the tensor's own memory when it
// is contiguous, else a staging copy (one extra copy each way).
class Staged {
 public:
  // `copy_in`: the op reads the tensor (inputs, in-place tensors), so the
  // staging copy starts with its elements.
  // Possible errors: those of Tensor::Empty and CopyTensor.
  static absl::StatusOr<Staged> Of(const Tensor& tensor, bool copy_in);

  // Never null, even for zero elements (gloo dislikes null buffers).
  void* data() const;
  size_t nbytes() const { return target_.nbytes(); }
  bool staged() const { return staged_; }

  // Copies the staging copy back into the tensor; OK and nothing to do when
  // the tensor is contiguous.
  absl::Status CopyBack() const;

 private:
  Tensor target_;
  Tensor staging_;
  void* data_ = nullptr;
  bool staged_ = false;
};

// Copies `src`'s elements into `dst` in row-major order whatever their
// shapes (numel must match; checked by the caller) and strides.
absl::Status CopyFlat(const Tensor& dst, const Tensor& src);

}  // namespace mesh::gloo_backend
