// NCCL and CUDA plumbing shared by the NCCL backend: type mapping, error
// conversion, the device guard, and polling of non-blocking communicators.
// Private to libmesh; compiled only when MESH_HAVE_NCCL. Every library call
// goes through an NcclApi (backends/nccl/nccl_api.h), so the polling logic
// here runs against a scripted fake in the CPU tests.
//
// Non-blocking communicators (ncclConfig_t::blocking = 0) may answer any
// call with ncclInProgress. NCCL then requires polling ncclCommGetAsyncError
// until the state leaves ncclInProgress before the next call on that
// communicator, and, because NCCL keeps the pending group job in thread-local
// state, before the calling thread makes any other NCCL call. AwaitComm is
// that poll; every caller finishes it (or aborts the communicator) before
// returning.
//
// A split is different (AwaitSplit): NCCL's split job creates the child
// communicator and stores it into the caller's `newcomm` slot from its own
// thread, at the very end of the child's initialization. Until the slot is
// written the child's init is in flight, and neither the call's result nor
// the parent's state says when that happens: NCCL 2.28's ncclCommSplit
// returns ncclSuccess on a non-blocking communicator while the job still
// runs. So the slot may be neither freed nor read as final before NCCL has
// written it, and the parent is not aborted meanwhile (see nccl_group.h).
//
// Thread safety: all functions are thread-safe for distinct communicators;
// callers serialize calls on one communicator.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "backends/nccl/nccl_api.h"
#include "backends/nccl/nccl_checks.h"
#include "mesh/dtype.h"
#include "mesh/process_group.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "libmesh's NCCL backend needs NCCL >= 2.14 (non-blocking communicators)"
#endif

// ncclCommSplit arrived in 2.18.
#define MESH_NCCL_HAS_SPLIT (NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0))
// ncclCommInitRankScalable (several root unique IDs) arrived in 2.23.
#define MESH_NCCL_HAS_INIT_SCALABLE (NCCL_VERSION_CODE >= NCCL_VERSION(2, 23, 0))
// ncclCommShrink (and NCCL_SHRINK_ABORT) arrived in 2.27.
#define MESH_NCCL_HAS_SHRINK (NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0))
// ncclConfig_t::commName, shown in NCCL's logs and given to profiler
// plugins. Guarded conservatively (the field sits after 2.25's trafficClass
// in the struct; 2.27 certainly has it).
#define MESH_NCCL_HAS_COMM_NAME (NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0))

