// The seam between libmesh's NCCL backend and the NCCL and CUDA runtime
// libraries. Private to libmesh; compiled only when MESH_HAVE_NCCL.
//
// Every NCCL and CUDA runtime call the backend makes (nccl_util, nccl_group,
// nccl_factory) goes through one NcclApi, whose methods mirror the C
// functions one to one: same arguments, same result codes, no policy. The
// real one (RealNcclApi) forwards to libnccl and libcudart. Tests substitute
// a scripted fake (tests/libmesh/fake_nccl_api.h) that replays the sequences
// NCCL's documentation and source allow for non-blocking communicators:
// ncclInProgress followed by success or an error, a child communicator that
// is published after the parent already reads as done, asynchronous errors,
// and calls that never finish. That is how the creation, split, abort and
// teardown state machines are tested on machines without a GPU.
//
// Handles (ncclComm_t, cudaStream_t, cudaEvent_t, device pointers) are
// opaque to the backend: it only stores them and hands them back, so a fake
// may mint its own.
//
// Thread safety: RealNcclApi is as thread-safe as the libraries themselves
// (NCCL: calls on one communicator are serialized by the caller). A fake
// documents its own.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>

namespace mesh::nccl {

class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // ---- NCCL: versions, ids, communicators --------------------------------
  virtual ncclResult_t GetVersion(int* version) = 0;
  virtual ncclResult_t GetUniqueId(ncclUniqueId* id) = 0;
  virtual ncclResult_t CommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                          ncclConfig_t* config) = 0;
  // Only called where NCCL has it (MESH_NCCL_HAS_INIT_SCALABLE); the real
  // one answers ncclInvalidUsage otherwise.
  virtual ncclResult_t CommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int n_ids,
                                            ncclUniqueId* ids, ncclConfig_t* config) = 0;
  // Only called where NCCL has it (MESH_NCCL_HAS_SPLIT); the real one
  // answers ncclInvalidUsage otherwise.
  virtual ncclResult_t CommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                 ncclConfig_t* config) = 0;
  // Only called where NCCL has it (MESH_NCCL_HAS_SHRINK); the real one
  // answers ncclInvalidUsage otherwise. NCCL sorts `exclude` in place.
  virtual ncclResult_t CommShrink(ncclComm_t comm, int* exclude, int exclude_count,
                                  ncclComm_t* newcomm, ncclConfig_t* config, int flags) = 0;
  virtual ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* state) = 0;
  virtual ncclResult_t CommFinalize(ncclComm_t comm) = 0;
  virtual ncclResult_t CommDestroy(ncclComm_t comm) = 0;
  virtual ncclResult_t CommAbort(ncclComm_t comm) = 0;
  virtual ncclResult_t CommCount(ncclComm_t comm, int* count) = 0;
  virtual ncclResult_t CommUserRank(ncclComm_t comm, int* rank) = 0;
  virtual const char* GetErrorString(ncclResult_t result) = 0;
  virtual const char* GetLastError(ncclComm_t comm) = 0;

  // ---- NCCL: operations ----------------------------------------------------
  virtual ncclResult_t AllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t stream) = 0;
  virtual ncclResult_t Broadcast(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t type, int root, ncclComm_t comm,
                                 cudaStream_t stream) = 0;
  virtual ncclResult_t Reduce(const void* sendbuff, void* recvbuff, size_t count,
                              ncclDataType_t type, ncclRedOp_t op, int root, ncclComm_t comm,
                              cudaStream_t stream) = 0;
  virtual ncclResult_t AllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                 ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t ReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                     ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream) = 0;
  virtual ncclResult_t Send(const void* sendbuff, size_t count, ncclDataType_t type, int peer,
                            ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t Recv(void* recvbuff, size_t count, ncclDataType_t type, int peer,
                            ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t GroupStart() = 0;
  virtual ncclResult_t GroupEnd() = 0;

  // ---- CUDA runtime --------------------------------------------------------
  virtual cudaError_t GetDeviceCount(int* count) = 0;
  virtual cudaError_t GetDevice(int* device) = 0;
  virtual cudaError_t SetDevice(int device) = 0;
  virtual cudaError_t StreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) = 0;
  virtual cudaError_t StreamDestroy(cudaStream_t stream) = 0;
  virtual cudaError_t StreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                      unsigned int flags) = 0;
  virtual cudaError_t EventCreateWithFlags(cudaEvent_t* event, unsigned int flags) = 0;
  virtual cudaError_t EventDestroy(cudaEvent_t event) = 0;
  virtual cudaError_t EventRecord(cudaEvent_t event, cudaStream_t stream) = 0;
  virtual cudaError_t EventQuery(cudaEvent_t event) = 0;
  virtual cudaError_t Malloc(void** ptr, size_t bytes) = 0;
  virtual cudaError_t Free(void* ptr) = 0;
  virtual cudaError_t Memset(void* ptr, int value, size_t bytes) = 0;
  virtual cudaError_t GetLastCudaError() = 0;
  virtual const char* GetCudaErrorName(cudaError_t err) = 0;
  virtual const char* GetCudaErrorString(cudaError_t err) = 0;
};

// The process-wide NcclApi over libnccl and libcudart. Never destroyed.
NcclApi& RealNcclApi();

}  // namespace mesh::nccl
