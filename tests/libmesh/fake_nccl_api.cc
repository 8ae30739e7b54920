#include "tests/libmesh/fake_nccl_api.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mesh::nccl::testing {

struct FakeNcclApi::Comm {
  std::string name;
  int count = 1;
  int rank = 0;
  // Polls that still read ncclInProgress (-1: forever), then `settled`.
  int polls_left = 0;
  ncclResult_t settled = ncclSuccess;
  bool aborted = false;
  bool destroyed = false;

  ncclComm_t handle() { return reinterpret_cast<ncclComm_t>(this); }
};

struct FakeNcclApi::Split {
  Comm* parent = nullptr;
  ncclComm_t* slot = nullptr;
  std::string child_name;
  int child_count = 1;
  int child_rank = 0;
  Comm* child = nullptr;  // Once published.
  SplitScript script;
  int parent_polls_seen = 0;
  bool published = false;
};

FakeNcclApi::FakeNcclApi() = default;
FakeNcclApi::~FakeNcclApi() = default;

void FakeNcclApi::set_device_count(int count) {
  absl::MutexLock lock(&mu_);
  device_count_ = count;
}

void FakeNcclApi::set_version(int version) {
  absl::MutexLock lock(&mu_);
  version_ = version;
}

void FakeNcclApi::ScriptInit(CommScript script) {
  absl::MutexLock lock(&mu_);
  init_scripts_.push_back(script);
}

void FakeNcclApi::ScriptSplit(SplitScript script) {
  absl::MutexLock lock(&mu_);
  split_scripts_.push_back(script);
}

void FakeNcclApi::ScriptOp(OpScript script) {
  absl::MutexLock lock(&mu_);
  op_scripts_.push_back(script);
}

void FakeNcclApi::set_finalize_polls(int polls) {
  absl::MutexLock lock(&mu_);
  finalize_polls_ = polls;
}

void FakeNcclApi::set_events_complete(bool complete) {
  absl::MutexLock lock(&mu_);
  events_complete_ = complete;
}

void FakeNcclApi::SetAsyncError(const std::string& comm, ncclResult_t state) {
  absl::MutexLock lock(&mu_);
  for (const std::unique_ptr<Comm>& c : comms_) {
    if (c->name == comm && !c->aborted && !c->destroyed) {
      c->polls_left = 0;
      c->settled = state;
    }
  }
}

void FakeNcclApi::PublishPendingSplits() {
  absl::MutexLock lock(&mu_);
  for (const std::unique_ptr<Split>& split : splits_) {
    if (!split->published) Publish(*split);
  }
}

std::vector<std::string> FakeNcclApi::log() const {
  absl::MutexLock lock(&mu_);
  return log_;
}

std::vector<std::string> FakeNcclApi::violations() const {
  absl::MutexLock lock(&mu_);
  return violations_;
}

int FakeNcclApi::LogIndex(const std::string& entry) const {
  absl::MutexLock lock(&mu_);
  auto it = std::find(log_.begin(), log_.end(), entry);
  return it == log_.end() ? -1 : static_cast<int>(it - log_.begin());
}

bool FakeNcclApi::aborted(const std::string& comm) const {
  absl::MutexLock lock(&mu_);
  for (const std::unique_ptr<Comm>& c : comms_) {
    if (c->name == comm && c->aborted) return true;
  }
  return false;
}

bool FakeNcclApi::destroyed(const std::string& comm) const {
  absl::MutexLock lock(&mu_);
  for (const std::unique_ptr<Comm>& c : comms_) {
    if (c->name == comm && c->destroyed) return true;
  }
  return false;
}

int FakeNcclApi::unpublished_splits() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(
      std::count_if(splits_.begin(), splits_.end(),
                    [](const std::unique_ptr<Split>& s) { return !s->published; }));
}

int FakeNcclApi::live_streams() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

std::vector<FakeNcclApi::StreamCall> FakeNcclApi::stream_calls() const {
  absl::MutexLock lock(&mu_);
  return stream_calls_;
}

int FakeNcclApi::live_events() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(events_.size());
}

void FakeNcclApi::Violation(std::string what) { violations_.push_back(std::move(what)); }

FakeNcclApi::Comm* FakeNcclApi::Find(ncclComm_t comm, const char* call) {
  for (const std::unique_ptr<Comm>& c : comms_) {
    if (c->handle() != comm) continue;
    if (c->aborted || c->destroyed) {
      Violation(absl::StrCat(call, " on '", c->name, "' after ",
                             c->aborted ? "ncclCommAbort" : "ncclCommDestroy"));
      return nullptr;
    }
    return c.get();
  }
  Violation(absl::StrCat(call, " on an unknown communicator"));
  return nullptr;
}

