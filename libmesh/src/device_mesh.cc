#include "mesh/device_mesh.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/check.h"

namespace mesh {

// State shared by a root mesh and every sub-mesh and flattened mesh made
// from it.
struct DeviceMesh::Root {
  Root(std::shared_ptr<ProcessGroupFactory> factory, MeshLayout layout, std::string name,
       bool members_only, std::shared_ptr<ProcessGroup> members_group,
       std::shared_ptr<Membership> membership)
      : factory(std::move(factory)),
        layout(std::move(layout)),
        name(std::move(name)),
        members_only(members_only),
        members_group(std::move(members_group)),
        membership(std::move(membership)),
        rank(this->factory->world_rank()) {}

  // The groups of `specs`, from the factory call the options ask for.
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> NewGroups(
      const std::vector<GroupSpec>& specs) const {
    if (membership != nullptr) return factory->NewGroupsWithin(*membership, specs);
    return members_only ? factory->NewGroupsAmongMembers(specs) : factory->NewGroups(specs);
  }

  const std::shared_ptr<ProcessGroupFactory> factory;
  const MeshLayout layout;
  const std::string name;
  const bool members_only;  // DeviceMeshOptions::members_only
  // DeviceMeshOptions::members_group; may be null.
  const std::shared_ptr<ProcessGroup> members_group;
  // DeviceMeshOptions::membership; may be null.
  const std::shared_ptr<Membership> membership;
  const int rank;
  // The calling rank's group along each root dim. Written once by Create
  // before the Root is shared, read-only afterwards.
  std::vector<std::shared_ptr<ProcessGroup>> dim_groups;

