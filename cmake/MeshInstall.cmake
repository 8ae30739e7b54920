# `cmake --install` and `make package` (CPack, Debian packages).
#
# What installs, by component (each component is one .deb, docs/install.md):
#   coordinator  bin/mesh-coordinator, its systemd unit, the Prometheus and
#                Grafana files of deploy/
#   agent        bin/mesh-agent, its systemd unit
#   meshctl      bin/meshctl
#   runtime      libmeshrt.so.<major> (the shared libmesh, with its SONAME)
#   dev          include/mesh/*.h, libmeshrt.so (the link-time name),
#                libmeshrt.a, the CMake package (find_package(Mesh) gives
#                Mesh::mesh) and the pkg-config file meshrt.pc
#
# libmesh's file is libmeshrt, never libmesh: Debian's finite-element
# library owns that name. Private headers (libmesh/src, common/, the
# generated protos) and the build tree's include paths never reach an
# installed user.
# Libraries go to Debian's multiarch directory (lib/x86_64-linux-gnu) for
# every prefix, not only /usr as GNUInstallDirs would have it: the packages
# need it, and the dynamic linker searches /usr/local/lib/<multiarch> too.
if(CMAKE_LIBRARY_ARCHITECTURE AND NOT DEFINED CACHE{CMAKE_INSTALL_LIBDIR})
  set(CMAKE_INSTALL_LIBDIR "lib/${CMAKE_LIBRARY_ARCHITECTURE}" CACHE PATH
      "Object code libraries (lib/<multiarch> on Debian)")
endif()
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# ---- The shared libmesh ---------------------------------------------------
# The static target `mesh` (what the tests and examples in this tree link)
# wrapped whole into a shared library. Its private static helpers (the
# generated protos, mesh_common and friends) are linked in and their symbols
# hidden, so the library exports libmesh and nothing of ours besides.
file(WRITE "${PROJECT_BINARY_DIR}/generated/mesh_shared.cc"
     "// The shared libmesh is libmesh's static archive, linked whole.\n")
add_library(mesh_shared SHARED "${PROJECT_BINARY_DIR}/generated/mesh_shared.cc")
set_target_properties(mesh_shared PROPERTIES
  OUTPUT_NAME meshrt
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR})
# The private archives: every static library of this project that `mesh`
# links, directly or through another, found by walking the link libraries.
function(mesh_collect_static_deps target out)
  set(seen ${${out}})
  get_target_property(deps ${target} LINK_LIBRARIES)
  get_target_property(interface_deps ${target} INTERFACE_LINK_LIBRARIES)
  foreach(dep IN LISTS deps interface_deps)
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" dep "${dep}")
    if(NOT TARGET "${dep}" OR dep IN_LIST seen)
      continue()
    endif()
    get_target_property(imported ${dep} IMPORTED)
    get_target_property(type ${dep} TYPE)
    if(imported OR NOT type MATCHES "^(STATIC_LIBRARY|INTERFACE_LIBRARY)$")
      continue()
    endif()
    list(APPEND seen ${dep})
    mesh_collect_static_deps(${dep} seen)
  endforeach()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()
set(mesh_private_deps "")
mesh_collect_static_deps(mesh mesh_private_deps)
set(mesh_private_archives "")
foreach(dep IN LISTS mesh_private_deps)
  get_target_property(type ${dep} TYPE)
  if(type STREQUAL "STATIC_LIBRARY")
    list(APPEND mesh_private_archives ${dep})
  endif()
endforeach()
message(STATUS "libmeshrt.so and .a carry: ${mesh_private_archives}")
set(mesh_exclude_libs "")
foreach(archive IN LISTS mesh_private_archives)
  list(APPEND mesh_exclude_libs "$<TARGET_FILE_NAME:${archive}>")
endforeach()
list(JOIN mesh_exclude_libs ":" mesh_exclude_libs)
target_link_libraries(mesh_shared
  PUBLIC absl::status absl::statusor absl::strings absl::synchronization absl::time absl::span
         absl::inlined_vector absl::flat_hash_map dlpack::dlpack
  PRIVATE -Wl,--whole-archive mesh -Wl,--no-whole-archive)
target_link_options(mesh_shared PRIVATE "LINKER:--no-undefined"
                    "LINKER:--exclude-libs,${mesh_exclude_libs}"
                    "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/libmeshrt.map")
set_property(TARGET mesh_shared APPEND PROPERTY LINK_DEPENDS
             "${PROJECT_SOURCE_DIR}/cmake/libmeshrt.map")
