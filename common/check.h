// MESH_CHECK: abort on a violated invariant (a programmer error, never bad
// input). Bad input is reported with absl::Status instead.
//
// Debian's Abseil (20220623) predates absl/log, hence this small macro.
#pragma once

#include <cstdio>
#include <cstdlib>

#define MESH_CHECK(cond, msg)                                                               \
  do {                                                                                      \
    if (!(cond)) [[unlikely]] {                                                             \
      std::fprintf(stderr, "%s:%d: MESH_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, \
                   (msg));                                                                  \
      std::abort();                                                                         \
    }                                                                                       \
  } while (false)
