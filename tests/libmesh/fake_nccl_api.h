// A scripted NcclApi for CPU tests of the NCCL backend's state machines
// (backends/nccl/nccl_api.h). No GPU and no NCCL communication: handles are
// tokens the fake mints, and each communicator follows a script of the
// states non-blocking NCCL can report.
//
// What it models, after NCCL's documentation and source:
//   * ncclCommInitRankConfig (and ncclCommInitRankScalable, 2.23 on)
//     publishes the communicator at once; its state
//     reads ncclInProgress for `init_polls` polls, then `init_result`.
//   * ncclCommSplit returns `call_result` (ncclSuccess by default, as NCCL
//     2.28 does while its split job still runs). While the job runs the
//     parent reads ncclInProgress for `parent_polls` polls, then
//     `parent_result`. The job publishes the child into the caller's slot
//     (an atomic store from the "job", i.e. during some later call) after
//     `publish_after_parent_polls` polls of the parent, or only when the test
//     calls PublishPendingSplits. Published, the child reads ncclInProgress
//     for `child.init_polls` polls, then `child.init_result`.
//   * ncclCommShrink (2.27 on) is a split whose child has the parent's
//     members without the excluded ones, in order: it takes the split
//     scripts the same way, except that the child's count and rank follow
//     from the exclusions unless the script sets them. NCCL's argument
//     rules are checked: at least one excluded rank, none out of range, not
//     the caller, and a flag NCCL knows. Each call is logged as
//     "CommShrink(parent, excluding a b ..., flags)", the exclusions sorted
//     as NCCL sorts them in place.
//   * An operation returns its script's `call_result`; with ncclInProgress,
//     the communicator then reads ncclInProgress for `polls` polls and then
//     `after`.
//   * ncclCommFinalize reads ncclInProgress for `finalize_polls` polls (-1:
//     forever), then ncclSuccess.
//
// What it checks: a call on a communicator after ncclCommAbort/Destroy, an
// abort of a parent whose split child is unpublished, an abort of a parent
// after its failed child's (NCCL writes the child's freed abort flags), an unknown handle, and
// destroying a stream or event twice are recorded as violations() (a real
// NCCL would corrupt memory or hang there). Every communicator call is
// logged as "Call(name)" in log().
//
// Thread safety: thread-safe; the code under test calls it from its own
// threads and the watchdog's while the test scripts it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "backends/nccl/nccl_api.h"

namespace mesh::nccl::testing {

class FakeNcclApi final : public NcclApi {
 public:
  struct CommScript {
    int init_polls = 0;  // -1: ncclInProgress forever.
    ncclResult_t init_result = ncclSuccess;
    // ncclCommCount / ncclCommUserRank; count 0 means "the nranks given at
    // init" (a split child without one gets 1 and rank 0).
    int count = 0;
    int rank = 0;
  };
  struct SplitScript {
    // NCCL 2.28's ncclCommSplit returns ncclSuccess on a non-blocking
    // communicator with its job still running (ncclGroupEnd's
    // ncclInProgress is not passed on); older ones may say ncclInProgress.
    ncclResult_t call_result = ncclSuccess;
    int parent_polls = 0;  // -1: ncclInProgress forever.
    ncclResult_t parent_result = ncclSuccess;
    int publish_after_parent_polls = 0;  // -1: only PublishPendingSplits.
    CommScript child;
  };
  struct OpScript {
    ncclResult_t call_result = ncclSuccess;
    int polls = 0;
    ncclResult_t after = ncclSuccess;
  };

  FakeNcclApi();
  ~FakeNcclApi() override;

  // ---- Scripting (before the calls they affect) -----------------------------
  void set_device_count(int count);
  void set_version(int version);
  // The next ncclCommInitRankConfig calls take these in order; then defaults.
  void ScriptInit(CommScript script);
  // The next ncclCommSplit calls take these in order; then defaults.
  void ScriptSplit(SplitScript script);
  // The next operations (any of the collective / p2p calls) take these.
  void ScriptOp(OpScript script);
  void set_finalize_polls(int polls);
  // Whether completion events read as done (cudaEventQuery).
  void set_events_complete(bool complete);
  // The named communicator now reports `state` (an asynchronous error).
  void SetAsyncError(const std::string& comm, ncclResult_t state);
  // Publishes every split child not yet published (a late NCCL job).
  void PublishPendingSplits();

  // ---- Inspection ------------------------------------------------------------
  std::vector<std::string> log() const;
  std::vector<std::string> violations() const;
  // Index of the first log entry equal to `entry`, or -1.
  int LogIndex(const std::string& entry) const;
  bool aborted(const std::string& comm) const;
  bool destroyed(const std::string& comm) const;
  int unpublished_splits() const;
  // Streams and events created and not destroyed.
  int live_streams() const;
  int live_events() const;
  // Every call that puts work on a stream, in order: "EventRecord",
  // "StreamWaitEvent", or an op's name ("AllReduce"), with its stream.
  struct StreamCall {
    std::string call;
    cudaStream_t stream;
    cudaEvent_t event;  // Null for an op.
  };
  std::vector<StreamCall> stream_calls() const;