target_include_directories(mesh_shared INTERFACE
  "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/libmesh/include>"
  "$<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>"
  "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
set_target_properties(mesh_shared PROPERTIES EXPORT_NAME mesh)

# ---- The static libmesh ---------------------------------------------------
# libmeshrt.a as installed: libmesh's archive merged with its private static
# helpers, so that a static link needs only system libraries after it
# (meshrt.pc's Libs.private, Mesh::mesh_static).
set(mesh_static_archive "${PROJECT_BINARY_DIR}/install-staging/libmeshrt.a")
set(mesh_static_inputs "$<TARGET_FILE:mesh>")
foreach(archive IN LISTS mesh_private_archives)
  list(APPEND mesh_static_inputs "$<TARGET_FILE:${archive}>")
endforeach()
add_custom_command(
  OUTPUT "${mesh_static_archive}"
  COMMAND "${CMAKE_COMMAND}" -DOUTPUT=${mesh_static_archive} -DAR=${CMAKE_AR}
          "-DINPUTS=${mesh_static_inputs}" -P "${PROJECT_SOURCE_DIR}/cmake/merge_archives.cmake"
  DEPENDS mesh ${mesh_private_archives} "${PROJECT_SOURCE_DIR}/cmake/merge_archives.cmake"
  COMMENT "Merging libmesh's static archives into install-staging/libmeshrt.a"
  VERBATIM)
add_custom_target(mesh_static_archive ALL DEPENDS "${mesh_static_archive}")

# The system libraries a static link of libmeshrt.a needs after it, as
# linker arguments (pkg-config) and as CMake targets (the package config).
set(MESH_STATIC_PC_LIBS "-lgloo")
set(MESH_STATIC_CMAKE_LIBS "gloo;gRPC::grpc++;protobuf::libprotobuf;prometheus-cpp::core;prometheus-cpp::pull;spdlog::spdlog;yaml-cpp;OpenSSL::Crypto;Threads::Threads")
set(MESH_STATIC_PC_REQUIRES "grpc++ protobuf prometheus-cpp-core prometheus-cpp-pull spdlog yaml-cpp libcrypto")
# The CUDA runtime and NCCL by name only in meshrt.pc: their directory is the
# CUDA installation's, which a static link adds itself (LIBRARY_PATH or -L;
# docs/install.md). The CMake package names the files the build used.
if(MESH_HAVE_CUDA)
  string(APPEND MESH_STATIC_PC_LIBS " -lcudart")
  list(APPEND MESH_STATIC_CMAKE_LIBS "${CUDAToolkit_LIBRARY_DIR}/libcudart.so")
endif()
if(MESH_HAVE_NCCL)
  string(APPEND MESH_STATIC_PC_LIBS " -lnccl")
  list(APPEND MESH_STATIC_CMAKE_LIBS "${NCCL_LIBRARY}")
endif()
string(APPEND MESH_STATIC_PC_LIBS " -pthread")

# ---- What installs ---------------------------------------------------------
install(TARGETS mesh-coordinator RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        COMPONENT coordinator)
install(TARGETS mesh-agent RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT agent)
install(TARGETS meshctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT meshctl)
install(TARGETS mesh_shared EXPORT MeshTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
install(FILES "${mesh_static_archive}" DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/libmesh/include/mesh"
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev FILES_MATCHING PATTERN "*.h")
install(FILES "${PROJECT_BINARY_DIR}/generated/mesh/config.h"
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mesh COMPONENT dev)

set(MESH_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/Mesh")
install(EXPORT MeshTargets NAMESPACE Mesh:: DESTINATION "${MESH_CMAKE_DIR}" COMPONENT dev)
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/MeshConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/install-staging/MeshConfig.cmake"
  INSTALL_DESTINATION "${MESH_CMAKE_DIR}"
  PATH_VARS CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/install-staging/MeshConfigVersion.cmake"
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/install-staging/MeshConfig.cmake"
              "${PROJECT_BINARY_DIR}/install-staging/MeshConfigVersion.cmake"
        DESTINATION "${MESH_CMAKE_DIR}" COMPONENT dev)

# meshrt.pc, relocatable: the prefix is found from the file's own place.
file(RELATIVE_PATH MESH_PC_PREFIX_FROM_PCFILEDIR
     "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
configure_file("${PROJECT_SOURCE_DIR}/cmake/meshrt.pc.in"
               "${PROJECT_BINARY_DIR}/install-staging/meshrt.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/install-staging/meshrt.pc"
        DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig" COMPONENT dev)

# The systemd units, naming the binaries of the prefix they install to
# (cmake/install_unit.cmake rewrites the sources' /usr/local at install time).
# systemd's unit directory for the prefix: /usr/lib/systemd/system for /usr.
set(MESH_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
    "Where the systemd units install, relative to the prefix")
foreach(entry coordinator:mesh-coordinator agent:mesh-agent)
  string(REPLACE ":" ";" entry "${entry}")
  list(GET entry 0 component)
  list(GET entry 1 unit)
  install(CODE "set(MESH_UNIT_SOURCE \"${PROJECT_SOURCE_DIR}/deploy/systemd/${unit}.service\")
set(MESH_UNIT_NAME \"${unit}.service\")
set(MESH_UNIT_DIR \"${MESH_SYSTEMD_UNIT_DIR}\")
set(MESH_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
set(MESH_DOCDIR \"${CMAKE_INSTALL_DATADIR}/doc/${unit}\")
include(\"${PROJECT_SOURCE_DIR}/cmake/install_unit.cmake\")"
          COMPONENT ${component})
endforeach()
# The operator's documents beside each daemon, and the monitoring files.
install(FILES "${PROJECT_SOURCE_DIR}/docs/deploy.md" "${PROJECT_SOURCE_DIR}/docs/security.md"
              "${PROJECT_SOURCE_DIR}/docs/coordinator.md"
        DESTINATION "${CMAKE_INSTALL_DATADIR}/doc/mesh-coordinator" COMPONENT coordinator)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/deploy/prometheus" "${PROJECT_SOURCE_DIR}/deploy/grafana"
        DESTINATION "${CMAKE_INSTALL_DATADIR}/mesh-coordinator" COMPONENT coordinator)
install(FILES "${PROJECT_SOURCE_DIR}/docs/deploy.md" "${PROJECT_SOURCE_DIR}/docs/security.md"
        DESTINATION "${CMAKE_INSTALL_DATADIR}/doc/mesh-agent" COMPONENT agent)

include(MeshPackage)
