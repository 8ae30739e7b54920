# `make package`: Debian packages of the install components (CPack's DEB
# generator), in <build>/packages/. docs/install.md lists what each holds.
#
#   mesh-coordinator  the daemon, its unit, the monitoring files; creates the
#                     system group `mesh` and user `mesh-coordinator`
#   mesh-agent        the daemon and its unit; creates `mesh` and `mesh-agent`
#   meshctl           the CLI
#   libmeshrt0        libmeshrt.so.0, the shared libmesh
#   libmesh-dev       headers, libmeshrt.so and .a, CMake package, meshrt.pc
#
# Dependencies on Debian's libraries come from dpkg-shlibdeps. The CUDA
# runtime and NCCL are not Debian packages: their directories count as
# private, so no package depends on them, and a GPU host installs them from
# NVIDIA (docs/install.md).
set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "mesh")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_VENDOR "The Mesh developers")
set(CPACK_PACKAGE_CONTACT "The Mesh developers <mesh-dev@lists.example.org>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "cluster coordination for multi-GPU jobs")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_PACKAGE_DIRECTORY "${PROJECT_BINARY_DIR}/packages")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL coordinator agent meshctl runtime dev python)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "net")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "")
set(mesh_private_lib_dirs "")
if(MESH_HAVE_CUDA)
  list(APPEND mesh_private_lib_dirs "${CUDAToolkit_LIBRARY_DIR}")
endif()
if(MESH_HAVE_NCCL)
  get_filename_component(mesh_nccl_dir "${NCCL_LIBRARY}" DIRECTORY)
  list(APPEND mesh_private_lib_dirs "${mesh_nccl_dir}")
endif()
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS "${mesh_private_lib_dirs}")

set(CPACK_DEBIAN_COORDINATOR_PACKAGE_NAME "mesh-coordinator")
set(CPACK_DEBIAN_AGENT_PACKAGE_NAME "mesh-agent")
set(CPACK_DEBIAN_MESHCTL_PACKAGE_NAME "meshctl")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME "libmeshrt${PROJECT_VERSION_MAJOR}")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME "libmesh-dev")
set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME "python3-meshrt")
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION "python")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION "libs")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION "libdevel")
set(CPACK_DEBIAN_COORDINATOR_PACKAGE_DEPENDS "passwd")
set(CPACK_DEBIAN_AGENT_PACKAGE_DEPENDS "passwd")
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "libmeshrt${PROJECT_VERSION_MAJOR} (= ${PROJECT_VERSION}), libabsl-dev, libdlpack-dev")
# A shlibs file for libmeshrt0 (the only package with a shared library),
# and the ldconfig trigger Debian expects of it (CPack's own ldconfig calls
# in its maintainer scripts remain; lintian warns of them, no more).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
file(WRITE "${PROJECT_BINARY_DIR}/install-staging/deb-runtime/triggers"
     "activate-noawait ldconfig\n")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA
    "${PROJECT_BINARY_DIR}/install-staging/deb-runtime/triggers")
set(CPACK_COMPONENT_COORDINATOR_DESCRIPTION
    "Mesh coordinator daemon\nThe gRPC service of a Mesh cluster: it accepts jobs, places ranks with\nthe topology in mind, runs rendezvous, a key-value store and barriers,\nand reports every failure to every rank with its root cause.")
set(CPACK_COMPONENT_AGENT_DESCRIPTION
    "Mesh agent daemon\nRuns on each host of a Mesh cluster: registers the host's slots and\nGPUs, launches and supervises the workers of each job as the job's\nowner, and reports how each worker exits.")
set(CPACK_COMPONENT_MESHCTL_DESCRIPTION
    "command-line client of a Mesh cluster\nmeshctl submits, watches, cancels and reads the logs of Mesh jobs, and\nruns a local cluster for development.")
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
    "Mesh worker library (shared library)\nlibmesh: collectives (NCCL on GPU, Gloo on CPU), N-dimensional device\nmeshes and sharded tensors for the workers of a Mesh job.")
# The extension links libmesh statically: system libraries (found by
# dpkg-shlibdeps) and the interpreter it was built for.
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS
    "python3 (>= ${MESH_PYTHON_VERSION}), python3 (<< ${MESH_PYTHON_VERSION}.999)")
set(CPACK_COMPONENT_PYTHON_DESCRIPTION
    "Mesh worker library for Python (meshrt)\nThe Python package of libmesh: the worker runtime, the coordinator's\nkey-value store, device meshes, collectives on DLPack tensors, DTensor,\na job client, and meshrt.torch: torch.distributed on the coordinator's\nstore through init_method=\"mesh://\".")
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "Mesh worker library (development files)\nHeaders, the static library, the CMake package (find_package(Mesh))\nand the pkg-config file (meshrt) of libmesh.")

# Maintainer scripts: the system users of the daemons, and systemd's view
# of the units. Nothing starts or enables a service: each needs its TLS
# files and tokens first (docs/deploy.md).
foreach(component coordinator agent)
  string(TOUPPER "${component}" upper)
  set(dir "${PROJECT_BINARY_DIR}/install-staging/deb-${component}")
  set(MESH_DEB_USER "mesh-${component}")
  configure_file("${PROJECT_SOURCE_DIR}/cmake/deb/postinst.in" "${dir}/postinst" @ONLY
                 FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
                                  GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  configure_file("${PROJECT_SOURCE_DIR}/cmake/deb/postrm.in" "${dir}/postrm" @ONLY
                 FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
                                  GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  set(CPACK_DEBIAN_${upper}_PACKAGE_CONTROL_EXTRA "${dir}/postinst;${dir}/postrm")
  set(CPACK_DEBIAN_${upper}_PACKAGE_CONTROL_STRICT_PERMISSION ON)
endforeach()

# Each package's /usr/share/doc/<package>/: copyright and changelog.
set(mesh_deb_packages
    "coordinator:mesh-coordinator" "agent:mesh-agent" "meshctl:meshctl"
    "runtime:libmeshrt${PROJECT_VERSION_MAJOR}" "dev:libmesh-dev" "python:python3-meshrt")
string(TIMESTAMP mesh_deb_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
foreach(entry IN LISTS mesh_deb_packages)
  string(REPLACE ":" ";" entry "${entry}")
  list(GET entry 0 component)
  list(GET entry 1 package)
  set(dir "${PROJECT_BINARY_DIR}/install-staging/doc-${package}")
  set(MESH_DEB_PACKAGE "${package}")
  set(MESH_DEB_DATE "${mesh_deb_date}")
  configure_file("${PROJECT_SOURCE_DIR}/cmake/deb/changelog.in" "${dir}/changelog.Debian" @ONLY)
  file(ARCHIVE_CREATE OUTPUT "${dir}/changelog.Debian.gz" PATHS "${dir}/changelog.Debian"
       FORMAT raw COMPRESSION GZip COMPRESSION_LEVEL 9)
  install(FILES "${PROJECT_SOURCE_DIR}/cmake/deb/copyright" "${dir}/changelog.Debian.gz"
          DESTINATION "${CMAKE_INSTALL_DATADIR}/doc/${package}" COMPONENT ${component})
endforeach()

include(CPack)
