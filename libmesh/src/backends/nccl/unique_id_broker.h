// NCCL unique-ID brokering for process groups that are not split from the
// world communicator. Private to libmesh.
//
// When ncclCommSplit cannot be used, each group needs its own ncclUniqueId:
// the group's first member generates it and every other member fetches it.
// Done naively that is one round trip per group per rank; ExchangeUniqueIds
// instead batches a whole NewGroups call into at most ONE Publish and ONE
// Get per rank, however many families the mesh has:
//
//   rank r:  ids it leads  ──Publish({key: id, ...})──▶ broker
//            ids it needs  ◀──Get({key, ...}, deadline)──  (blocks until all are there)
//
// The broker is an interface so the transport can change: StoreUniqueIdBroker
// goes over any mesh::Store (one MultiSet + one MultiGet), and a coordinator
// client can implement it over WorkerService.PublishUniqueIds/GetUniqueIds.
//
// Thread safety: NcclUniqueIdBroker implementations are thread-safe;
// ExchangeUniqueIds is reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "mesh/process_group.h"
#include "mesh/store.h"

namespace mesh::nccl {

// sizeof(ncclUniqueId), fixed by NCCL's ABI (NCCL_UNIQUE_ID_BYTES).
inline constexpr size_t kUniqueIdBytes = 128;

class NcclUniqueIdBroker {
 public:
  virtual ~NcclUniqueIdBroker() = default;

  // Publishes every (key, id) pair in one round trip. An empty list makes no
  // round trip.
  // Possible errors: INVALID_ARGUMENT for an id that is not kUniqueIdBytes
  // long (nothing is published then); the transport's errors.
  virtual absl::Status Publish(absl::Span<const std::pair<std::string, std::string>> ids) = 0;

  // Returns the ids of `keys`, in order, in one round trip that blocks until
  // all are published or `deadline` passes. An empty list makes no round
  // trip.
  // Possible errors: DEADLINE_EXCEEDED naming the missing keys; DATA_LOSS
  // for a published value that is not kUniqueIdBytes long; the transport's
  // errors.
  virtual absl::StatusOr<std::vector<std::string>> Get(absl::Span<const std::string> keys,
                                                       absl::Time deadline) = 0;
};

// A broker over a mesh::Store: Publish is one MultiSet, Get one MultiGet.
// Keys are used as given; scope them with a PrefixStore if the store is
// shared.
class StoreUniqueIdBroker final : public NcclUniqueIdBroker {
 public:
  // `store` must not be null.
  explicit StoreUniqueIdBroker(std::shared_ptr<Store> store);

  absl::Status Publish(absl::Span<const std::pair<std::string, std::string>> ids) override;
  absl::StatusOr<std::vector<std::string>> Get(absl::Span<const std::string> keys,
                                               absl::Time deadline) override;

 private:
  const std::shared_ptr<Store> store_;
};

// A broker over two callables, for transports that are not a mesh::Store,
// e.g. the coordinator's PublishUniqueIds/GetUniqueIds RPCs:
//
//   CallbackUniqueIdBroker broker(
//       [client](auto ids) { return client->PublishUniqueIds(ids, kRpcTimeout); },
//       [client](auto keys, absl::Time deadline) {
//         return client->GetUniqueIds(keys, deadline - absl::Now());
//       });
//
// It adds the contract's checks around them: empty batches make no call, ids
// must be kUniqueIdBytes long both ways, and `get` must return one id per
// key (INTERNAL otherwise).
class CallbackUniqueIdBroker final : public NcclUniqueIdBroker {
 public:
  using PublishFn =
      std::function<absl::Status(absl::Span<const std::pair<std::string, std::string>>)>;
  using GetFn = std::function<absl::StatusOr<std::vector<std::string>>(
      absl::Span<const std::string>, absl::Time)>;

  // Both must be callable (checked).
  CallbackUniqueIdBroker(PublishFn publish, GetFn get);

  absl::Status Publish(absl::Span<const std::pair<std::string, std::string>> ids) override;
  absl::StatusOr<std::vector<std::string>> Get(absl::Span<const std::string> keys,
                                               absl::Time deadline) override;

 private:
  const PublishFn publish_;
  const GetFn get_;
};

// The broker key of `spec`'s group in the `call`-th NewGroups call of a
// factory: "nccl/uid/<call>/<family>/<color>". The call number keeps keys of
// a family that is created twice apart, since every rank makes the same
// NewGroups calls in the same order.
// For NewGroupsAmongMembers, whose callers may have made different numbers
// of calls before, `call` is kMembersOnlyCall and the key is
// "nccl/uid/members/<family>/<color>": such families are new to every
// caller (process_group.h).
inline constexpr uint64_t kMembersOnlyCall = ~uint64_t{0};
std::string UniqueIdKey(uint64_t call, const GroupSpec& spec);

// Returns one ncclUniqueId per spec (in spec order) for the calling rank:
//   * a group of one member gets a fresh `generate()` id, never brokered;
//   * a group this rank leads (global_ranks[0] == world_rank) gets a fresh
//     id, and all of those are published in one Publish;
//   * every other group's id comes from one Get with `deadline`.
// The specs must have passed CheckGroupSpecs.
// Possible errors: those of `generate`, Publish and Get, prefixed with the
// rank and the call.
absl::StatusOr<std::vector<std::string>> ExchangeUniqueIds(
    absl::Span<const GroupSpec> specs, int world_rank, uint64_t call, NcclUniqueIdBroker& broker,
    absl::FunctionRef<absl::StatusOr<std::string>()> generate, absl::Time deadline);

}  // namespace mesh::nccl
