// gRPC adapter for mesh.v1.WorkerService over Coordination (callback API).
//
// Converts protos to Coordination calls and absl::Status to grpc::Status;
// holds no state of its own. Waiting calls hand their reactor to a
// Coordination callback and return at once, so no thread blocks per waiting
// call. The effective timeout of a wait is the smaller of the request's
// timeout_seconds and the client's gRPC deadline.
#pragma once

#include "coordinator/auth_grpc.h"
#include "coordinator/coordination.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace mesh::coordinator {

// Thread safety: thread-safe.
class WorkerServiceImpl final : public mesh::v1::WorkerService::CallbackService {
 public:
  // `coordination` must outlive this service and every call it started:
  // shut it down (which ends every wait) before the gRPC server.
  // `authz` decides who may touch which job (coordinator/auth_grpc.h).
  WorkerServiceImpl(Coordination* coordination, const CallAuthorizer* authz)
      : coordination_(coordination), authz_(authz) {}

  using Ctx = grpc::CallbackServerContext;
  using Unary = grpc::ServerUnaryReactor;

  Unary* Join(Ctx*, const mesh::v1::JoinRequest*, mesh::v1::JoinResponse*) override;
  Unary* DescribeRanks(Ctx*, const mesh::v1::DescribeRanksRequest*,
                       mesh::v1::DescribeRanksResponse*) override;
  Unary* KvSet(Ctx*, const mesh::v1::KvSetRequest*, mesh::v1::KvSetResponse*) override;
  Unary* KvGet(Ctx*, const mesh::v1::KvGetRequest*, mesh::v1::KvGetResponse*) override;
  Unary* KvAdd(Ctx*, const mesh::v1::KvAddRequest*, mesh::v1::KvAddResponse*) override;
  Unary* KvCompareSet(Ctx*, const mesh::v1::KvCompareSetRequest*,
                      mesh::v1::KvCompareSetResponse*) override;
  Unary* KvDelete(Ctx*, const mesh::v1::KvDeleteRequest*, mesh::v1::KvDeleteResponse*) override;
  Unary* KvList(Ctx*, const mesh::v1::KvListRequest*, mesh::v1::KvListResponse*) override;
  Unary* KvNumKeys(Ctx*, const mesh::v1::KvNumKeysRequest*, mesh::v1::KvNumKeysResponse*) override;
  Unary* KvWait(Ctx*, const mesh::v1::KvWaitRequest*, mesh::v1::KvWaitResponse*) override;
  Unary* KvMultiGet(Ctx*, const mesh::v1::KvMultiGetRequest*,
                    mesh::v1::KvMultiGetResponse*) override;
  Unary* KvMultiSet(Ctx*, const mesh::v1::KvMultiSetRequest*,
                    mesh::v1::KvMultiSetResponse*) override;
  Unary* Barrier(Ctx*, const mesh::v1::BarrierRequest*, mesh::v1::BarrierResponse*) override;
  Unary* AliveRanks(Ctx*, const mesh::v1::AliveRanksRequest*,
                    mesh::v1::AliveRanksResponse*) override;
  Unary* PublishUniqueIds(Ctx*, const mesh::v1::PublishUniqueIdsRequest*,
                          mesh::v1::PublishUniqueIdsResponse*) override;
  Unary* GetUniqueIds(Ctx*, const mesh::v1::GetUniqueIdsRequest*,
                      mesh::v1::GetUniqueIdsResponse*) override;
  Unary* Heartbeat(Ctx*, const mesh::v1::HeartbeatRequest*, mesh::v1::HeartbeatResponse*) override;
  Unary* ReportError(Ctx*, const mesh::v1::ReportErrorRequest*,
                     mesh::v1::ReportErrorResponse*) override;
  Unary* Leave(Ctx*, const mesh::v1::LeaveRequest*, mesh::v1::LeaveResponse*) override;
  grpc::ServerWriteReactor<mesh::v1::JobEvent>* WatchJob(Ctx*,
                                                         const mesh::v1::WatchJobRequest*) override;
  // Node-level batches (an agent's rank relay): each entry is handled as
  // its own call would be, with its outcome in the reply's entry.
  Unary* JoinBatch(Ctx*, const mesh::v1::JoinBatchRequest*, mesh::v1::JoinBatchResponse*) override;
  Unary* BarrierBatch(Ctx*, const mesh::v1::BarrierBatchRequest*,
                      mesh::v1::BarrierBatchResponse*) override;
  Unary* HeartbeatBatch(Ctx*, const mesh::v1::HeartbeatBatchRequest*,
                        mesh::v1::HeartbeatBatchResponse*) override;

 private:
  Coordination* const coordination_;
  const CallAuthorizer* const authz_;
};

}  // namespace mesh::coordinator