FakeNcclApi::Comm* FakeNcclApi::NewComm(std::string name, int count, int rank,
                                        const CommScript& script) {
  auto comm = std::make_unique<Comm>();
  comm->name = std::move(name);
  comm->count = script.count > 0 ? script.count : count;
  comm->rank = script.count > 0 ? script.rank : rank;
  comm->polls_left = script.init_polls;
  comm->settled = script.init_result;
  comms_.push_back(std::move(comm));
  return comms_.back().get();
}

void FakeNcclApi::Publish(Split& split) {
  Comm* child = NewComm(split.child_name, split.child_count, split.child_rank, split.script.child);
  split.published = true;
  split.child = child;
  log_.push_back(absl::StrCat("Publish(", split.child_name, ")"));
  // What NCCL's job thread does at the end of the child's init.
  std::atomic_ref<ncclComm_t>(*split.slot).store(child->handle(), std::memory_order_release);
}

ncclResult_t FakeNcclApi::PollLocked(Comm& comm) {
  if (comm.polls_left < 0) return ncclInProgress;
  if (comm.polls_left > 0) {
    --comm.polls_left;
    return ncclInProgress;
  }
  return comm.settled;
}

ncclResult_t FakeNcclApi::GetVersion(int* version) {
  absl::MutexLock lock(&mu_);
  *version = version_;
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::GetUniqueId(ncclUniqueId* id) {
  absl::MutexLock lock(&mu_);
  std::memset(id->internal, 0, sizeof(id->internal));
  const uintptr_t n = next_handle_++;
  std::memcpy(id->internal, &n, sizeof(n));
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::CommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId, int rank,
                                             ncclConfig_t* config) {
  absl::MutexLock lock(&mu_);
  CommScript script;
  if (!init_scripts_.empty()) {
    script = init_scripts_.front();
    init_scripts_.pop_front();
  }
  std::string name = config != nullptr && config->commName != nullptr ? config->commName : "";
  log_.push_back(absl::StrCat("CommInitRankConfig(", name, ")"));
  // Like NCCL, the communicator is published before the call returns.
  Comm* c = NewComm(std::move(name), nranks, rank, script);
  *comm = c->handle();
  return script.init_polls == 0 ? ncclSuccess : ncclInProgress;
}

ncclResult_t FakeNcclApi::CommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int n_ids,
                                               ncclUniqueId* ids, ncclConfig_t* config) {
  absl::MutexLock lock(&mu_);
  if (version_ < NCCL_VERSION(2, 23, 0)) {
    Violation("ncclCommInitRankScalable called on an NCCL older than 2.23");
    return ncclInvalidUsage;
  }
  if (n_ids < 1 || ids == nullptr) {
    Violation("ncclCommInitRankScalable without unique IDs");
    return ncclInvalidArgument;
  }
  CommScript script;
  if (!init_scripts_.empty()) {
    script = init_scripts_.front();
    init_scripts_.pop_front();
  }
  scalable_ids_.assign(ids, ids + n_ids);
  std::string name = config != nullptr && config->commName != nullptr ? config->commName : "";
  log_.push_back(absl::StrCat("CommInitRankScalable(", name, ", ", n_ids, " ids)"));
  Comm* c = NewComm(std::move(name), nranks, rank, script);
  *comm = c->handle();
  return script.init_polls == 0 ? ncclSuccess : ncclInProgress;
}

std::vector<std::string> FakeNcclApi::split_args() const {
  absl::MutexLock lock(&mu_);
  return split_args_;
}

std::vector<ncclUniqueId> FakeNcclApi::scalable_ids() const {
  absl::MutexLock lock(&mu_);
  return scalable_ids_;
}

ncclResult_t FakeNcclApi::CommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                    ncclConfig_t* config) {
  absl::MutexLock lock(&mu_);
  Comm* parent = Find(comm, "CommSplit");
  if (parent == nullptr) return ncclInvalidArgument;
  log_.push_back(absl::StrCat("CommSplit(", parent->name, ")"));
  split_args_.push_back(absl::StrCat(parent->name, ": color ", color, ", key ", key));
  return StartChild(*parent, newcomm, config, /*count=*/0, /*rank=*/0);
}

