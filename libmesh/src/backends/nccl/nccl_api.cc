#include "backends/nccl/nccl_api.h"

#include "backends/nccl/nccl_util.h"

namespace mesh::nccl {
namespace {

// Forwards each call to the library function of the same name.
class RealApi final : public NcclApi {
 public:
  ncclResult_t GetVersion(int* version) override { return ncclGetVersion(version); }
  ncclResult_t GetUniqueId(ncclUniqueId* id) override { return ncclGetUniqueId(id); }
  ncclResult_t CommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                  ncclConfig_t* config) override {
    return ncclCommInitRankConfig(comm, nranks, id, rank, config);
  }
  ncclResult_t CommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int n_ids,
                                    ncclUniqueId* ids, ncclConfig_t* config) override {
#if MESH_NCCL_HAS_INIT_SCALABLE
    return ncclCommInitRankScalable(comm, nranks, rank, n_ids, ids, config);
#else
    (void)comm;
    (void)nranks;
    (void)rank;
    (void)n_ids;
    (void)ids;
    (void)config;
    return ncclInvalidUsage;
#endif
  }
  ncclResult_t CommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                         ncclConfig_t* config) override {
#if MESH_NCCL_HAS_SPLIT
    return ncclCommSplit(comm, color, key, newcomm, config);
#else
    (void)comm;
    (void)color;
    (void)key;
    (void)newcomm;
    (void)config;
    return ncclInvalidUsage;
#endif
  }
  ncclResult_t CommShrink(ncclComm_t comm, int* exclude, int exclude_count, ncclComm_t* newcomm,
                          ncclConfig_t* config, int flags) override {
#if MESH_NCCL_HAS_SHRINK
    return ncclCommShrink(comm, exclude, exclude_count, newcomm, config, flags);
#else
    (void)comm;
    (void)exclude;
    (void)exclude_count;
    (void)newcomm;
    (void)config;
    (void)flags;
    return ncclInvalidUsage;
#endif
  }
  ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* state) override {
    return ncclCommGetAsyncError(comm, state);
  }
  ncclResult_t CommFinalize(ncclComm_t comm) override { return ncclCommFinalize(comm); }
  ncclResult_t CommDestroy(ncclComm_t comm) override { return ncclCommDestroy(comm); }
  ncclResult_t CommAbort(ncclComm_t comm) override { return ncclCommAbort(comm); }
  ncclResult_t CommCount(ncclComm_t comm, int* count) override {
    return ncclCommCount(comm, count);
  }
  ncclResult_t CommUserRank(ncclComm_t comm, int* rank) override {
    return ncclCommUserRank(comm, rank);
  }
  const char* GetErrorString(ncclResult_t result) override { return ncclGetErrorString(result); }
  const char* GetLastError(ncclComm_t comm) override { return ncclGetLastError(comm); }

  ncclResult_t AllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override {
    return ncclAllReduce(sendbuff, recvbuff, count, type, op, comm, stream);
  }
  ncclResult_t Broadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                         int root, ncclComm_t comm, cudaStream_t stream) override {
    return ncclBroadcast(sendbuff, recvbuff, count, type, root, comm, stream);
  }
  ncclResult_t Reduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                      ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) override {
    return ncclReduce(sendbuff, recvbuff, count, type, op, root, comm, stream);
  }
  ncclResult_t AllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                         ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) override {
    return ncclAllGather(sendbuff, recvbuff, sendcount, type, comm, stream);
  }
  ncclResult_t ReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                             ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                             cudaStream_t stream) override {
    return ncclReduceScatter(sendbuff, recvbuff, recvcount, type, op, comm, stream);
  }
  ncclResult_t Send(const void* sendbuff, size_t count, ncclDataType_t type, int peer,
                    ncclComm_t comm, cudaStream_t stream) override {
    return ncclSend(sendbuff, count, type, peer, comm, stream);
  }
  ncclResult_t Recv(void* recvbuff, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                    cudaStream_t stream) override {
    return ncclRecv(recvbuff, count, type, peer, comm, stream);
  }
  ncclResult_t GroupStart() override { return ncclGroupStart(); }
  ncclResult_t GroupEnd() override { return ncclGroupEnd(); }

  cudaError_t GetDeviceCount(int* count) override { return cudaGetDeviceCount(count); }
  cudaError_t GetDevice(int* device) override { return cudaGetDevice(device); }
  cudaError_t SetDevice(int device) override { return cudaSetDevice(device); }
  cudaError_t StreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) override {
    return cudaStreamCreateWithFlags(stream, flags);
  }
  cudaError_t StreamDestroy(cudaStream_t stream) override { return cudaStreamDestroy(stream); }
  cudaError_t StreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) override {
    return cudaStreamWaitEvent(stream, event, flags);
  }
  cudaError_t EventCreateWithFlags(cudaEvent_t* event, unsigned int flags) override {
    return cudaEventCreateWithFlags(event, flags);
  }
  cudaError_t EventDestroy(cudaEvent_t event) override { return cudaEventDestroy(event); }
  cudaError_t EventRecord(cudaEvent_t event, cudaStream_t stream) override {
    return cudaEventRecord(event, stream);
  }
  cudaError_t EventQuery(cudaEvent_t event) override { return cudaEventQuery(event); }
  cudaError_t Malloc(void** ptr, size_t bytes) override { return cudaMalloc(ptr, bytes); }
  cudaError_t Free(void* ptr) override { return cudaFree(ptr); }
  cudaError_t Memset(void* ptr, int value, size_t bytes) override {
    return cudaMemset(ptr, value, bytes);
  }
  cudaError_t GetLastCudaError() override { return cudaGetLastError(); }
  const char* GetCudaErrorName(cudaError_t err) override { return cudaGetErrorName(err); }
  const char* GetCudaErrorString(cudaError_t err) override { return cudaGetErrorString(err); }
};

}  // namespace

NcclApi& RealNcclApi() {
  static NcclApi* const api = new RealApi();  // Leaked: groups may outlive static destructors.
  return *api;
}

}  // namespace mesh::nccl