  // Serializes Flatten, which is collective and may block in NewGroups; held
  // across that call so that two threads cannot create the same group twice.
  absl::Mutex flatten_mu ABSL_ACQUIRED_BEFORE(mu);
  absl::Mutex mu;
  // Flattened dim name -> the root dims it merges.
  std::map<std::string, std::vector<int>, std::less<>> flattened_names ABSL_GUARDED_BY(mu);
  // Root dims -> the calling rank's group along them.
  std::map<std::vector<int>, std::shared_ptr<ProcessGroup>> flattened_groups ABSL_GUARDED_BY(mu);
};

namespace {

bool IsWorldInOrder(const std::vector<int>& ranks, int world_size) {
  if (static_cast<int>(ranks.size()) != world_size) return false;
  for (int i = 0; i < world_size; ++i) {
    if (ranks[i] != i) return false;
  }
  return true;
}

// The factory returned what was asked for: one group per spec, each with the
// spec's members and the caller at the right position. Anything else is a
// backend bug that would otherwise surface as a hang or wrong results.
absl::Status CheckGroup(const ProcessGroup* group, const GroupSpec& spec, int world_rank) {
  if (group == nullptr) {
    return absl::InternalError(absl::StrCat("process group factory returned no group for '",
                                            spec.family, "' color ", spec.color));
  }
  int expected_rank = -1;
  for (size_t i = 0; i < spec.global_ranks.size(); ++i) {
    if (spec.global_ranks[i] == world_rank) expected_rank = static_cast<int>(i);
  }
  if (group->global_ranks() != spec.global_ranks || group->rank() != expected_rank) {
    return absl::InternalError(
        absl::StrCat("process group factory returned group '", group->name(), "' with members [",
                     absl::StrJoin(group->global_ranks(), ", "), "] and rank ", group->rank(),
                     "; asked for family '", spec.family, "' members [",
                     absl::StrJoin(spec.global_ranks, ", "), "] with rank ", expected_rank));
  }
  return absl::OkStatus();
}

// The calling rank's group along `dims` of `layout`: the factory's world
// group when that is what the dims span, else one made from `family`.
// `new_groups` is Root::NewGroups.
using NewGroupsFn = absl::FunctionRef<absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>>(
    const std::vector<GroupSpec>&)>;
absl::StatusOr<std::shared_ptr<ProcessGroup>> MakeGroup(
    ProcessGroupFactory& factory, const MeshLayout& layout, absl::Span<const int> dims,
    const std::string& family, int rank, bool members_only,
    const std::shared_ptr<ProcessGroup>& members_group, NewGroupsFn new_groups) {
  absl::StatusOr<MeshGroup> members = layout.GroupOf(dims, rank);
  if (!members.ok()) return members.status();
  if (!members_only && IsWorldInOrder(members->ranks, factory.world_size())) {
    return factory.World();
  }
  if (members_group != nullptr && members->ranks == layout.ranks()) return members_group;
  GroupSpec spec{family, members->color, std::move(members->ranks)};
  absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> groups = new_groups({spec});
  if (!groups.ok()) return groups.status();
  if (groups->size() != 1) {
    return absl::InternalError(
        absl::StrCat("process group factory returned ", groups->size(), " groups for 1 spec"));
  }
  if (absl::Status s = CheckGroup((*groups)[0].get(), spec, rank); !s.ok()) return s;
  return (*groups)[0];
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<Root> root, std::vector<Dim> dims, MeshLayout layout,
                       std::vector<int64_t> coordinate)
    : root_(std::move(root)),
      dims_(std::move(dims)),
      layout_(std::move(layout)),
      coordinate_(std::move(coordinate)) {}

absl::StatusOr<DeviceMesh> DeviceMesh::Create(std::shared_ptr<ProcessGroupFactory> factory,
                                              MeshLayout layout, DeviceMeshOptions options) {
  MESH_CHECK(factory != nullptr, "DeviceMesh::Create needs a process group factory");
  if (options.name.empty()) return absl::InvalidArgumentError("DeviceMesh name must not be empty");
  const int world_size = factory->world_size();
  const int rank = factory->world_rank();
  if (!options.members_only && layout.size() != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(layout.DebugString(), " holds ", layout.size(),
                                                   " ranks but the world has ", world_size));
  }
  for (int r : layout.ranks()) {
    // Distinct ranks by construction, so in range means a permutation.
    if (r >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat(layout.DebugString(), " holds rank ", r,
                                                     ", outside a world of ", world_size));
    }
  }
  if (options.members_only && !layout.Contains(rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat(layout.DebugString(), " does not hold the calling rank ", rank));
  }
  if (options.members_group != nullptr &&
      (!options.members_only || options.members_group->global_ranks() != layout.ranks())) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceMesh members_group '", options.members_group->name(), "' (members [",
                     absl::StrJoin(options.members_group->global_ranks(), ", "),
                     "]) needs members_only and must hold the layout's ranks in layout order"));
  }

  if (options.membership != nullptr) {
    std::vector<int> sorted = layout.ranks();
    std::sort(sorted.begin(), sorted.end());
    if (!options.members_only || options.membership->ranks() != sorted) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeviceMesh membership '", options.membership->family(), "' (ranks [",
                       absl::StrJoin(options.membership->ranks(), ", "),
                       "]) needs members_only and must hold exactly the layout's ranks"));
    }
  }

  auto root =
      std::make_shared<Root>(std::move(factory), std::move(layout), options.name,
                             options.members_only, options.members_group, options.membership);
  const MeshLayout& root_layout = root->layout;
  root->dim_groups.resize(root_layout.ndim());
  // Every dim's group in one NewGroups call (see the header); dims that span
  // the world in order use the world group instead.
  std::vector<GroupSpec> specs;
  std::vector<int> spec_dims;
  for (int d = 0; d < root_layout.ndim(); ++d) {
    absl::StatusOr<MeshGroup> members = root_layout.GroupOf({d}, rank);
    if (!members.ok()) return members.status();
    if (!options.members_only && IsWorldInOrder(members->ranks, world_size)) {
      absl::StatusOr<std::shared_ptr<ProcessGroup>> world = root->factory->World();
      if (!world.ok()) return world.status();
      root->dim_groups[d] = *std::move(world);
      continue;
    }
    if (root->members_group != nullptr && members->ranks == root_layout.ranks()) {
      root->dim_groups[d] = root->members_group;
      continue;
    }
    specs.push_back(GroupSpec{absl::StrCat(options.name, "/", root_layout.dim_names()[d]),
                              members->color, std::move(members->ranks)});
    spec_dims.push_back(d);
  }
  if (!specs.empty()) {
    absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> groups = root->NewGroups(specs);
    if (!groups.ok()) return groups.status();
    if (groups->size() != specs.size()) {
      return absl::InternalError(absl::StrCat("process group factory returned ", groups->size(),
                                              " groups for ", specs.size(), " specs"));
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      if (absl::Status s = CheckGroup((*groups)[i].get(), specs[i], rank); !s.ok()) return s;
      root->dim_groups[spec_dims[i]] = std::move((*groups)[i]);
    }
  }

  std::vector<Dim> dims;
  for (int d = 0; d < root_layout.ndim(); ++d) {
    dims.push_back(Dim{root_layout.dim_names()[d], {d}, root->dim_groups[d]});
  }
  return MakeView(std::move(root), std::move(dims));
}

absl::StatusOr<DeviceMesh> DeviceMesh::Init(std::shared_ptr<ProcessGroupFactory> factory,
                                            std::vector<int64_t> shape,
                                            std::vector<std::string> dim_names,
                                            DeviceMeshOptions options) {
  MESH_CHECK(factory != nullptr, "DeviceMesh::Init needs a process group factory");
  absl::StatusOr<MeshLayout> layout =
      MeshLayout::Create(std::move(shape), std::move(dim_names), factory->world_size());
  if (!layout.ok()) return layout.status();
  return Create(std::move(factory), *std::move(layout), std::move(options));
}

