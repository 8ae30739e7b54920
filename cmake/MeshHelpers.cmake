# Build helpers shared by every folder.

# Code on no hot path (the tests and their helpers, the examples, meshctl,
# and command-line parsing) is compiled with MESH_LIGHT_CXX_FLAGS on top of
# the build type's flags. gtest's and CLI11's templates cost two to three
# times as long to compile at -O2 -g as at -O0 -g1 (and -Og costs about 16%
# more than -O0), and that code runs too little for its speed to show; the libraries, daemons and benchmarks keep
# the build type's flags. Empty in Debug builds, which already skip
# optimization. docs/build.md has the figures.
if(CMAKE_BUILD_TYPE STREQUAL "RelWithDebInfo")
  set(_mesh_light_default "-O0;-g1")
elseif(CMAKE_BUILD_TYPE MATCHES "^(Release|MinSizeRel)$")
  set(_mesh_light_default "-O0")
else()
  set(_mesh_light_default "")
endif()
set(MESH_LIGHT_CXX_FLAGS "${_mesh_light_default}" CACHE STRING
    "Extra compile flags for code on no hot path (tests, examples, meshctl, flag parsing)")

# Debug information of the build type's own flags. RelWithDebInfo's `-g`
# makes -O2 compiles about 45% slower than `-g1` (line tables only: files,
# lines and inlined frames in backtraces, which is what a failing test or a
# crash report needs); variable-level debugging wants a Debug build anyway.
# "lines" (default) appends -g1 to RelWithDebInfo compiles; "full" keeps -g.
set(MESH_DEBUG_INFO "lines" CACHE STRING "Debug info in RelWithDebInfo: lines (-g1) or full (-g)")
set_property(CACHE MESH_DEBUG_INFO PROPERTY STRINGS lines full)
if(NOT MESH_DEBUG_INFO MATCHES "^(lines|full)$")
  message(FATAL_ERROR "MESH_DEBUG_INFO must be lines or full, not '${MESH_DEBUG_INFO}'")
endif()
if(MESH_DEBUG_INFO STREQUAL "lines")
  add_compile_options("$<$<AND:$<CONFIG:RelWithDebInfo>,$<COMPILE_LANGUAGE:C,CXX>>:-g1>")
endif()

# The gold linker, where the toolchain has it: it links our ~150 test
# binaries in about half the time of the default bfd linker.
include(CheckLinkerFlag)
check_linker_flag(CXX "-fuse-ld=gold" MESH_HAVE_GOLD_LINKER)
option(MESH_USE_GOLD "Link with -fuse-ld=gold where available" ON)
if(MESH_USE_GOLD AND MESH_HAVE_GOLD_LINKER)
  add_link_options("-fuse-ld=gold")
endif()

# Applies MESH_LIGHT_CXX_FLAGS to the given source files of this directory.
function(mesh_light_sources)
  if(MESH_LIGHT_CXX_FLAGS)
    set_source_files_properties(${ARGN} PROPERTIES COMPILE_OPTIONS "${MESH_LIGHT_CXX_FLAGS}")
  endif()
endfunction()

# Warnings are errors in our own code. Generated and third-party code does not
# go through this function.
function(mesh_target_defaults target)
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:C,CXX>:-Wall;-Wextra;-Werror>"
    "$<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings;-Xcompiler=-Wall,-Wextra,-Werror>")
  target_include_directories(${target} PRIVATE "${PROJECT_SOURCE_DIR}")
endfunction()

# mesh_cc_library(NAME SRCS ... [DEPS ...] [PUBLIC_INCLUDE dir])
# A static library built with mesh_target_defaults.
function(mesh_cc_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SRCS})
  mesh_target_defaults(${name})
  target_include_directories(${name} PUBLIC "${PROJECT_SOURCE_DIR}")
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
endfunction()

# Applies -fsanitize=<list> to everything compiled and linked after this call.
function(mesh_apply_sanitizers list)
  if(list STREQUAL "")
    return()
  endif()
  string(REPLACE " " "" list "${list}")
  if(list MATCHES "thread" AND list MATCHES "address")
    message(FATAL_ERROR "MESH_SANITIZE: 'thread' cannot be combined with 'address'")
  endif()
  set(flags "-fsanitize=${list}" -fno-omit-frame-pointer -fno-sanitize-recover=all)
  # Host-compiler flags only: nvcc rejects them (CUDA kernels go unsanitized).
  foreach(flag IN LISTS flags)
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${flag}>")
  endforeach()
  add_link_options("-fsanitize=${list}")
  message(STATUS "Sanitizers: ${list}")
endfunction()

# mesh_cc_test(NAME SRCS ... [DEPS ...] [LABELS unit|integration|gpu|fault|slow ...]
#              [TIMEOUT seconds])
#
# Builds one gtest binary from the given test files and registers each of its
# test cases with ctest under the given labels (default: unit) and timeout
# (per case). Each tests/<component>/ folder groups its files into a few
# binaries, one per label set, rather than one binary per file: with
# CMAKE_UNITY_BUILD (make test turns it on) a binary's files then compile in
# batches that parse gtest, gRPC and protobuf headers once, and there are far
# fewer binaries to link. The files of a batch share one translation unit,
# where their anonymous namespaces merge, so each test file keeps its
# helpers and fixtures in a namespace named after the file (`namespace
# scheduler_test { ... }` in scheduler_test.cc) instead of an anonymous one. A test that calls GTEST_SKIP() is reported
# by ctest as skipped, not passed, so GPU tests on a machine without a device
# show up honestly in the summary. Label `slow` keeps a test out of
# `make test` (it runs in `make test-slow`); `fault` marks the reliability
# suite (docs/failure-semantics.md).
function(mesh_cc_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  foreach(label IN LISTS ARG_LABELS)
    if(NOT label MATCHES "^(unit|integration|gpu|fault|slow)$")
      message(FATAL_ERROR "mesh_cc_test(${name}): unknown label '${label}'")
    endif()
  endforeach()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  # gtest_discover_tests passes PROPERTIES through three list expansions
  # (its own arguments, a generated script, GoogleTestAddTests' add_command),
  # each of which eats one level of `\;`: a bare "fault;slow" sets LABELS to
  # "fault" and makes "slow" a property name that swallows the TIMEOUT after
  # it. Seven backslashes leave `LABELS [==[fault;slow]==]` in the tests
  # file: one value, two labels.
  string(REPEAT "\\" 7 escape)
  string(REPLACE ";" "${escape};" labels "${ARG_LABELS}")
  add_executable(${name} ${ARG_SRCS})
  mesh_target_defaults(${name})
  if("gpu" IN_LIST ARG_LABELS)
    # The GPU bundle (make gpu-bundle) carries every gpu-labelled test.
    set_property(GLOBAL APPEND PROPERTY MESH_GPU_TESTS ${name})
  endif()
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  # ctest -j starts the tests of highest COST first. A fresh build has no
  # timings of its own yet, so the process-level tests (integration, fault),
  # which take seconds where a unit test takes milliseconds, go first, by
  # their timeout, and the short ones fill the gaps instead of leaving a
  # long test to run alone at the end.
  set(cost 0)
  if("integration" IN_LIST ARG_LABELS OR "fault" IN_LIST ARG_LABELS)
    set(cost ${ARG_TIMEOUT})
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    DISCOVERY_TIMEOUT 30
    PROPERTIES
      LABELS "${labels}"
      TIMEOUT ${ARG_TIMEOUT}
      COST ${cost}
      SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
endfunction()
