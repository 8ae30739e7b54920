// Internal entry point of the NCCL factory, for libmesh code that brings its
// own unique-ID broker (e.g. the runtime, over the coordinator's
// PublishUniqueIds/GetUniqueIds instead of its KV store). Defined in every
// build: without NCCL it returns UNIMPLEMENTED.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "backends/nccl/unique_id_broker.h"
#include "mesh/process_group_nccl.h"

namespace mesh::nccl {

class NcclApi;  // backends/nccl/nccl_api.h

// The broker key of root `root`'s unique ID in a scalable world init
// (NcclWorldInit): "nccl/world-root/<root>", root >= 1.
std::string WorldRootKey(int root);

// As NcclProcessGroupFactory::Create, with `broker` (may be null) used for
// unique-ID exchange instead of one built over options.store.
absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> CreateNcclFactory(
    NcclProcessGroupFactoryOptions options, std::unique_ptr<NcclUniqueIdBroker> broker);

// The same over `api` instead of the real libraries (tests drive the
// factory and its groups through a scripted fake this way). `api` must
// outlive the factory and every group it makes. Defined only when
// MESH_HAVE_NCCL.
absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> CreateNcclFactory(
    NcclProcessGroupFactoryOptions options, std::unique_ptr<NcclUniqueIdBroker> broker,
    NcclApi& api);

}  // namespace mesh::nccl
