# Resolves MESH_WITH_CUDA (AUTO/ON/OFF) into MESH_HAVE_CUDA and MESH_HAVE_NCCL.
#
# CUDA comes from find_package(CUDAToolkit), which also looks in
# /usr/local/cuda. NCCL has no CMake package; we look for nccl.h and libnccl
# next to the toolkit, or under $NCCL_ROOT. With ON, a missing piece is a
# configure error; with AUTO, it turns the GPU code off with a message.
set(MESH_HAVE_CUDA OFF)
set(MESH_HAVE_NCCL OFF)

string(TOUPPER "${MESH_WITH_CUDA}" _mesh_cuda_mode)
if(NOT _mesh_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MESH_WITH_CUDA must be AUTO, ON or OFF, not '${MESH_WITH_CUDA}'")
endif()

if(NOT _mesh_cuda_mode STREQUAL "OFF")
  if(_mesh_cuda_mode STREQUAL "ON")
    find_package(CUDAToolkit REQUIRED)
  else()
    find_package(CUDAToolkit QUIET)
  endif()

  if(CUDAToolkit_FOUND)
    find_path(NCCL_INCLUDE_DIR nccl.h
      HINTS $ENV{NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY NAMES nccl
      HINTS $ENV{NCCL_ROOT}/lib $ENV{NCCL_ROOT}/lib64 ${CUDAToolkit_LIBRARY_DIR})
  endif()

  if(CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(MESH_HAVE_CUDA ON)
    set(MESH_HAVE_NCCL ON)
    add_library(mesh_nccl_imported SHARED IMPORTED GLOBAL)
    set_target_properties(mesh_nccl_imported PROPERTIES
      IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
    add_library(mesh::nccl ALIAS mesh_nccl_imported)
    message(STATUS "CUDA ${CUDAToolkit_VERSION} at ${CUDAToolkit_LIBRARY_DIR}; NCCL ${NCCL_LIBRARY}")
  elseif(_mesh_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "MESH_WITH_CUDA=ON but NCCL was not found "
                        "(looked for nccl.h/libnccl near ${CUDAToolkit_INCLUDE_DIRS} and $NCCL_ROOT)")
  else()
    message(STATUS "MESH_WITH_CUDA=AUTO: CUDA or NCCL not found; building without GPU support")
  endif()
endif()

# CUDA kernels (libmesh's strided copy) need nvcc. Without one the build
# goes on and those paths fall back to the CUDA runtime's copies
# (MESH_HAVE_CUDA_KERNELS 0). CMAKE_CUDA_ARCHITECTURES defaults to the data
# centre and workstation parts CUDA 12 and 13 both support, as machine code,
# plus PTX of the newest for later parts to JIT.
set(MESH_HAVE_CUDA_KERNELS OFF)
if(MESH_HAVE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE
     AND EXISTS "${CUDAToolkit_NVCC_EXECUTABLE}")
    set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "75-real;80-real;90-real;100-real;120")
    endif()
    enable_language(CUDA)
    set(MESH_HAVE_CUDA_KERNELS ON)
    message(STATUS "CUDA kernels: ${CMAKE_CUDA_COMPILER} for ${CMAKE_CUDA_ARCHITECTURES}")
  else()
    message(STATUS "No nvcc: strided CUDA copies use cudaMemcpy2D instead of Mesh's kernel")
  endif()
endif()
