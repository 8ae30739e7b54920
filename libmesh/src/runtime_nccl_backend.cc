// The Runtime's NCCL backend: wires GenerateNcclUniqueId into Join and the
// coordinator's unique-ID broker into the NCCL factory.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/nccl/nccl_factory.h"
#include "backends/nccl/unique_id_broker.h"
#include "coordinator_client.h"
#include "mesh/build_info.h"
#include "mesh/runtime.h"

namespace mesh {

int NcclDefaultDeviceIndex(int local_rank, int local_world_size, int visible_devices) {
  if (local_rank > 0 && visible_devices >= std::max(local_world_size, local_rank + 1)) {
    return local_rank;
  }
  return 0;
}

RuntimeBackend NcclBackend(NcclBackendOptions options) {
  RuntimeBackend backend;
  backend.name = "nccl";
  backend.make_world_unique_id = [] { return GenerateNcclUniqueId(); };
  backend.make_factory =
      [options](
          const BackendContext& context) -> absl::StatusOr<std::shared_ptr<ProcessGroupFactory>> {
    if (context.join.world_unique_id.empty()) {
      return absl::FailedPreconditionError(
          "NCCL backend: the join reply carries no world unique ID (rank 0 did not use the NCCL "
          "backend?)");
    }
    NcclProcessGroupFactoryOptions nccl;
    nccl.world_rank = context.join.rank;
    nccl.world_size = context.join.world_size;
    nccl.device = Device::Cuda(options.device_index.value_or(NcclDefaultDeviceIndex(
        context.join.local_rank, context.join.local_world_size, CudaDeviceCount())));
    nccl.world_unique_id = context.join.world_unique_id;
    nccl.group_options = context.group_options;
    nccl.init_timeout = options.init_timeout;
    nccl.world_init = options.world_init;
    nccl.ranks_per_root = options.ranks_per_root;
    nccl.group_creation = options.group_creation;
    nccl.stream_mode = options.stream_mode;
    nccl.store = context.store;

    // Per-group IDs go through the coordinator's typed broker, which checks
    // their size and scopes them to this generation.
    std::shared_ptr<internal::CoordinatorClient> client = context.coordinator;
    auto broker = std::make_unique<nccl::CallbackUniqueIdBroker>(
        [client](absl::Span<const std::pair<std::string, std::string>> ids) {
          return client->PublishUniqueIds(ids, absl::Minutes(1));
        },
        [client](absl::Span<const std::string> keys, absl::Time deadline) {
          return client->GetUniqueIds(keys,
                                      std::max(deadline - absl::Now(), absl::Milliseconds(1)));
        });
    absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> factory =
        nccl::CreateNcclFactory(std::move(nccl), client ? std::move(broker) : nullptr);
    if (!factory.ok()) return factory.status();
    return std::shared_ptr<ProcessGroupFactory>(*std::move(factory));
  };
  return backend;
}

}  // namespace mesh