  // ---- NcclApi ---------------------------------------------------------------
  ncclResult_t GetVersion(int* version) override;
  ncclResult_t GetUniqueId(ncclUniqueId* id) override;
  ncclResult_t CommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                  ncclConfig_t* config) override;
  ncclResult_t CommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int n_ids,
                                    ncclUniqueId* ids, ncclConfig_t* config) override;
  // Each ncclCommSplit's "<parent>: color <c>, key <k>", in order.
  std::vector<std::string> split_args() const;
  // The root IDs of the last ncclCommInitRankScalable, in order.
  std::vector<ncclUniqueId> scalable_ids() const;
  ncclResult_t CommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                         ncclConfig_t* config) override;
  ncclResult_t CommShrink(ncclComm_t comm, int* exclude, int exclude_count, ncclComm_t* newcomm,
                          ncclConfig_t* config, int flags) override;
  ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* state) override;
  ncclResult_t CommFinalize(ncclComm_t comm) override;
  ncclResult_t CommDestroy(ncclComm_t comm) override;
  ncclResult_t CommAbort(ncclComm_t comm) override;
  ncclResult_t CommCount(ncclComm_t comm, int* count) override;
  ncclResult_t CommUserRank(ncclComm_t comm, int* rank) override;
  const char* GetErrorString(ncclResult_t result) override;
  const char* GetLastError(ncclComm_t comm) override;
  ncclResult_t AllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t Broadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                         int root, ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t Reduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t type,
                      ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t AllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                         ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t ReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                             ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                             cudaStream_t stream) override;
  ncclResult_t Send(const void* sendbuff, size_t count, ncclDataType_t type, int peer,
                    ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t Recv(void* recvbuff, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                    cudaStream_t stream) override;
  ncclResult_t GroupStart() override;
  ncclResult_t GroupEnd() override;

  cudaError_t GetDeviceCount(int* count) override;
  cudaError_t GetDevice(int* device) override;
  cudaError_t SetDevice(int device) override;
  cudaError_t StreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) override;
  cudaError_t StreamDestroy(cudaStream_t stream) override;
  cudaError_t StreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) override;
  cudaError_t EventCreateWithFlags(cudaEvent_t* event, unsigned int flags) override;
  cudaError_t EventDestroy(cudaEvent_t event) override;
  cudaError_t EventRecord(cudaEvent_t event, cudaStream_t stream) override;
  cudaError_t EventQuery(cudaEvent_t event) override;
  cudaError_t Malloc(void** ptr, size_t bytes) override;
  cudaError_t Free(void* ptr) override;
  cudaError_t Memset(void* ptr, int value, size_t bytes) override;
  cudaError_t GetLastCudaError() override;
  const char* GetCudaErrorName(cudaError_t err) override;
  const char* GetCudaErrorString(cudaError_t err) override;

 private:
  struct Comm;
  struct Split;

  Comm* Find(ncclComm_t comm, const char* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Comm* NewComm(std::string name, int count, int rank, const CommScript& script)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish(Split& split) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CommSplit and CommShrink after their own checks: takes the next split
  // script and starts the child's job. `count`/`rank` are the child's shape
  // when the script does not set one (count 0: 1 and rank 0).
  ncclResult_t StartChild(Comm& parent, ncclComm_t* newcomm, ncclConfig_t* config, int count,
                          int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Advances `comm`'s scripted state by one poll and returns what it reads.
  ncclResult_t PollLocked(Comm& comm) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ncclResult_t Op(const char* call, ncclComm_t comm, cudaStream_t stream);
  void Violation(std::string what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  int device_count_ ABSL_GUARDED_BY(mu_) = 1;
  int version_ ABSL_GUARDED_BY(mu_) = NCCL_VERSION_CODE;
  int current_device_ ABSL_GUARDED_BY(mu_) = 0;
  bool events_complete_ ABSL_GUARDED_BY(mu_) = true;
  int finalize_polls_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<CommScript> init_scripts_ ABSL_GUARDED_BY(mu_);
  std::vector<ncclUniqueId> scalable_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> split_args_ ABSL_GUARDED_BY(mu_);
  std::deque<SplitScript> split_scripts_ ABSL_GUARDED_BY(mu_);
  std::deque<OpScript> op_scripts_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Comm>> comms_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Split>> splits_ ABSL_GUARDED_BY(mu_);
  std::set<uintptr_t> streams_ ABSL_GUARDED_BY(mu_);
  std::set<uintptr_t> events_ ABSL_GUARDED_BY(mu_);
  std::map<void*, std::unique_ptr<char[]>> allocations_ ABSL_GUARDED_BY(mu_);
  uintptr_t next_handle_ ABSL_GUARDED_BY(mu_) = 0x1000;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  std::vector<StreamCall> stream_calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mesh::nccl::testing
