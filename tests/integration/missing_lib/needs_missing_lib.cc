// Prints the answer of libmesh_test_missing_lib.so, which the loader finds
// only through LD_LIBRARY_PATH (worker_env_test.cc).
#include <cstdio>

extern "C" int mesh_test_missing_lib_answer();

int main() {
  std::printf("answer %d\n", mesh_test_missing_lib_answer());
  return mesh_test_missing_lib_answer() == 42 ? 0 : 1;
}
