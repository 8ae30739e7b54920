// A shared library that the test binary needs_missing_lib links, built
// without an RPATH to it: the dynamic loader finds it only through
// LD_LIBRARY_PATH (worker_env_test.cc).
extern "C" int mesh_test_missing_lib_answer() { return 42; }
