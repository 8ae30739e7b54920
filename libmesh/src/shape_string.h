// Formatting of shapes for libmesh's error messages.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"

namespace mesh::internal {

// "(2, 4)" for {2, 4}; "()" for an empty shape.
inline std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

}  // namespace mesh::internal
