// Internal entry point of the NCCL factory, for libmesh code that brings its
// own unique-ID broker (e.g. the runtime, over the coordinator's
// PublishUniqueIds/GetUniqueIds instead of its KV store). Defined in every
// build: without NCCL it returns UNIMPLEMENTED.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "backends/nccl/unique_id_broker.h"
#include "mesh/process_group_nccl.h"

namespace mesh::nccl {

// As NcclProcessGroupFactory::Create, with `broker` (may be null) used for
// unique-ID exchange instead of one built over options.store.
absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> CreateNcclFactory(
    NcclProcessGroupFactoryOptions options, std::unique_ptr<NcclUniqueIdBroker> broker);

}  // namespace mesh::nccl
