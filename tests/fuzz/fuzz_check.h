// FUZZ_CHECK: a harness invariant. A violation prints where and why and
// aborts, which libFuzzer reports as a crash (saving the input) and the
// corpus runner (corpus_main.cc) as a failed test.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(cond, msg)                                                               \
  do {                                                                                      \
    if (!(cond)) [[unlikely]] {                                                             \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, \
                   std::string(msg).c_str());                                               \
      std::abort();                                                                         \
    }                                                                                       \
  } while (false)
