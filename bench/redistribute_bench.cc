#include "bench/redistribute_bench.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "bench/bench_workers.h"
#include "mesh/device_mesh.h"
#include "mesh/dtensor.h"
#include "mesh/placement.h"
#include "mesh/process_group_gloo.h"
#include "mesh/redistribute_plan.h"
#include "mesh/tensor.h"

namespace mesh::bench {
namespace {

// ---- Cases --------------------------------------------------------------------

struct Case {
  const char* name;
  bool two_d;
  Placements src;
  Placements dst;
  // The one step a 1-D plan must be; none for the 2-D case.
  std::optional<RedistributeOp> expected_op;
};

const std::vector<Case>& Cases() {
  static const std::vector<Case>* cases = new std::vector<Case>{
      {"s0_r", false, {Placement::Shard(0)}, {Placement::Replicate()}, RedistributeOp::kAllGather},
      {"p_r", false, {Placement::Partial()}, {Placement::Replicate()}, RedistributeOp::kAllReduce},
      {"p_s0",
       false,
       {Placement::Partial()},
       {Placement::Shard(0)},
       RedistributeOp::kReduceScatter},
      {"s0_s1", false, {Placement::Shard(0)}, {Placement::Shard(1)}, RedistributeOp::kAllToAll},
      {"s0s1_rr",
       true,
       {Placement::Shard(0), Placement::Shard(1)},
       {Placement::Replicate(), Placement::Replicate()},
       std::nullopt},
  };
  return *cases;
}

const Case* FindCase(const std::string& name) {
  for (const Case& c : Cases()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

std::string Transition(const Case& c) {
  auto side = [](const Placements& p) {
    return p.size() == 1 ? p[0].ToString() : PlacementsToString(p);
  };
  return absl::StrCat(side(c.src), " -> ", side(c.dst));
}

// ---- Data ---------------------------------------------------------------------

std::vector<int64_t> ShapeFor(int64_t bytes) {
  const int64_t elements = bytes / static_cast<int64_t>(sizeof(float));
  int64_t rows = 1;
  while ((rows * 2) * (rows * 2) <= elements) rows *= 2;
  return {rows, elements / rows};
}

// Element i of the global tensor: small integers, exact in float32.
float GlobalValue(int64_t i) { return static_cast<float>(i % 1021); }

int64_t Numel(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// Mismatches between a contiguous [a, b] local tensor at `layout` and the
// global tensor of `cols` columns.
int64_t CountWrong(const Tensor& local, const LocalLayout& layout, int64_t cols) {
  if (local.dim() != 2 || !local.is_contiguous() ||
      local.shape() != absl::Span<const int64_t>(layout.shape)) {
    return std::max<int64_t>(1, local.numel());
  }
  const float* data = local.data_as<const float>();
  int64_t wrong = 0;
  for (int64_t r = 0; r < layout.shape[0]; ++r) {
    for (int64_t c = 0; c < layout.shape[1]; ++c) {
      const int64_t global = (layout.offset[0] + r) * cols + layout.offset[1] + c;
      if (data[r * layout.shape[1] + c] != GlobalValue(global)) ++wrong;
    }
  }
  return wrong;
}

absl::Status Await(absl::StatusOr<ProcessGroup::WorkPtr> work) {
  if (!work.ok()) return work.status();
  return (*work)->Wait();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// ---- The raw side ---------------------------------------------------------------

// One raw collective of the baseline, with its buffers allocated up front.
//
// The floor side also makes, serially, the local copies that the step's
// change of layout needs whoever makes it: an all_to_all whose pieces are
// strided in the local block packs them into `in` first, one whose pieces
// are strided in the result unpacks them from `out` after, and an
// all_gather along a dim with something before it unpacks the gathered
// blocks. This rank's own piece is left out: the collective already copies
// it from input to output, and a direct implementation copies it once.
struct RawStep {
  RedistributeOp op;
  std::shared_ptr<ProcessGroup> group;
  Tensor in;
  Tensor out;
  std::vector<Tensor> strided;  // Blocks laid out like the local ones.
  // (destination, source) pairs, before and after the collective.
  std::vector<std::pair<Tensor, Tensor>> copies_before;
  std::vector<std::pair<Tensor, Tensor>> copies_after;
  bool has_copies() const { return !copies_before.empty() || !copies_after.empty(); }
};

// Product of the dims before `d`: above 1, blocks cut along d are strided.
int64_t Outer(absl::Span<const int64_t> shape, int d) {
  int64_t p = 1;
  for (int i = 0; i < d; ++i) p *= shape[static_cast<size_t>(i)];
  return p;
}

// Contiguous `shape`-shaped view of `buffer` from element `offset`.
Tensor View(const Tensor& buffer, int64_t offset, absl::Span<const int64_t> shape) {
  auto* base = static_cast<unsigned char*>(buffer.data()) +
               offset * static_cast<int64_t>(buffer.element_size());
  return Tensor::Contiguous(base, buffer.dtype(), shape, buffer.device(), buffer.keep_alive());
}

// Copies between a block of `strided_shape`, cut into k even pieces of
// `piece` along `dim`, and the k contiguous pieces of `flat`, skipping
// piece `own`: into `flat` (pack) or out of it (unpack).
absl::Status AddPieces(RawStep& step, absl::Span<const int64_t> strided_shape,
                       std::vector<int64_t> piece, int dim, int64_t k, int own, const Tensor& flat,
                       bool pack) {
  auto block = Tensor::Zeros(DType::kFloat32, strided_shape);
  if (!block.ok()) return block.status();
  step.strided.push_back(*block);
  const int64_t count = Numel(piece);
  const int64_t len = piece[static_cast<size_t>(dim)];
  for (int64_t j = 0; j < k; ++j) {
    if (j == own) continue;
    auto strided = block->Narrow(dim, j * len, len);
    if (!strided.ok()) return strided.status();
    Tensor contiguous = View(flat, j * count, piece);
    if (pack) {
      step.copies_before.emplace_back(contiguous, *strided);
    } else {
      step.copies_after.emplace_back(*strided, contiguous);
    }
  }
  return absl::OkStatus();
}

// Adds the step's layout copies (see RawStep); splits are even (powers of
// two).
absl::Status AddLayoutCopies(RawStep& step, const RedistributeStep& plan_step,
                             const LocalLayout& before, const LocalLayout& after, int64_t k) {
  const int own = step.group->rank();
  if (plan_step.op == RedistributeOp::kAllToAll) {
    const int d = plan_step.from.dim();
    const int e = plan_step.to.dim();
    // Piece (from j, to m): the before block cut along e to m's range.
    std::vector<int64_t> piece(before.shape.begin(), before.shape.end());
    piece[static_cast<size_t>(e)] = after.shape[static_cast<size_t>(e)];
    if (Outer(before.shape, e) > 1) {
      if (absl::Status s = AddPieces(step, before.shape, piece, e, k, own, step.in, true);
          !s.ok()) {
        return s;
      }
    }
    if (Outer(after.shape, d) > 1) {
      if (absl::Status s = AddPieces(step, after.shape, piece, d, k, own, step.out, false);
          !s.ok()) {
        return s;
      }
    }
  } else if (plan_step.op == RedistributeOp::kAllGather) {
    const int d = plan_step.from.dim();
    if (Outer(after.shape, d) > 1) {
      std::vector<int64_t> piece(before.shape.begin(), before.shape.end());
      return AddPieces(step, after.shape, piece, d, k, own, step.out, false);
    }
  }
  return absl::OkStatus();
}

// The plan's communication, done by hand: per non-local step, the raw
// collective on that step's group, sized from this rank's layout before it.
absl::StatusOr<std::vector<RawStep>> MakeRawSteps(const DeviceMesh& mesh,
                                                  const RedistributePlan& plan,
                                                  absl::Span<const int64_t> shape) {
  std::vector<RawStep> steps;
  for (const RedistributeStep& step : plan.steps) {
    if (step.op == RedistributeOp::kLocalSlice || step.op == RedistributeOp::kLocalPartial) {
      continue;
    }
    auto group = mesh.GetGroup(step.mesh_dim);
    if (!group.ok()) return group.status();
    auto layout = ComputeLocalLayout(shape, mesh.shape(), step.before, mesh.GetCoordinate());
    if (!layout.ok()) return layout.status();
    const int64_t local = Numel(layout->shape);
    const int64_t k = mesh.Size(step.mesh_dim);
    int64_t in_count = local;
    int64_t out_count = local;
    switch (step.op) {
      case RedistributeOp::kAllGather:
        out_count = local * k;
        break;
      case RedistributeOp::kReduceScatter:
        out_count = local / k;
        break;
      default:
        break;
    }
    auto in = Tensor::Zeros(DType::kFloat32, {in_count});
    if (!in.ok()) return in.status();
    auto out = Tensor::Zeros(DType::kFloat32, {out_count});
    if (!out.ok()) return out.status();
    RawStep raw{step.op, *std::move(group), *std::move(in), *std::move(out), {}, {}, {}};
    auto after = ComputeLocalLayout(shape, mesh.shape(), step.after, mesh.GetCoordinate());
    if (!after.ok()) return after.status();
    if (absl::Status s = AddLayoutCopies(raw, step, *layout, *after, k); !s.ok()) return s;
    steps.push_back(std::move(raw));
  }
  return steps;
}

// `with_copies`: the floor side (RawStep).
absl::Status RunRaw(const std::vector<RawStep>& steps, bool with_copies = false) {
  for (const RawStep& s : steps) {
    if (with_copies) {
      for (const auto& [dst, src] : s.copies_before) {
        if (absl::Status c = CopyTensor(dst, src); !c.ok()) return c;
      }
    }
    absl::StatusOr<ProcessGroup::WorkPtr> work;
    switch (s.op) {
      case RedistributeOp::kAllGather:
        work = s.group->AllGather(s.in, s.out);
        break;
      case RedistributeOp::kAllReduce:
        work = s.group->AllReduce(s.in, ReduceOp::kSum);
        break;
      case RedistributeOp::kReduceScatter:
        work = s.group->ReduceScatter(s.in, s.out, ReduceOp::kSum);
        break;
      case RedistributeOp::kAllToAll:
        work = s.group->AllToAll(s.in, s.out);
        break;
      default:
        continue;
    }
    if (absl::Status st = Await(std::move(work)); !st.ok()) return st;
    if (with_copies) {
      for (const auto& [dst, src] : s.copies_after) {
        if (absl::Status c = CopyTensor(dst, src); !c.ok()) return c;
      }
    }
  }
  return absl::OkStatus();
}

std::string DescribePlan(const RedistributePlan& plan, const DeviceMesh& mesh) {
  std::vector<std::string> parts;
  for (const RedistributeStep& step : plan.steps) {
    std::string part = RedistributeOpName(step.op);
    if (mesh.ndim() > 1) absl::StrAppend(&part, "(", mesh.dim_names()[step.mesh_dim], ")");
    parts.push_back(std::move(part));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, " + ");
}

// ---- One row ------------------------------------------------------------------

absl::StatusOr<RedistributeRow> RunCase(const RedistributeBenchOptions& options, const Case& c,
                                        const DeviceMesh& mesh, ProcessGroup& world,
                                        int64_t bytes) {
  const std::vector<int64_t> shape = ShapeFor(bytes);
  for (int d = 0; d < mesh.ndim(); ++d) {
    for (int64_t extent : shape) {
      if (extent % mesh.Size(d) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "size ", bytes, " B gives shape [", absl::StrJoin(shape, ", "), "], which mesh dim ", d,
            " (", mesh.Size(d), " ranks) does not divide; use powers of two"));
      }
    }
  }
  auto global = Tensor::Empty(DType::kFloat32, shape);
  if (!global.ok()) return global.status();
  float* g = global->data_as<float>();
  for (int64_t i = 0; i < global->numel(); ++i) g[i] = GlobalValue(i);
  // Every rank holds the global tensor: src_rank -1 slices locally.
  auto input = DistributeTensor(*global, mesh, c.src);
  if (!input.ok()) return input.status();
  *global = Tensor();  // Only the input's shards stay alive.

  auto plan = PlanRedistribute(shape, DType::kFloat32, mesh.shape(), c.src, c.dst);
  if (!plan.ok()) return plan.status();
  if (c.expected_op.has_value() &&
      (plan->steps.size() != 1 || plan->steps[0].op != *c.expected_op)) {
    return absl::InternalError(absl::StrCat(Transition(c), ": expected a single ",
                                            RedistributeOpName(*c.expected_op),
                                            " step, the planner made:\n", plan->ToString()));
  }
  auto raw = MakeRawSteps(mesh, *plan, shape);
  if (!raw.ok()) return raw.status();

  // Correctness first, once.
  int64_t local_wrong = 0;
  {
    auto out = Redistribute(*input, c.dst);
    if (!out.ok()) return out.status();
    local_wrong = CountWrong(out->local(), out->local_layout(), shape[1]);
  }

  auto timed = [&](auto&& body) -> absl::StatusOr<double> {
    if (absl::Status s = Await(world.Barrier()); !s.ok()) return s;
    const absl::Time start = absl::Now();
    if (absl::Status s = body(); !s.ok()) return s;
    return absl::ToDoubleMicroseconds(absl::Now() - start);
  };
  const int rounds = options.warmup + options.iterations;
  // [0, iterations): Redistribute; [iterations, 2 iterations): raw;
  // [2 iterations, 3 iterations): the floor (raw plus layout copies), all
  // reduced with max below.
  auto times = Tensor::Zeros(DType::kFloat64, {3 * int64_t{options.iterations}});
  if (!times.ok()) return times.status();
  double* t = times->data_as<double>();
  for (int i = 0; i < rounds; ++i) {
    // The result lives until the end of the round, so that freeing it is
    // not timed on either side. The sides alternate which goes first, so
    // that neither always runs right after the other (warm caches, the
    // peers' Gloo threads still draining the previous side).
    absl::StatusOr<DTensor> out = absl::UnknownError("not run");
    auto run_redistribute = [&] {
      return timed([&] {
        out = Redistribute(*input, c.dst);
        return out.status();
      });
    };
    auto run_raw = [&] { return timed([&] { return RunRaw(*raw); }); };
    auto run_floor = [&] { return timed([&] { return RunRaw(*raw, /*with_copies=*/true); }); };
    // The sides take turns going first: round i starts with side i mod 3.
    std::array<absl::StatusOr<double>, 3> us = {absl::UnknownError("not run"),
                                                absl::UnknownError("not run"),
                                                absl::UnknownError("not run")};
    for (int turn = 0; turn < 3; ++turn) {
      const int side = (i + turn) % 3;
      us[side] = side == 0 ? run_redistribute() : side == 1 ? run_raw() : run_floor();
      if (!us[side].ok()) return us[side].status();
    }
    if (i >= options.warmup) {
      for (int side = 0; side < 3; ++side) {
        t[side * options.iterations + i - options.warmup] = *us[side];
      }
    }
  }
  if (absl::Status s = Await(world.AllReduce(*times, ReduceOp::kMax)); !s.ok()) return s;
  auto wrong = Tensor::Zeros(DType::kInt64, {1});
  if (!wrong.ok()) return wrong.status();
  wrong->data_as<int64_t>()[0] = local_wrong;
  if (absl::Status s = Await(world.AllReduce(*wrong, ReduceOp::kSum)); !s.ok()) return s;

  RedistributeRow row;
  row.case_name = c.name;
  row.transition = Transition(c);
  row.mesh = absl::StrCat("(", absl::StrJoin(mesh.shape(), ", "), ")");
  row.nproc = world.size();
  row.shape = shape;
  row.bytes = Numel(shape) * static_cast<int64_t>(sizeof(float));
  row.plan = DescribePlan(*plan, mesh);
  row.plan_bytes_per_rank = plan->bytes_per_rank;
  row.redistribute_us = Median(std::vector<double>(t, t + options.iterations));
  row.raw_us = Median(std::vector<double>(t + options.iterations, t + 2 * options.iterations));
  row.ratio = row.raw_us > 0 ? row.redistribute_us / row.raw_us : 0;
  row.floor_us =
      Median(std::vector<double>(t + 2 * options.iterations, t + 3 * options.iterations));
  auto paired_against = [&](int side) {
    std::vector<double> paired;
    for (int i = 0; i < options.iterations; ++i) {
      const double base = t[side * options.iterations + i];
      if (base > 0) paired.push_back(t[i] / base);
    }
    return paired.empty() ? 0.0 : Median(std::move(paired));
  };
  row.paired_ratio = paired_against(1);
  row.floor_ratio = paired_against(2);
  row.layout_copies =
      std::any_of(raw->begin(), raw->end(), [](const RawStep& s) { return s.has_copies(); });
  row.wrong = wrong->data_as<int64_t>()[0];
  return row;
}

std::vector<std::string> WorkerArgs(const RedistributeBenchOptions& o, int nproc, int rank,
                                    const std::string& coordinator, const std::string& job) {
  std::vector<std::string> args = {o.executable,
                                   "redistribute",
                                   "--worker-rank",
                                   absl::StrCat(rank),
                                   "--coordinator",
                                   coordinator,
                                   "--job",
                                   job,
                                   "--nproc",
                                   absl::StrCat(nproc),
                                   "--sizes",
                                   absl::StrJoin(o.sizes, ","),
                                   "--cases",
                                   absl::StrJoin(o.cases, ","),
                                   "-n",
                                   absl::StrCat(o.iterations),
                                   "-w",
                                   absl::StrCat(o.warmup),
                                   "--hostname",
                                   o.hostname,
                                   "--timeout",
                                   absl::StrCat(absl::ToInt64Seconds(o.timeout))};
  if (o.shared_memory) args.push_back("--shm");
  return args;
}

bool RunsTwoD(int nproc) { return nproc >= 4 && nproc % 2 == 0; }

}  // namespace

std::vector<std::string> RedistributeCaseNames() {
  std::vector<std::string> names;
  for (const Case& c : Cases()) names.push_back(c.name);
  return names;
}

absl::Status ValidateRedistributeOptions(const RedistributeBenchOptions& o) {
  if (o.sizes.empty()) return absl::InvalidArgumentError("no sizes");
  for (int64_t size : o.sizes) {
    if (size < static_cast<int64_t>(sizeof(float))) {
      return absl::InvalidArgumentError(absl::StrCat("size ", size, " B is below one float"));
    }
  }
  if (o.nprocs.empty()) return absl::InvalidArgumentError("no world sizes");
  for (int n : o.nprocs) {
    if (n < 1) return absl::InvalidArgumentError(absl::StrCat("world size ", n, " is below 1"));
  }
  if (o.cases.empty()) return absl::InvalidArgumentError("no cases");
  for (const std::string& name : o.cases) {
    if (FindCase(name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown case '", name, "'; expected one of ",
                                                     absl::StrJoin(RedistributeCaseNames(), ", ")));
    }
  }
  if (o.iterations < 1 || o.warmup < 0) {
    return absl::InvalidArgumentError("need iterations >= 1 and warmup >= 0");
  }
  if (o.timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("timeout must be > 0");
  return absl::OkStatus();
}

absl::Status RunRedistributeWorker(const RedistributeBenchOptions& options, int nproc, int rank,
                                   const std::string& coordinator, const std::string& job,
                                   const std::function<void(const RedistributeRow&)>& emit) {
  if (absl::Status s = ValidateRedistributeOptions(options); !s.ok()) return s;
  GlooOptions gloo;
  gloo.hostname = options.hostname;
  gloo.group.timeout = options.timeout;
  gloo.shared_memory = options.shared_memory;
  auto connected = ConnectBenchWorker(coordinator, job, rank, nproc, gloo, options.timeout);
  if (!connected.ok()) return connected.status();
  std::shared_ptr<ProcessGroupFactory> factory = *std::move(connected);
  auto world = factory->World();
  if (!world.ok()) return world.status();

  const bool want_two_d =
      std::any_of(options.cases.begin(), options.cases.end(),
                  [](const std::string& name) { return FindCase(name)->two_d; });
  auto mesh1 =
      DeviceMesh::Init(factory, {static_cast<int64_t>(nproc)}, {"x"}, DeviceMeshOptions{"bench1d"});
  if (!mesh1.ok()) return mesh1.status();
  std::optional<DeviceMesh> mesh2;
  if (want_two_d && RunsTwoD(nproc)) {
    auto made = DeviceMesh::Init(factory, {2, static_cast<int64_t>(nproc / 2)}, {"dp", "tp"},
                                 DeviceMeshOptions{"bench2d"});
    if (!made.ok()) return made.status();
    mesh2 = *std::move(made);
  }

  for (const std::string& name : options.cases) {
    const Case& c = *FindCase(name);
    if (c.two_d && !mesh2.has_value()) continue;
    for (int64_t bytes : options.sizes) {
      auto row = RunCase(options, c, c.two_d ? *mesh2 : *mesh1, **world, bytes);
      if (!row.ok()) {
        return absl::Status(row.status().code(), absl::StrCat(Transition(c), ", ", bytes,
                                                              " B: ", row.status().message()));
      }
      if (rank == 0 && emit) emit(*row);
    }
  }
  return Await((*world)->Barrier());
}

absl::StatusOr<RedistributeBenchResult> RunRedistributeBench(
    const RedistributeBenchOptions& options_in,
    const std::function<void(const RedistributeRow&)>& on_row) {
  RedistributeBenchOptions options = options_in;
  if (absl::Status s = ValidateRedistributeOptions(options); !s.ok()) return s;
  if (options.executable.empty()) options.executable = "/proc/self/exe";
  RedistributeBenchResult result;
  for (int nproc : options.nprocs) {
    BenchWorkersOptions workers;
    workers.nproc = nproc;
    workers.job_prefix = absl::StrCat("bench-redistribute-", nproc);
    workers.deadline = options.deadline;
    absl::Status status = RunBenchWorkers(
        workers,
        [&](int rank, const std::string& coordinator, const std::string& job) {
          return WorkerArgs(options, nproc, rank, coordinator, job);
        },
        [&](const nlohmann::json& json) -> absl::Status {
          auto row = RedistributeRowFromJson(json);
          if (!row.ok()) return row.status();
          if (on_row) on_row(*row);
          result.rows.push_back(*std::move(row));
          return absl::OkStatus();
        });
    if (!status.ok()) return status;
  }
  return result;
}

// ---- Output ---------------------------------------------------------------------

nlohmann::json ToJson(const RedistributeRow& row) {
  return {{"case", row.case_name},
          {"transition", row.transition},
          {"mesh", row.mesh},
          {"nproc", row.nproc},
          {"shape", row.shape},
          {"bytes", row.bytes},
          {"plan", row.plan},
          {"plan_bytes_per_rank", row.plan_bytes_per_rank},
          {"redistribute_us", row.redistribute_us},
          {"raw_us", row.raw_us},
          {"ratio", row.ratio},
          {"paired_ratio", row.paired_ratio},
          {"floor_us", row.floor_us},
          {"floor_ratio", row.floor_ratio},
          {"layout_copies", row.layout_copies},
          {"wrong", row.wrong}};
}

absl::StatusOr<RedistributeRow> RedistributeRowFromJson(const nlohmann::json& json) {
  if (!json.is_object() || !json.contains("case") || !json.contains("bytes") ||
      !json.contains("redistribute_us") || !json.contains("raw_us")) {
    return absl::InternalError(absl::StrCat("malformed row from rank 0: ", json.dump()));
  }
  RedistributeRow row;
  row.case_name = json.value("case", "");
  row.transition = json.value("transition", "");
  row.mesh = json.value("mesh", "");
  row.nproc = json.value("nproc", 0);
  row.shape = json.value("shape", std::vector<int64_t>{});
  row.bytes = json.value("bytes", int64_t{0});
  row.plan = json.value("plan", "");
  row.plan_bytes_per_rank = json.value("plan_bytes_per_rank", int64_t{0});
  row.redistribute_us = json.value("redistribute_us", 0.0);
  row.raw_us = json.value("raw_us", 0.0);
  row.ratio = json.value("ratio", 0.0);
  row.paired_ratio = json.value("paired_ratio", 0.0);
  row.floor_us = json.value("floor_us", 0.0);
  row.floor_ratio = json.value("floor_ratio", 0.0);
  row.layout_copies = json.value("layout_copies", false);
  row.wrong = json.value("wrong", int64_t{0});
  return row;
}

nlohmann::json ToJson(const RedistributeBenchOptions& options,
                      const RedistributeBenchResult& result) {
  nlohmann::json rows = nlohmann::json::array();
  for (const RedistributeRow& row : result.rows) rows.push_back(ToJson(row));
  return {{"benchmark", "redistribute"},
          {"backend", "gloo"},
          {"transport", options.shared_memory ? "shm" : absl::StrCat("tcp ", options.hostname)},
          {"dtype", "float32"},
          {"iterations", options.iterations},
          {"warmup", options.warmup},
          {"rows", rows}};
}

namespace {
std::string Size(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) {
    return absl::StrCat(bytes >> 20, " MiB");
  }
  if (bytes >= 1024 && bytes % 1024 == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}
}  // namespace

std::string RedistributeHeader(const RedistributeBenchOptions& o) {
  return absl::StrCat(
      "# mesh-bench redistribute: gloo over ",
      o.shared_memory ? "shared memory (TCP for setup) " : "TCP ", o.hostname,
      ", float32, warm-up ", o.warmup, ", median of ", o.iterations,
      " rounds of the slowest rank; raw = the plan's collectives by hand\n",
      absl::StrFormat(
          "| %-22s | %-7s | %-7s | %-31s | %17s | %9s | %5s | %6s | %10s | %5s | %5s |\n",
          "transition", "mesh", "size", "plan", "redistribute (us)", "raw (us)", "ratio", "paired",
          "floor (us)", "vs fl", "wrong"),
      absl::StrFormat("|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", std::string(24, '-'),
                      std::string(9, '-'), std::string(9, '-'), std::string(33, '-'),
                      std::string(19, '-'), std::string(11, '-'), std::string(7, '-'),
                      std::string(8, '-'), std::string(12, '-'), std::string(7, '-'),
                      std::string(7, '-')));
}

std::string FormatRow(const RedistributeRow& row) {
  return absl::StrFormat(
      "| %-22s | %-7s | %-7s | %-31s | %17.0f | %9.0f | %5.2f | %6.2f | %10s | %5s | %5d |",
      row.transition, row.mesh, Size(row.bytes), row.plan, row.redistribute_us, row.raw_us,
      row.ratio, row.paired_ratio,
      row.layout_copies ? absl::StrFormat("%.0f", row.floor_us) : std::string("= raw"),
      row.layout_copies ? absl::StrFormat("%.2f", row.floor_ratio) : std::string("-"), row.wrong);
}

}  // namespace mesh::bench
