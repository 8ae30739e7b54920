# fault-a scenarios of the reliability suite (1, 2, 3, 9, 10): kill -9 of the coordinator
# after a submit, while workers run, during a stream of submits and while
# ranks block; a rank that exits 0 without Leave; a full state disk.
# Included from tests/fault/CMakeLists.txt. Harness: tests/util/mesh_cluster.h.

set(MESH_FAULT_BINS
  MESH_COORDINATOR_BIN="$<TARGET_FILE:mesh-coordinator>"
  MESH_AGENT_BIN="$<TARGET_FILE:mesh-agent>"
  MESHCTL_BIN="$<TARGET_FILE:meshctl>")

# Scenarios 1 and 3: kill -9 of the coordinator after a submit, while
# workers run, and while ranks block in join, barrier and get.
mesh_cc_test(coordinator_crash_test SRCS coordinator_crash_test.cc
             DEPS mesh_cluster_test_util mesh_common mesh::mesh LABELS fault TIMEOUT 240)
target_compile_definitions(coordinator_crash_test PRIVATE ${MESH_FAULT_BINS})
add_dependencies(coordinator_crash_test mesh-coordinator mesh-agent meshctl)

# kill -9 and restart cycles under short jobs: no succeeded job ends FAILED,
# and the agents re-register within seconds of each restart.
mesh_cc_test(coordinator_restart_loop_test SRCS coordinator_restart_loop_test.cc
             DEPS mesh_cluster_test_util LABELS fault TIMEOUT 240)
target_compile_definitions(coordinator_restart_loop_test PRIVATE ${MESH_FAULT_BINS})
add_dependencies(coordinator_restart_loop_test mesh-coordinator mesh-agent)

# Scenario 9: a rank exits 0 without Leave while its peers wait at a barrier.
add_executable(exit_without_leave_worker exit_without_leave_worker.cc)
mesh_target_defaults(exit_without_leave_worker)
target_link_libraries(exit_without_leave_worker PRIVATE mesh_protos gRPC::grpc++ absl::strings
                                                        absl::time)
mesh_cc_test(exit_without_leave_test SRCS exit_without_leave_test.cc
             DEPS mesh_cluster_test_util LABELS fault TIMEOUT 180)
target_compile_definitions(exit_without_leave_test PRIVATE ${MESH_FAULT_BINS}
  EXIT_WITHOUT_LEAVE_WORKER_BIN="$<TARGET_FILE:exit_without_leave_worker>")
add_dependencies(exit_without_leave_test mesh-coordinator mesh-agent exit_without_leave_worker)

# Scenario 2: kill -9 of the coordinator every ~20 of 200 idempotent submits.
mesh_cc_test(submit_storm_test SRCS submit_storm_test.cc
             DEPS mesh_cluster_test_util LABELS fault TIMEOUT 300)
target_compile_definitions(submit_storm_test PRIVATE ${MESH_FAULT_BINS})
add_dependencies(submit_storm_test mesh-coordinator)

# Scenario 10: the state directory on a full filesystem: a 2 MiB tmpfs
# (skipped where mount(2) is refused), and an injected ENOSPC through
# LD_PRELOAD of mesh_enospc_preload (runs anywhere).
add_library(mesh_enospc_preload SHARED enospc_preload.c)
mesh_target_defaults(mesh_enospc_preload)
# Preloaded into an already-built process: never instrumented, whatever
# MESH_SANITIZE says (the test tells ASan not to insist on coming first).
target_compile_options(mesh_enospc_preload PRIVATE -fno-sanitize=all)
target_link_options(mesh_enospc_preload PRIVATE -fno-sanitize=all)
target_link_libraries(mesh_enospc_preload PRIVATE ${CMAKE_DL_LIBS})
mesh_cc_test(disk_full_test SRCS disk_full_test.cc
             DEPS mesh_cluster_test_util LABELS fault TIMEOUT 180)
target_compile_definitions(disk_full_test PRIVATE ${MESH_FAULT_BINS}
  MESH_ENOSPC_PRELOAD_LIB="$<TARGET_FILE:mesh_enospc_preload>")
add_dependencies(disk_full_test mesh-coordinator mesh_enospc_preload)