absl::StatusOr<DeviceMesh> DeviceMesh::MakeView(std::shared_ptr<Root> root, std::vector<Dim> dims) {
  std::vector<int> all_dims;
  for (const Dim& dim : dims) {
    all_dims.insert(all_dims.end(), dim.root_dims.begin(), dim.root_dims.end());
  }
  absl::StatusOr<MeshLayout> layout = root->layout.Slice(all_dims, root->rank);
  if (!layout.ok()) return layout.status();
  // The slice keeps the root's dim names; merge and rename where a dim is a
  // flattening. Its root dims are adjacent in the slice, since root dims
  // increase across `dims`.
  for (const Dim& dim : dims) {
    if (dim.root_dims.size() == 1 && root->layout.dim_names()[dim.root_dims[0]] == dim.name) {
      continue;
    }
    std::vector<std::string> names;
    for (int d : dim.root_dims) names.push_back(root->layout.dim_names()[d]);
    layout = layout->Flatten(names, dim.name);
    if (!layout.ok()) return layout.status();
  }
  absl::StatusOr<std::vector<int64_t>> coordinate = layout->Coordinate(root->rank);
  if (!coordinate.ok()) return coordinate.status();
  for (size_t i = 0; i < dims.size(); ++i) {
    MESH_CHECK(dims[i].group->rank() == (*coordinate)[i] &&
                   dims[i].group->size() == layout->Size(static_cast<int>(i)),
               "DeviceMesh: group does not match the layout");
  }
  return DeviceMesh(std::move(root), std::move(dims), *std::move(layout), *std::move(coordinate));
}

int DeviceMesh::rank() const { return root_->rank; }

absl::StatusOr<int> DeviceMesh::ResolveDim(absl::string_view dim) const {
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i].name == dim) return static_cast<int>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "device mesh has no dim '", dim, "'; its dims are (", absl::StrJoin(dim_names(), ", "), ")"));
}

absl::StatusOr<int> DeviceMesh::CheckDim(int dim) const {
  if (dim < 0 || dim >= ndim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device mesh dim ", dim, " is out of range: the mesh has ", ndim(), " dims (",
                     absl::StrJoin(dim_names(), ", "), ")"));
  }
  return dim;
}

absl::StatusOr<int64_t> DeviceMesh::Size(absl::string_view dim) const {
  absl::StatusOr<int> d = ResolveDim(dim);
  if (!d.ok()) return d.status();
  return layout_.Size(*d);
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> DeviceMesh::GetGroup(absl::string_view dim) const {
  absl::StatusOr<int> d = ResolveDim(dim);
  if (!d.ok()) return d.status();
  return dims_[*d].group;
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> DeviceMesh::GetGroup(int dim) const {
  absl::StatusOr<int> d = CheckDim(dim);
  if (!d.ok()) return d.status();
  return dims_[*d].group;
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> DeviceMesh::GetGroup() const {
  if (ndim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GetGroup() without a dim needs a 1-D mesh; this one has ", ndim(), " dims (",
                     absl::StrJoin(dim_names(), ", "), ")"));
  }
  return dims_[0].group;
}

std::vector<std::shared_ptr<ProcessGroup>> DeviceMesh::GetAllGroups() const {
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  groups.reserve(dims_.size());
  for (const Dim& dim : dims_) groups.push_back(dim.group);
  return groups;
}

absl::StatusOr<int> DeviceMesh::GetLocalRank(absl::string_view dim) const {
  absl::StatusOr<int> d = ResolveDim(dim);
  if (!d.ok()) return d.status();
  return static_cast<int>(coordinate_[*d]);
}

absl::StatusOr<int> DeviceMesh::GetLocalRank(int dim) const {
  absl::StatusOr<int> d = CheckDim(dim);
  if (!d.ok()) return d.status();
  return static_cast<int>(coordinate_[*d]);
}

absl::StatusOr<DeviceMesh> DeviceMesh::operator[](absl::string_view dim) const {
  const std::string name(dim);
  return Slice(absl::MakeConstSpan(&name, 1));
}

absl::StatusOr<DeviceMesh> DeviceMesh::operator[](
    std::initializer_list<absl::string_view> dims) const {
  std::vector<std::string> names(dims.begin(), dims.end());
  return Slice(names);
}

absl::StatusOr<DeviceMesh> DeviceMesh::Slice(absl::Span<const std::string> names) const {
  if (names.empty()) return absl::InvalidArgumentError("no device mesh dims to slice");
  std::vector<Dim> out;
  for (const std::string& name : names) {
    if (absl::StatusOr<int> d = ResolveDim(name); d.ok()) {
      out.push_back(dims_[*d]);
      continue;
    }
    // A flattened dim registered with the root, if it covers whole dims of
    // this mesh: consecutive dims whose root dims concatenate to its own.
    absl::MutexLock lock(&root_->mu);
    auto it = root_->flattened_names.find(name);
    if (it == root_->flattened_names.end()) {
      std::string flattened;
      for (const auto& [flat_name, unused] : root_->flattened_names) {
        absl::StrAppend(&flattened, flattened.empty() ? "" : ", ", flat_name);
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "device mesh has no dim '", name, "'; its dims are (", absl::StrJoin(dim_names(), ", "),
          ")",
          flattened.empty() ? ""
                            : absl::StrCat(" and its root's flattened dims (", flattened, ")")));
    }
    const std::vector<int>& root_dims = it->second;
    bool covered = false;
    for (size_t first = 0; first < dims_.size() && !covered; ++first) {
      std::vector<int> concat;
      for (size_t last = first; last < dims_.size() && concat.size() < root_dims.size(); ++last) {
        concat.insert(concat.end(), dims_[last].root_dims.begin(), dims_[last].root_dims.end());
        if (concat == root_dims) covered = true;
      }
    }
    if (!covered) {
      return absl::InvalidArgumentError(absl::StrCat("flattened dim '", name,
                                                     "' does not cover whole dims of this mesh (",
                                                     absl::StrJoin(dim_names(), ", "), ")"));
    }
    out.push_back(Dim{name, root_dims, root_->flattened_groups.at(root_dims)});
  }
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i].root_dims.front() <= out[i - 1].root_dims.back()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device mesh dims (", absl::StrJoin(names, ", "),
                       ") must be distinct, non-overlapping and in mesh order (",
                       absl::StrJoin(dim_names(), ", "), ")"));
    }
  }
  return MakeView(root_, std::move(out));
}