ncclResult_t FakeNcclApi::CommShrink(ncclComm_t comm, int* exclude, int exclude_count,
                                     ncclComm_t* newcomm, ncclConfig_t* config, int flags) {
  absl::MutexLock lock(&mu_);
  Comm* parent = Find(comm, "CommShrink");
  if (parent == nullptr) return ncclInvalidArgument;
  if (version_ < NCCL_VERSION(2, 27, 0)) {
    Violation("ncclCommShrink called on an NCCL older than 2.27");
    return ncclInvalidUsage;
  }
  if (exclude == nullptr || exclude_count <= 0) {
    Violation(absl::StrCat("ncclCommShrink of '", parent->name, "' excluding no rank"));
    return ncclInvalidArgument;
  }
  if (flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT) {
    Violation(absl::StrCat("ncclCommShrink with unknown flags ", flags));
    return ncclInvalidArgument;
  }
  std::sort(exclude, exclude + exclude_count);  // As NCCL does, in place.
  std::string excluded;
  for (int i = 0; i < exclude_count; ++i) {
    if (exclude[i] < 0 || exclude[i] >= parent->count || (i > 0 && exclude[i] == exclude[i - 1])) {
      Violation(absl::StrCat("ncclCommShrink of '", parent->name, "' (", parent->count,
                             " ranks) excluding rank ", exclude[i]));
      return ncclInvalidArgument;
    }
    absl::StrAppend(&excluded, " ", exclude[i]);
  }
  log_.push_back(absl::StrCat("CommShrink(", parent->name, ", excluding", excluded, ", ",
                              flags == NCCL_SHRINK_ABORT ? "abort" : "default", ")"));
  if (std::binary_search(exclude, exclude + exclude_count, parent->rank)) {
    Violation(absl::StrCat("ncclCommShrink of '", parent->name, "' called by its rank ",
                           parent->rank, ", which it excludes"));
    return ncclInvalidArgument;
  }
  const int below =
      static_cast<int>(std::lower_bound(exclude, exclude + exclude_count, parent->rank) - exclude);
  return StartChild(*parent, newcomm, config, parent->count - exclude_count, parent->rank - below);
}

ncclResult_t FakeNcclApi::StartChild(Comm& parent, ncclComm_t* newcomm, ncclConfig_t* config,
                                     int count, int rank) {
  if (parent.polls_left != 0) {
    Violation(absl::StrCat("a child of '", parent.name, "' started while it is in progress"));
  }
  SplitScript script;
  if (!split_scripts_.empty()) {
    script = split_scripts_.front();
    split_scripts_.pop_front();
  }
  // NCCL clears the slot first; it stays null until the job publishes.
  *newcomm = nullptr;
  if (script.call_result != ncclSuccess && script.call_result != ncclInProgress) {
    return script.call_result;
  }
  auto split = std::make_unique<Split>();
  split->parent = &parent;
  split->slot = newcomm;
  split->child_name = config != nullptr && config->commName != nullptr ? config->commName : "";
  split->child_count = count > 0 ? count : 1;
  split->child_rank = count > 0 ? rank : 0;
  split->script = script;
  parent.polls_left = script.parent_polls;
  parent.settled = script.parent_result;
  splits_.push_back(std::move(split));
  if (script.publish_after_parent_polls == 0) Publish(*splits_.back());
  return script.call_result;
}

ncclResult_t FakeNcclApi::CommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  absl::MutexLock lock(&mu_);
  Comm* c = Find(comm, "CommGetAsyncError");
  if (c == nullptr) return ncclInvalidArgument;
  for (const std::unique_ptr<Split>& split : splits_) {
    if (split->published || split->parent != c) continue;
    ++split->parent_polls_seen;
    if (split->script.publish_after_parent_polls > 0 &&
        split->parent_polls_seen >= split->script.publish_after_parent_polls) {
      Publish(*split);
    }
  }
  *state = PollLocked(*c);
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::CommFinalize(ncclComm_t comm) {
  absl::MutexLock lock(&mu_);
  Comm* c = Find(comm, "CommFinalize");
  if (c == nullptr) return ncclInvalidArgument;
  log_.push_back(absl::StrCat("CommFinalize(", c->name, ")"));
  c->polls_left = finalize_polls_;
  c->settled = ncclSuccess;
  return finalize_polls_ == 0 ? ncclSuccess : ncclInProgress;
}

