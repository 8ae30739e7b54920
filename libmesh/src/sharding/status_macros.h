// DT_RETURN_IF_ERROR and DT_ASSIGN_OR_RETURN: early returns on absl::Status
// and absl::StatusOr for the sharding executor (libmesh/src/sharding/).
// Private to libmesh; include it only from .cc files of this folder.
//
//   DT_RETURN_IF_ERROR(expr);          // expr is an absl::Status
//   DT_ASSIGN_OR_RETURN(lhs, expr);    // expr is an absl::StatusOr<T>
//
// Both return the error as an absl::Status, so the enclosing function must
// return absl::Status or absl::StatusOr<U>. DT_ASSIGN_OR_RETURN expands to
// more than one statement (it declares a temporary named after the line):
// use it as a statement of its own, at most once per line, never as the body
// of an unbraced if or for. `lhs` may declare a variable ("Tensor t") or name
// an existing one.
#pragma once

#include <utility>

#define DT_RETURN_IF_ERROR(expr)              \
  do {                                        \
    if (absl::Status _s = (expr); !_s.ok()) { \
      return _s;                              \
    }                                         \
  } while (false)

#define DT_CONCAT_INNER(a, b) a##b
#define DT_CONCAT(a, b) DT_CONCAT_INNER(a, b)
#define DT_ASSIGN_OR_RETURN(lhs, expr) \
  DT_ASSIGN_OR_RETURN_IMPL(DT_CONCAT(_so_, __LINE__), lhs, expr)
#define DT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = *std::move(tmp)