absl::StatusOr<DeviceMesh> DeviceMesh::Flatten(absl::string_view name) const {
  std::vector<int> root_dims;
  for (const Dim& dim : dims_) {
    root_dims.insert(root_dims.end(), dim.root_dims.begin(), dim.root_dims.end());
  }
  const std::string merged = name.empty() ? absl::StrJoin(dim_names(), "_") : std::string(name);
  if (dims_.size() == 1 && dims_[0].name == merged) return *this;
  const std::vector<std::string>& root_names = root_->layout.dim_names();
  for (int d = 0; d < root_->layout.ndim(); ++d) {
    if (root_names[d] != merged) continue;
    if (root_dims.size() == 1 && root_dims[0] == d) {
      // Flattening a 1-D mesh back to its root dim's own name.
      return MakeView(root_, {Dim{merged, root_dims, root_->dim_groups[d]}});
    }
    return absl::InvalidArgumentError(absl::StrCat("cannot name a flattened dim '", merged,
                                                   "': the root mesh has a dim of that name"));
  }

  absl::MutexLock flatten_lock(&root_->flatten_mu);
  std::shared_ptr<ProcessGroup> group;
  {
    absl::MutexLock lock(&root_->mu);
    auto named = root_->flattened_names.find(merged);
    if (named != root_->flattened_names.end() && named->second != root_dims) {
      std::vector<std::string> other;
      for (int d : named->second) other.push_back(root_names[d]);
      return absl::InvalidArgumentError(absl::StrCat("flattened dim name '", merged,
                                                     "' is already taken by the flattening of (",
                                                     absl::StrJoin(other, ", "), ")"));
    }
    auto cached = root_->flattened_groups.find(root_dims);
    if (cached != root_->flattened_groups.end()) group = cached->second;
  }
  if (group == nullptr) {
    if (root_dims.size() == 1) {
      group = root_->dim_groups[root_dims[0]];
    } else {
      absl::StatusOr<std::shared_ptr<ProcessGroup>> made = MakeGroup(
          *root_->factory, root_->layout, root_dims, absl::StrCat(root_->name, "/", merged),
          root_->rank, root_->members_only, root_->members_group,
          [this](const std::vector<GroupSpec>& specs) { return root_->NewGroups(specs); });
      if (!made.ok()) return made.status();
      group = *std::move(made);
    }
  }
  {
    absl::MutexLock lock(&root_->mu);
    root_->flattened_names.emplace(merged, root_dims);
    root_->flattened_groups.emplace(root_dims, group);
  }
  return MakeView(root_, {Dim{merged, std::move(root_dims), std::move(group)}});
}

std::string DeviceMesh::DebugString() const {
  return absl::StrCat("DeviceMesh(shape=(", absl::StrJoin(shape(), ", "), "), dim_names=(",
                      absl::StrJoin(dim_names(), ", "), "), rank=", rank(), ", coordinate=(",
                      absl::StrJoin(coordinate_, ", "), "))");
}

}  // namespace mesh