ncclResult_t FakeNcclApi::CommDestroy(ncclComm_t comm) {
  absl::MutexLock lock(&mu_);
  Comm* c = Find(comm, "CommDestroy");
  if (c == nullptr) return ncclInvalidArgument;
  log_.push_back(absl::StrCat("CommDestroy(", c->name, ")"));
  c->destroyed = true;
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::CommAbort(ncclComm_t comm) {
  absl::MutexLock lock(&mu_);
  Comm* c = Find(comm, "CommAbort");
  if (c == nullptr) return ncclInvalidArgument;
  for (const std::unique_ptr<Split>& split : splits_) {
    if (split->parent == c && !split->published) {
      Violation(absl::StrCat("ncclCommAbort of '", c->name, "' while its split child '",
                             split->child_name, "' was unpublished"));
    }
  }
  for (const std::unique_ptr<Split>& split : splits_) {
    // NCCL's parent keeps a pointer to a failed child's abort flags, which
    // the child's abort freed; aborting the parent writes them.
    if (split->parent == c && split->child != nullptr && split->child->aborted &&
        split->script.child.init_result != ncclSuccess) {
      Violation(absl::StrCat("ncclCommAbort of '", c->name, "' after its failed child '",
                             split->child_name, "' was aborted"));
    }
  }
  log_.push_back(absl::StrCat("CommAbort(", c->name, ")"));
  c->aborted = true;
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::CommCount(ncclComm_t comm, int* count) {
  absl::MutexLock lock(&mu_);
  Comm* c = Find(comm, "CommCount");
  if (c == nullptr) return ncclInvalidArgument;
  *count = c->count;
  return ncclSuccess;
}

ncclResult_t FakeNcclApi::CommUserRank(ncclComm_t comm, int* rank) {
  absl::MutexLock lock(&mu_);
  Comm* c = Find(comm, "CommUserRank");
  if (c == nullptr) return ncclInvalidArgument;
  *rank = c->rank;
  return ncclSuccess;
}

const char* FakeNcclApi::GetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclSystemError:
      return "unhandled system error (fake)";
    case ncclRemoteError:
      return "remote process exited or there was a network error (fake)";
    case ncclInternalError:
      return "internal error (fake)";
    case ncclInvalidArgument:
      return "invalid argument (fake)";
    case ncclInvalidUsage:
      return "invalid usage (fake)";
    case ncclInProgress:
      return "NCCL operation in progress (fake)";
    default:
      return "unknown result code (fake)";
  }
}

const char* FakeNcclApi::GetLastError(ncclComm_t) { return ""; }

ncclResult_t FakeNcclApi::Op(const char* call, ncclComm_t comm, cudaStream_t stream) {
  absl::MutexLock lock(&mu_);
  Comm* c = Find(comm, call);
  if (c == nullptr) return ncclInvalidArgument;
  stream_calls_.push_back(StreamCall{call, stream, nullptr});
  if (c->polls_left != 0) {
    Violation(absl::StrCat(call, " on '", c->name, "' while it is in progress"));
  }
  log_.push_back(absl::StrCat(call, "(", c->name, ")"));
  OpScript script;
  if (!op_scripts_.empty()) {
    script = op_scripts_.front();
    op_scripts_.pop_front();
  }
  if (script.call_result == ncclInProgress) {
    c->polls_left = script.polls;
    c->settled = script.after;
  }
  return script.call_result;
}

ncclResult_t FakeNcclApi::AllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                    ncclComm_t comm, cudaStream_t stream) {
  return Op("AllReduce", comm, stream);
}
ncclResult_t FakeNcclApi::Broadcast(const void*, void*, size_t, ncclDataType_t, int,
                                    ncclComm_t comm, cudaStream_t stream) {
  return Op("Broadcast", comm, stream);
}
ncclResult_t FakeNcclApi::Reduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int,
                                 ncclComm_t comm, cudaStream_t stream) {
  return Op("Reduce", comm, stream);
}
ncclResult_t FakeNcclApi::AllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t comm,
                                    cudaStream_t stream) {
  return Op("AllGather", comm, stream);
}
ncclResult_t FakeNcclApi::ReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                        ncclComm_t comm, cudaStream_t stream) {
  return Op("ReduceScatter", comm, stream);
}
ncclResult_t FakeNcclApi::Send(const void*, size_t, ncclDataType_t, int, ncclComm_t comm,
                               cudaStream_t stream) {
  return Op("Send", comm, stream);
}
ncclResult_t FakeNcclApi::Recv(void*, size_t, ncclDataType_t, int, ncclComm_t comm,
                               cudaStream_t stream) {
  return Op("Recv", comm, stream);
}
ncclResult_t FakeNcclApi::GroupStart() { return ncclSuccess; }
ncclResult_t FakeNcclApi::GroupEnd() { return ncclSuccess; }

