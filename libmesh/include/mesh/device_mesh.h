// DeviceMesh: an N-dimensional mesh of ranks with one process group per
// dimension, as PyTorch's torch.distributed.device_mesh.DeviceMesh.
//
//   auto mesh = runtime->InitDeviceMesh({2, 4}, {"replicate", "shard"});
//   auto replicate = mesh->GetGroup("replicate");   // {0,4} {1,5} {2,6} {3,7}
//   auto shard = mesh->GetGroup("shard");           // {0,1,2,3} {4,5,6,7}
//   auto tp = (*mesh3d)["tp"];                       // a 1-D sub-mesh
//   auto dp_tp = (*mesh3d)[{"dp", "tp"}]->Flatten(); // a 1-D mesh named "dp_tp"
//
// A DeviceMesh is a MeshLayout (mesh/mesh_layout.h; the geometry) plus the
// calling rank's process group along each dim. The groups are created once,
// when the root mesh is created: one GroupSpec per dim, all passed to ONE
// ProcessGroupFactory::NewGroups call, so a backend can batch its
// connection setup (the NCCL factory publishes and fetches every unique ID
// of the mesh in O(1) coordinator round trips per rank). A dim whose group
// is the whole world in rank order (a 1-D mesh) reuses the factory's world
// group instead of creating another.
//
// Sub-meshes. Slicing (mesh["tp"], mesh[{"dp", "tp"}]) creates no group: the
// sub-mesh shares the root's groups, as PyTorch re-uses its communicators.
// Names must be dims of this mesh, in mesh order. Flatten() is the only call
// after creation that may create a group: it merges all dims of a (sub-)mesh
// into one (PyTorch's _flatten) and registers the result with the root mesh,
// so the root can later be sliced by the flattened name (root["dp_tp"]) and
// flattening again returns the same group.
//
// Collective calls. Create/Init and Flatten are collective: every rank of
// the factory's world makes them, in the same order, with the same
// arguments (Flatten on the sub-mesh through itself). Everything else is
// local.
//
// Group families are named "<options.name>/<dim name>", so two meshes built
// on one factory need different DeviceMeshOptions::name values (Runtime
// numbers its meshes for you).
//
// Value semantics: copies are cheap and share the root's state (groups and
// flattened dims). The ProcessGroups are shared with whoever holds them.
//
// Errors: INVALID_ARGUMENT for bad shapes, names and dims (see MeshLayout),
// and the factory's errors from the collective calls.
// Thread safety: const methods are thread-safe; Flatten is thread-safe but,
// being collective, must be issued in the same order on every rank.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "mesh/mesh_layout.h"
#include "mesh/process_group.h"

namespace mesh {

struct DeviceMeshOptions {
  // Prefix of the group families this mesh creates; unique among the meshes
  // made with one factory.
  std::string name = "mesh";
  // The layout may hold only some of the factory's world ranks
  // (MeshLayout::FromMembers), and Create and Flatten are collective among
  // the layout's ranks alone: groups come from
  // ProcessGroupFactory::NewGroupsAmongMembers, and no dim reuses the world
  // group. In-place recovery builds its mesh of the live ranks this way
  // (mesh/elastic_mesh.h); `name` must then be new to every caller.
  bool members_only = false;
  // With members_only, optional: a group over all of the layout's ranks,
  // in layout order. A dim (or a flattening) whose group is exactly that
  // uses it instead of making another, as a full mesh uses the world group.
  std::shared_ptr<ProcessGroup> members_group = nullptr;
  // With members_only, optional: a membership of exactly the layout's ranks
  // (ProcessGroupFactory::NewMembership). The groups then come from
  // NewGroupsWithin, which NCCL splits from the membership's communicator
  // rather than initializing each from a brokered unique ID; Create and
  // Flatten are then collective among all of them, as they are anyway.
  std::shared_ptr<Membership> membership = nullptr;
};

class DeviceMesh {
 public:
  // Collective. Creates the groups of `layout` for the calling rank
  // (factory->world_rank()).
  // Possible errors: INVALID_ARGUMENT when the layout's size is not the
  // factory's world size (with members_only: when it holds a rank outside
  // the world, or not the calling rank) or the name is empty; the
  // factory's NewGroups (NewGroupsAmongMembers) and World errors.
  static absl::StatusOr<DeviceMesh> Create(std::shared_ptr<ProcessGroupFactory> factory,
                                           MeshLayout layout, DeviceMeshOptions options = {});