namespace mesh::nccl {

// What the headers support (bfloat16 and ncclAvg: NCCL >= 2.10).
NcclCaps BuiltCaps();

// Whether ncclCommSplit is usable: compiled in and the loaded library is at
// least 2.19. ncclCommSplit exists since 2.18, but there a non-blocking
// split's job lives in the calling thread's state, so an abort from another
// thread (the watchdog, teardown) does not join it and the thread's next
// group call races with it; from 2.19 the job belongs to the communicator.
// Older libraries build groups from unique IDs instead.
bool SplitAvailable(NcclApi& api);

// Whether ncclCommInitRankScalable is usable: compiled in and the loaded
// library is at least 2.23.
bool ScalableInitAvailable(NcclApi& api);

// Whether ncclCommShrink is usable: compiled in and the loaded library is
// at least 2.27.
bool ShrinkAvailable(NcclApi& api);

// Whether NCCL_COMM_SPLIT_SHARE_RESOURCES asks for split children that share
// their parent's resources (set, and not "0"). NCCL lets it override every
// communicator's config; its children then share the parent's abort flag,
// so aborting one aborts the other.
bool SplitSharesResources();

// bool travels as uint8. The dtype must have passed CheckTensor (bfloat16
// needs caps.bfloat16): anything else is a programmer error (checked).
ncclDataType_t ToNcclDataType(DType dtype);

// The reduction must have passed CheckReduceOp (checked).
ncclRedOp_t ToNcclRedOp(ReduceOp op);

// The absl code for an NCCL error: UNAVAILABLE for system and remote errors
// (a peer or the network; retrying at a higher level may work), INVALID_ARGUMENT
// and FAILED_PRECONDITION for argument and usage errors, INTERNAL otherwise.
absl::StatusCode CodeForNcclResult(ncclResult_t result);

// "<what>: <ncclGetErrorString> (<ncclGetLastError>)" with
// CodeForNcclResult's code, except that INTERNAL becomes `internal_as`.
// `comm` may be null. Creating a communicator passes UNAVAILABLE: arguments
// were checked beforehand, so what fails there is the environment (network,
// peers, devices), and retrying the job may help.
absl::Status NcclError(NcclApi& api, absl::string_view what, ncclResult_t result, ncclComm_t comm,
                       absl::StatusCode internal_as = absl::StatusCode::kInternal);

// "<what>: <cudaGetErrorName>: <cudaGetErrorString>", INTERNAL (or
// RESOURCE_EXHAUSTED for an allocation failure). Clears the runtime's
// last-error slot so later calls do not see it again.
absl::Status CudaError(NcclApi& api, absl::string_view what, cudaError_t err);

// Makes `device` current for the calling thread and restores the previous
// device on destruction; cudaSetDevice is only called when they differ, so
// the common case costs one cudaGetDevice.
class DeviceGuard {
 public:
  DeviceGuard(NcclApi& api, int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  // OK, or why `device` could not be made current.
  const absl::Status& status() const { return status_; }

 private:
  NcclApi& api_;
  int previous_ = -1;
  absl::Status status_;
};

// Polls ncclCommGetAsyncError(comm) until it leaves ncclInProgress.
// Returns OK on ncclSuccess; the NCCL error (via NcclError with
// `internal_as`, prefixed with `what`); DEADLINE_EXCEEDED naming `what` when
// `deadline` passes; or the non-OK status `cancelled()` returns (it is asked
// between polls). The communicator is left as it is in every case: the
// caller aborts it.
absl::Status AwaitComm(NcclApi& api, ncclComm_t comm, absl::string_view what, absl::Time deadline,
                       absl::FunctionRef<absl::Status()> cancelled,
                       absl::StatusCode internal_as = absl::StatusCode::kInternal);

// A config for a non-blocking communicator named `name`. NCCL keeps the
// name pointer (not a copy) for the communicator's whole life, so `name`
// must come from PersistentName.
ncclConfig_t NonBlockingConfig(const char* name);

// A copy of `name` that lives until the process exits, interned so that a
// name used again costs nothing more. Group names are few (one per mesh
// dimension and color), so the table stays small.
const char* PersistentName(absl::string_view name);

// Creates a communicator with ncclCommInitRankConfig (non-blocking) on
// `device` and waits for it to come up. `name` is a PersistentName. `what`
// names it in errors, e.g. "group 'world' (rank 3 of 8, cuda:1)". On any
// failure the half-made communicator is aborted; ncclCommAbort joins NCCL's
// init job, so nothing writes to the communicator slot afterwards.
// Possible errors: DEADLINE_EXCEEDED (peers did not arrive by `deadline`),
// UNAVAILABLE/INTERNAL (NCCL failed), the cancellation status, INTERNAL for
// a CUDA error.
absl::StatusOr<ncclComm_t> InitComm(NcclApi& api, const ncclUniqueId& id, int nranks, int rank,
                                    int device, const char* name, absl::string_view what,
                                    absl::Time deadline,
                                    absl::FunctionRef<absl::Status()> cancelled);

// InitComm with ncclCommInitRankScalable and several root unique IDs, in
// the same order on every rank (ScalableInitAvailable must hold). Same
// errors and cleanup.
absl::StatusOr<ncclComm_t> InitCommScalable(NcclApi& api, std::vector<ncclUniqueId> ids, int nranks,
                                            int rank, int device, const char* name,
                                            absl::string_view what, absl::Time deadline,
                                            absl::FunctionRef<absl::Status()> cancelled);

// Reads a `newcomm` slot NCCL's split job may be writing concurrently.
inline ncclComm_t LoadPublished(ncclComm_t* slot) {
  return std::atomic_ref<ncclComm_t>(*slot).load(std::memory_order_acquire);
}

// What waiting for a non-blocking ncclCommSplit found.
struct SplitWait {
  // OK once the child is up and the parent is ready for its next call;
  // else why not.
  absl::Status status;
  // The slot's content when the wait ended: null while NCCL's split job has
  // not published the child (its init may still be running; see the file
  // comment), else the child, which on failure must be aborted.
  ncclComm_t child = nullptr;
};

// Polls after ncclCommSplit(parent, ..., slot, non-blocking config) answered
// ncclSuccess or ncclInProgress, until the child is published in `slot` and
// both its state and the parent's have left ncclInProgress. Each pass asks
// the parent's state (this also lets NCCL complete the split's group job),
// then reads the slot. Fails with the parent's error when the parent reports
// one, the child's error once published, DEADLINE_EXCEEDED (naming whether
// the child had been published) when `deadline` passes, or `cancelled()`'s
// status. A null SplitWait::child with a failure means NCCL may still write
// the slot: the caller must keep it alive and must not abort the parent
// until it has been written. Error codes: `internal_as` for NCCL's internal
// errors, as NcclError.
SplitWait AwaitSplit(NcclApi& api, ncclComm_t parent, ncclComm_t* slot, absl::string_view what,
                     absl::Time deadline, absl::FunctionRef<absl::Status()> cancelled,
                     absl::StatusCode internal_as = absl::StatusCode::kUnavailable);

}  // namespace mesh::nccl
