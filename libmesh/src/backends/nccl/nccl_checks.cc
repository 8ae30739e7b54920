#include "backends/nccl/nccl_checks.h"

#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/duration_format.h"

namespace mesh::nccl {
namespace {

absl::Status Invalid(const GroupView& group, absl::string_view op, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("NCCL group '", group.name, "' ", op, ": ", what));
}

// a * b, or false on int64 overflow (both non-negative).
bool MultiplyNonNegative(int64_t a, int64_t b, int64_t* out) {
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a) return false;
  *out = a * b;
  return true;
}

int64_t RowSize(const Tensor& t) {
  int64_t row = 1;
  for (int d = 1; d < t.dim(); ++d) row *= t.size(d);  // numel() fits, so this does.
  return row;
}

// Counts and offsets (in elements) for one side of an all-to-all.
absl::Status PlanSide(const GroupView& group, absl::string_view role, const Tensor& t,
                      absl::Span<const int64_t> splits, std::vector<int64_t>* counts,
                      std::vector<int64_t>* offsets) {
  static constexpr absl::string_view kOp = "all_to_all";
  const int64_t rows = t.size(0);
  const int64_t row_size = RowSize(t);
  std::vector<int64_t> row_splits;
  if (splits.empty()) {
    if (rows % group.size != 0) {
      return Invalid(
          group, kOp,
          absl::StrCat(role, " dim 0 (", rows, ") is not divisible by the group size (", group.size,
                       "), so equal splits are impossible; pass ", role, "_splits"));
    }
    row_splits.assign(group.size, rows / group.size);
  } else {
    if (splits.size() != static_cast<size_t>(group.size)) {
      return Invalid(group, kOp,
                     absl::StrCat(role, "_splits has ", splits.size(),
                                  " entries; it needs one per member (", group.size, ")"));
    }
    int64_t sum = 0;
    for (size_t j = 0; j < splits.size(); ++j) {
      if (splits[j] < 0) {
        return Invalid(group, kOp,
                       absl::StrCat(role, "_splits[", j, "] is negative (", splits[j], ")"));
      }
      if (splits[j] > rows - sum) {
        return Invalid(group, kOp,
                       absl::StrCat(role, "_splits [", absl::StrJoin(splits, ", "),
                                    "] sum to more than ", role, " dim 0 (", rows, ")"));
      }
      sum += splits[j];
    }
    if (sum != rows) {
      return Invalid(group, kOp,
                     absl::StrCat(role, "_splits [", absl::StrJoin(splits, ", "), "] sum to ", sum,
                                  ", not ", role, " dim 0 (", rows, ")"));
    }
    row_splits.assign(splits.begin(), splits.end());
  }
  counts->resize(group.size);
  offsets->resize(group.size);
  int64_t offset = 0;
  for (int j = 0; j < group.size; ++j) {
    (*counts)[j] = row_splits[j] * row_size;  // <= numel, no overflow.
    (*offsets)[j] = offset;
    offset += (*counts)[j];
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTensor(const GroupView& group, absl::string_view op, absl::string_view role,
                         const Tensor& tensor, const NcclCaps& caps) {
  if (tensor.device() != group.device) {
    return Invalid(
        group, op,
        absl::StrCat(role, " is on ", tensor.device().ToString(), " but the group runs on ",
                     group.device.ToString(), ": ", tensor.DebugString()));
  }
  if (!tensor.is_contiguous()) {
    return Invalid(group, op,
                   absl::StrCat(role,
                                " is not contiguous; NCCL needs contiguous tensors (copy it "
                                "into a contiguous one first): ",
                                tensor.DebugString()));
  }
  if (tensor.dtype() == DType::kBFloat16 && !caps.bfloat16) {
    return Invalid(group, op,
                   absl::StrCat(role,
                                " is bfloat16, which needs NCCL >= 2.10; libmesh was "
                                "built against an older NCCL"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameDType(const GroupView& group, absl::string_view op, const Tensor& input,
                            const Tensor& output) {
  if (input.dtype() != output.dtype()) {
    return Invalid(group, op,
                   absl::StrCat("input is ", DTypeName(input.dtype()), " but output is ",
                                DTypeName(output.dtype()), "; they must match"));
  }
  return absl::OkStatus();
}

absl::Status CheckReduceOp(const GroupView& group, absl::string_view op, DType dtype,
                           ReduceOp reduce_op, const NcclCaps& caps) {
  if (dtype == DType::kBool && reduce_op != ReduceOp::kMin && reduce_op != ReduceOp::kMax) {
    return Invalid(group, op,
                   absl::StrCat("reduction '", ReduceOpName(reduce_op),
                                "' is not defined for bool; use min (logical and) or max "
                                "(logical or)"));
  }
  if (reduce_op == ReduceOp::kAvg && !caps.avg) {
    return Invalid(group, op,
                   "reduction 'avg' needs NCCL >= 2.10; libmesh was built against an older "
                   "NCCL");
  }
  return absl::OkStatus();
}

absl::Status CheckRoot(const GroupView& group, absl::string_view op, int root) {
  if (root < 0 || root >= group.size) {
    return Invalid(group, op,
                   absl::StrCat("root ", root, " is not a group rank (0..", group.size - 1, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckPeer(const GroupView& group, absl::string_view op, int peer) {
  if (peer < 0 || peer >= group.size) {
    return Invalid(group, op,
                   absl::StrCat("peer ", peer, " is not a group rank (0..", group.size - 1, ")"));
  }
  if (peer == group.rank) {
    return Invalid(group, op, absl::StrCat("peer ", peer, " is this rank itself"));
  }
  return absl::OkStatus();
}

absl::Status CheckAllReduceBuffers(const GroupView& group, const Tensor& input,
                                   const Tensor& output) {
  if (output.numel() != input.numel()) {
    return Invalid(group, "all_reduce",
                   absl::StrCat("output has ", output.numel(), " elements; input has ",
                                input.numel(), "; they must match"));
  }
  // Both are contiguous (CheckTensor), so equal data pointers make the same
  // tensor: NCCL's in-place form.
  if (input.data() != output.data() && SpansOverlap(input, output)) {
    return Invalid(group, "all_reduce",
                   "input and output overlap; pass the same tensor for the in-place form");
  }
  return absl::OkStatus();
}

absl::Status CheckAllGatherSizes(const GroupView& group, const Tensor& input,
                                 const Tensor& output) {
  int64_t expected = 0;
  if (!MultiplyNonNegative(input.numel(), group.size, &expected) || output.numel() != expected) {
    return Invalid(group, "all_gather",
                   absl::StrCat("output has ", output.numel(), " elements; it needs group size (",
                                group.size, ") x input elements (", input.numel(), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckReduceScatterSizes(const GroupView& group, const Tensor& input,
                                     const Tensor& output) {
  int64_t expected = 0;
  if (!MultiplyNonNegative(output.numel(), group.size, &expected) || input.numel() != expected) {
    return Invalid(group, "reduce_scatter",
                   absl::StrCat("input has ", input.numel(), " elements; it needs group size (",
                                group.size, ") x output elements (", output.numel(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<AllToAllPlan> PlanAllToAll(const GroupView& group, const Tensor& input,
                                          const Tensor& output,
                                          absl::Span<const int64_t> input_splits,
                                          absl::Span<const int64_t> output_splits) {
  static constexpr absl::string_view kOp = "all_to_all";
  if (input.dim() == 0 || output.dim() == 0) {
    return Invalid(group, kOp,
                   absl::StrCat("input and output need at least one dimension (splits count "
                                "rows of dim 0); got ",
                                input.ShapeString(), " and ", output.ShapeString()));
  }
  if (RowSize(input) != RowSize(output)) {
    return Invalid(group, kOp,
                   absl::StrCat("input rows have ", RowSize(input), " elements but output rows ",
                                RowSize(output), "; input ", input.ShapeString(), ", output ",
                                output.ShapeString()));
  }
  // Send and receive chunks are copied independently and in no set order.
  const auto* in = static_cast<const char*>(input.data());
  const auto* out = static_cast<const char*>(output.data());
  if (input.nbytes() > 0 && output.nbytes() > 0 && in < out + output.nbytes() &&
      out < in + input.nbytes()) {
    return Invalid(group, kOp, "input and output overlap; all_to_all cannot run in place");
  }
  AllToAllPlan plan;
  if (absl::Status s =
          PlanSide(group, "input", input, input_splits, &plan.send_counts, &plan.send_offsets);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          PlanSide(group, "output", output, output_splits, &plan.recv_counts, &plan.recv_offsets);
      !s.ok()) {
    return s;
  }
  return plan;
}

absl::StatusOr<std::vector<int>> CheckGroupSpecs(absl::Span<const GroupSpec> specs, int world_rank,
                                                 int world_size) {
  std::vector<int> group_ranks;
  group_ranks.reserve(specs.size());
  absl::flat_hash_set<std::string> families;
  for (size_t i = 0; i < specs.size(); ++i) {
    const GroupSpec& spec = specs[i];
    const std::string where =
        absl::StrCat("group spec ", i, " (family '", spec.family, "', color ", spec.color, ")");
    if (spec.family.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the family name is empty"));
    }
    if (!families.insert(spec.family).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": family '", spec.family,
                       "' appears twice; pass one spec per family (the group containing "
                       "this rank)"));
    }
    if (spec.color < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the color must be >= 0"));
    }
    if (spec.global_ranks.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the group has no members"));
    }
    absl::flat_hash_set<int> seen;
    int group_rank = -1;
    for (size_t j = 0; j < spec.global_ranks.size(); ++j) {
      const int r = spec.global_ranks[j];
      if (r < 0 || r >= world_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": rank ", r, " is outside the world (0..", world_size - 1, ")"));
      }
      if (!seen.insert(r).second) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": rank ", r, " is listed twice"));
      }
      if (r == world_rank) group_rank = static_cast<int>(j);
    }
    if (group_rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": members [", absl::StrJoin(spec.global_ranks, ", "),
                       "] do not include this rank (", world_rank,
                       "); pass, per family, the group that contains the caller"));
    }
    group_ranks.push_back(group_rank);
  }
  return group_ranks;
}

absl::Status CheckFactoryOptions(const NcclProcessGroupFactoryOptions& options) {
  auto invalid = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL factory options: ", what));
  };
  auto positive_finite = [](absl::Duration d) {
    return d > absl::ZeroDuration() && d != absl::InfiniteDuration();
  };
  if (options.world_size < 1) {
    return invalid(absl::StrCat("world_size is ", options.world_size, "; it must be >= 1"));
  }
  if (options.world_rank < 0 || options.world_rank >= options.world_size) {
    return invalid(absl::StrCat("world_rank ", options.world_rank, " is outside the world (0..",
                                options.world_size - 1, ")"));
  }
  if (options.world_unique_id.size() != kNcclUniqueIdBytes) {
    return invalid(absl::StrCat("world_unique_id has ", options.world_unique_id.size(),
                                " bytes; an ncclUniqueId has ", kNcclUniqueIdBytes,
                                " (rank 0 makes it with GenerateNcclUniqueId)"));
  }
  if (!options.device.is_cuda()) {
    return invalid(absl::StrCat("device is ", options.device.ToString(),
                                "; the NCCL backend needs a CUDA device"));
  }
  if (!positive_finite(options.init_timeout)) {
    return invalid(absl::StrCat("init_timeout is ", FormatDurationShort(options.init_timeout),
                                "; it must be positive and finite"));
  }
  if (!positive_finite(options.group_options.timeout)) {
    return invalid(absl::StrCat("group_options.timeout is ",
                                FormatDurationShort(options.group_options.timeout),
                                "; it must be positive and finite"));
  }
  if (options.ranks_per_root < 1) {
    return invalid(
        absl::StrCat("ranks_per_root is ", options.ranks_per_root, "; it must be at least 1"));
  }
  if (!positive_finite(options.watchdog_interval)) {
    return invalid(absl::StrCat("watchdog_interval is ",
                                FormatDurationShort(options.watchdog_interval),
                                "; it must be positive and finite"));
  }
  if (options.destroy_timeout < absl::ZeroDuration() ||
      options.destroy_timeout == absl::InfiniteDuration()) {
    return invalid(absl::StrCat("destroy_timeout is ", FormatDurationShort(options.destroy_timeout),
                                "; it must be non-negative and finite"));
  }
  return absl::OkStatus();
}

}  // namespace mesh::nccl
