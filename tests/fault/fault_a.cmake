# fault-a scenarios of the reliability suite (1, 2, 3, 9, 10), one binary,
# included from tests/fault/CMakeLists.txt. Harness: tests/util/mesh_cluster.h.
# - coordinator_crash_test (1, 3): kill -9 of the coordinator after a submit,
#   while workers run, and while ranks block in join, barrier and get;
# - coordinator_restart_loop_test: kill -9 and restart cycles under short
#   jobs: no succeeded job ends FAILED, and the agents re-register within
#   seconds of each restart;
# - exit_without_leave_test (9): a rank exits 0 without Leave while its peers
#   wait at a barrier;
# - submit_storm_test (2): kill -9 of the coordinator every ~20 of 200
#   idempotent submits;
# - disk_full_test (10): the state directory on a full filesystem: a 2 MiB
#   tmpfs (skipped where mount(2) is refused), and an injected ENOSPC through
#   LD_PRELOAD of mesh_enospc_preload (runs anywhere).

# The worker of scenario 9.
add_executable(exit_without_leave_worker exit_without_leave_worker.cc)
mesh_target_defaults(exit_without_leave_worker)
target_link_libraries(exit_without_leave_worker PRIVATE mesh_protos gRPC::grpc++ absl::strings
                                                        absl::time)

# Preloaded into an already-built process: never instrumented, whatever
# MESH_SANITIZE says (the test tells ASan not to insist on coming first).
add_library(mesh_enospc_preload SHARED enospc_preload.c)
mesh_target_defaults(mesh_enospc_preload)
target_compile_options(mesh_enospc_preload PRIVATE -fno-sanitize=all)
target_link_options(mesh_enospc_preload PRIVATE -fno-sanitize=all)
target_link_libraries(mesh_enospc_preload PRIVATE ${CMAKE_DL_LIBS})

mesh_cc_test(fault_a_tests
             SRCS coordinator_crash_test.cc coordinator_restart_loop_test.cc
                  exit_without_leave_test.cc submit_storm_test.cc disk_full_test.cc
             DEPS mesh_cluster_test_util mesh_common mesh::mesh LABELS fault TIMEOUT 300)
target_compile_definitions(fault_a_tests PRIVATE
  MESH_COORDINATOR_BIN="$<TARGET_FILE:mesh-coordinator>"
  MESH_AGENT_BIN="$<TARGET_FILE:mesh-agent>"
  MESHCTL_BIN="$<TARGET_FILE:meshctl>"
  EXIT_WITHOUT_LEAVE_WORKER_BIN="$<TARGET_FILE:exit_without_leave_worker>"
  MESH_ENOSPC_PRELOAD_LIB="$<TARGET_FILE:mesh_enospc_preload>")
add_dependencies(fault_a_tests mesh-coordinator mesh-agent meshctl exit_without_leave_worker
                 mesh_enospc_preload)