  // Collective; init_device_mesh: the factory's world laid out row-major
  // over `shape`. `dim_names` empty means "dim0", "dim1", ...
  // Possible errors: those of MeshLayout::Create and Create.
  static absl::StatusOr<DeviceMesh> Init(std::shared_ptr<ProcessGroupFactory> factory,
                                         std::vector<int64_t> shape,
                                         std::vector<std::string> dim_names = {},
                                         DeviceMeshOptions options = {});

  // The calling process's world rank.
  int rank() const;
  int ndim() const { return layout_.ndim(); }
  const std::vector<int64_t>& shape() const { return layout_.shape(); }
  const std::vector<std::string>& dim_names() const { return layout_.dim_names(); }
  // Number of ranks in this (sub-)mesh.
  int size() const { return layout_.size(); }
  // Size of one dim; the int form aborts unless 0 <= dim < ndim().
  int64_t Size(int dim) const { return layout_.Size(dim); }
  absl::StatusOr<int64_t> Size(absl::string_view dim) const;
  // This mesh's geometry: its ranks, and the groups of every other rank.
  const MeshLayout& layout() const { return layout_; }

  // The calling rank's group along `dim`. INVALID_ARGUMENT for an unknown
  // name or an index outside [0, ndim()).
  absl::StatusOr<std::shared_ptr<ProcessGroup>> GetGroup(absl::string_view dim) const;
  absl::StatusOr<std::shared_ptr<ProcessGroup>> GetGroup(int dim) const;
  // The only group of a 1-D mesh; INVALID_ARGUMENT for more dims.
  absl::StatusOr<std::shared_ptr<ProcessGroup>> GetGroup() const;
  // One group per dim, in dim order.
  std::vector<std::shared_ptr<ProcessGroup>> GetAllGroups() const;

  // The calling rank's coordinate along `dim`, which is also its rank in
  // GetGroup(dim). INVALID_ARGUMENT as GetGroup.
  absl::StatusOr<int> GetLocalRank(absl::string_view dim) const;
  absl::StatusOr<int> GetLocalRank(int dim) const;
  // The calling rank's coordinate, one entry per dim.
  const std::vector<int64_t>& GetCoordinate() const { return coordinate_; }

  // The sub-mesh of the named dims through the calling rank; no group is
  // created. Names may also be flattened dims registered with the root, as
  // long as they cover whole dims of this mesh. Possible errors
  // (INVALID_ARGUMENT): an unknown name, names out of mesh order or
  // overlapping, a name that would split one of this mesh's dims, no names.
  absl::StatusOr<DeviceMesh> operator[](absl::string_view dim) const;
  absl::StatusOr<DeviceMesh> operator[](std::initializer_list<absl::string_view> dims) const;
  absl::StatusOr<DeviceMesh> Slice(absl::Span<const std::string> dims) const;

  // Collective (see above). A 1-D mesh over all of this mesh's ranks, whose
  // one dim is named `name`, or this mesh's dim names joined by "_". The
  // group is created on the first call for these dims and cached in the
  // root; later calls (any name) reuse it.
  // Possible errors: INVALID_ARGUMENT when `name` is a dim of the root mesh
  // other than this mesh's only dim, or already names a flattening of other
  // dims; the factory's NewGroups errors.
  absl::StatusOr<DeviceMesh> Flatten(absl::string_view name = "") const;

  // "DeviceMesh(shape=(2, 4), dim_names=(dp, tp), rank=5, coordinate=(1, 1))".
  std::string DebugString() const;

 private:
  struct Root;
  // A dim of this (sub-)mesh: the root dims it spans (one, or several when
  // flattened; strictly increasing) and the calling rank's group along them.
  struct Dim {
    std::string name;
    std::vector<int> root_dims;
    std::shared_ptr<ProcessGroup> group;
  };

  // A view of `root` with `dims`, whose root dims must increase across dims.
  static absl::StatusOr<DeviceMesh> MakeView(std::shared_ptr<Root> root, std::vector<Dim> dims);
  DeviceMesh(std::shared_ptr<Root> root, std::vector<Dim> dims, MeshLayout layout,
             std::vector<int64_t> coordinate);

  absl::StatusOr<int> ResolveDim(absl::string_view dim) const;
  absl::StatusOr<int> CheckDim(int dim) const;

  std::shared_ptr<Root> root_;
  std::vector<Dim> dims_;
  MeshLayout layout_;
  std::vector<int64_t> coordinate_;
};

}  // namespace mesh
