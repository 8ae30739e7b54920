# fault-b scenarios of the reliability suite (4-8 and 11): agent stall, CPU load,
# partition and latency in network namespaces, grandchildren of a killed
# agent, and 20k idle waiters. Included from tests/fault/CMakeLists.txt.
# The harness: tests/util/fault_cluster.h (mesh_fault_cluster_test_util in
# tests/CMakeLists.txt), real coordinator and agents, network namespaces.

# The libmesh worker of the network and CPU-load tests: join, barrier, Gloo
# all_reduce.
add_executable(fault_b_worker fault_b_worker.cc)
mesh_target_defaults(fault_b_worker)
target_link_libraries(fault_b_worker PRIVATE mesh::mesh)

# - fault_b_stall_test (4): SIGSTOP of an agent past the node heartbeat
#   timeout, SIGCONT;
# - fault_b_grandchildren_test (8): a shell script's grandchildren (setsid
#   ones too) when the agent is killed with SIGKILL, and on cancel;
# - fault_b_network_test (6, 7): partition and 200±50 ms latency on a veth
#   between network namespaces (skipped without root / CAP_NET_ADMIN / `ip`;
#   7 also without sch_netem).
mesh_cc_test(fault_b_tests
             SRCS fault_b_stall_test.cc fault_b_grandchildren_test.cc fault_b_network_test.cc
             DEPS mesh_fault_cluster_test_util LABELS fault TIMEOUT 300)
target_compile_definitions(fault_b_tests PRIVATE
  FAULT_B_WORKER_BIN="$<TARGET_FILE:fault_b_worker>")
add_dependencies(fault_b_tests fault_b_worker)

# Slow, so in `make test-slow` only:
# - fault_b_cpu_load_test (5): node and rank heartbeats at 0.9x their
#   timeout with every core busy for 15 s (the burner would disturb other
#   tests' timing);
# - fault_b_overload_test (11): 10,000 idle WatchJob streams and 10,000
#   blocked KvGets against one coordinator process: memory per pending call
#   and heartbeat latency under that load.
mesh_cc_test(fault_b_slow_tests
             SRCS fault_b_cpu_load_test.cc fault_b_overload_test.cc
             DEPS mesh_fault_cluster_test_util LABELS fault slow TIMEOUT 600)
target_compile_definitions(fault_b_slow_tests PRIVATE
  FAULT_B_WORKER_BIN="$<TARGET_FILE:fault_b_worker>")
add_dependencies(fault_b_slow_tests fault_b_worker)
