// The NCCL entry points of a build without NCCL (MESH_HAVE_NCCL off): every
// one reports UNIMPLEMENTED, so callers can test for the backend at run
// time instead of with the preprocessor.
#include "absl/strings/str_cat.h"
#include "backends/nccl/nccl_factory.h"
#include "mesh/process_group_nccl.h"

namespace mesh {
namespace {

absl::Status NoNccl(absl::string_view what) {
  return absl::UnimplementedError(
      absl::StrCat(what,
                   ": this libmesh was built without NCCL (MESH_WITH_CUDA=OFF, or CUDA/NCCL "
                   "not found at configure time)"));
}

}  // namespace

namespace nccl {

absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> CreateNcclFactory(
    NcclProcessGroupFactoryOptions, std::unique_ptr<NcclUniqueIdBroker>) {
  return NoNccl("NcclProcessGroupFactory::Create");
}

}  // namespace nccl

absl::StatusOr<std::string> GenerateNcclUniqueId() { return NoNccl("GenerateNcclUniqueId"); }

absl::StatusOr<std::unique_ptr<NcclProcessGroupFactory>> NcclProcessGroupFactory::Create(
    NcclProcessGroupFactoryOptions options) {
  return nccl::CreateNcclFactory(std::move(options), nullptr);
}

}  // namespace mesh