cudaError_t FakeNcclApi::GetDeviceCount(int* count) {
  absl::MutexLock lock(&mu_);
  *count = device_count_;
  return device_count_ > 0 ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t FakeNcclApi::GetDevice(int* device) {
  absl::MutexLock lock(&mu_);
  *device = current_device_;
  return cudaSuccess;
}

cudaError_t FakeNcclApi::SetDevice(int device) {
  absl::MutexLock lock(&mu_);
  if (device < 0 || device >= device_count_) return cudaErrorInvalidDevice;
  current_device_ = device;
  return cudaSuccess;
}

cudaError_t FakeNcclApi::StreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  absl::MutexLock lock(&mu_);
  const uintptr_t handle = next_handle_++;
  streams_.insert(handle);
  *stream = reinterpret_cast<cudaStream_t>(handle);
  return cudaSuccess;
}

cudaError_t FakeNcclApi::StreamDestroy(cudaStream_t stream) {
  absl::MutexLock lock(&mu_);
  if (streams_.erase(reinterpret_cast<uintptr_t>(stream)) == 0) {
    Violation("cudaStreamDestroy of an unknown or destroyed stream");
    return cudaErrorInvalidResourceHandle;
  }
  return cudaSuccess;
}

cudaError_t FakeNcclApi::StreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  absl::MutexLock lock(&mu_);
  stream_calls_.push_back(StreamCall{"StreamWaitEvent", stream, event});
  if (events_.count(reinterpret_cast<uintptr_t>(event)) == 0) {
    Violation("cudaStreamWaitEvent on an unknown or destroyed event");
    return cudaErrorInvalidResourceHandle;
  }
  return cudaSuccess;
}

cudaError_t FakeNcclApi::EventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  absl::MutexLock lock(&mu_);
  const uintptr_t handle = next_handle_++;
  events_.insert(handle);
  *event = reinterpret_cast<cudaEvent_t>(handle);
  return cudaSuccess;
}

cudaError_t FakeNcclApi::EventDestroy(cudaEvent_t event) {
  absl::MutexLock lock(&mu_);
  if (events_.erase(reinterpret_cast<uintptr_t>(event)) == 0) {
    Violation("cudaEventDestroy of an unknown or destroyed event");
    return cudaErrorInvalidResourceHandle;
  }
  return cudaSuccess;
}

cudaError_t FakeNcclApi::EventRecord(cudaEvent_t event, cudaStream_t stream) {
  absl::MutexLock lock(&mu_);
  stream_calls_.push_back(StreamCall{"EventRecord", stream, event});
  if (events_.count(reinterpret_cast<uintptr_t>(event)) == 0) {
    Violation("cudaEventRecord on an unknown or destroyed event");
    return cudaErrorInvalidResourceHandle;
  }
  return cudaSuccess;
}

cudaError_t FakeNcclApi::EventQuery(cudaEvent_t event) {
  absl::MutexLock lock(&mu_);
  if (events_.count(reinterpret_cast<uintptr_t>(event)) == 0) {
    Violation("cudaEventQuery on an unknown or destroyed event");
    return cudaErrorInvalidResourceHandle;
  }
  return events_complete_ ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t FakeNcclApi::Malloc(void** ptr, size_t bytes) {
  absl::MutexLock lock(&mu_);
  auto memory = std::make_unique<char[]>(std::max<size_t>(bytes, 1));
  *ptr = memory.get();
  allocations_[*ptr] = std::move(memory);
  return cudaSuccess;
}

cudaError_t FakeNcclApi::Free(void* ptr) {
  absl::MutexLock lock(&mu_);
  if (allocations_.erase(ptr) == 0) {
    Violation("cudaFree of memory the fake did not allocate");
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t FakeNcclApi::Memset(void* ptr, int value, size_t bytes) {
  absl::MutexLock lock(&mu_);
  if (allocations_.count(ptr) == 0) {
    Violation("cudaMemset of memory the fake did not allocate");
    return cudaErrorInvalidValue;
  }
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}

cudaError_t FakeNcclApi::GetLastCudaError() { return cudaSuccess; }

const char* FakeNcclApi::GetCudaErrorName(cudaError_t err) {
  return err == cudaSuccess ? "cudaSuccess" : "cudaErrorFake";
}

const char* FakeNcclApi::GetCudaErrorString(cudaError_t err) {
  return err == cudaSuccess ? "no error" : "a CUDA error (fake)";
}

}  // namespace mesh::nccl::testing
