#include "bench/collectives_bench.h"

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "mesh/float16.h"
#include "mesh/tensor.h"

namespace mesh::bench {
namespace {

// ---- Descriptors ------------------------------------------------------------

// Deterministic inputs: small integers, exact in every dtype even summed
// over a few hundred ranks.
double InputValue(int rank, int64_t i) { return static_cast<double>((rank + 1) % 5 + i % 7); }

struct Descriptor {
  const char* name;
  // Whether the op splits its buffer into one part per rank (the count must
  // be a multiple of n).
  bool splits;
  double (*bus_factor)(int n);
  // Elements of the input and output for a measured buffer of `count`.
  int64_t (*in_count)(int64_t count, int n);
  int64_t (*out_count)(int64_t count, int n);
  // In-place ops use the input as their output.
  bool in_place;
  absl::StatusOr<ProcessGroup::WorkPtr> (*issue)(ProcessGroup& g, const Tensor& in,
                                                 const Tensor& out);
  // Expected output element k on `rank`; `part` is count / n.
  double (*expected)(int64_t k, int rank, int n, int64_t part);
};

double AllFactor(int n) { return n > 1 ? 2.0 * (n - 1) / n : 0.0; }
double PartFactor(int n) { return n > 1 ? static_cast<double>(n - 1) / n : 0.0; }
double OneFactor(int) { return 1.0; }
int64_t Same(int64_t count, int) { return count; }
int64_t Part(int64_t count, int n) { return count / n; }

double SumOverRanks(int n, int64_t i) {
  double sum = 0;
  for (int r = 0; r < n; ++r) sum += InputValue(r, i);
  return sum;
}

const Descriptor kDescriptors[] = {
    {"all_reduce", false, AllFactor, Same, Same, true,
     [](ProcessGroup& g, const Tensor& in, const Tensor&) {
       return g.AllReduce(in, ReduceOp::kSum);
     },
     [](int64_t k, int, int n, int64_t) { return SumOverRanks(n, k); }},
    {"all_gather", true, PartFactor, Part, Same, false,
     [](ProcessGroup& g, const Tensor& in, const Tensor& out) { return g.AllGather(in, out); },
     [](int64_t k, int, int, int64_t part) {
       return InputValue(static_cast<int>(k / part), k % part);
     }},
    {"reduce_scatter", true, PartFactor, Same, Part, false,
     [](ProcessGroup& g, const Tensor& in, const Tensor& out) {
       return g.ReduceScatter(in, out, ReduceOp::kSum);
     },
     [](int64_t k, int rank, int n, int64_t part) { return SumOverRanks(n, rank * part + k); }},
    {"all_to_all", true, PartFactor, Same, Same, false,
     [](ProcessGroup& g, const Tensor& in, const Tensor& out) { return g.AllToAll(in, out); },
     [](int64_t k, int rank, int, int64_t part) {
       return InputValue(static_cast<int>(k / part), rank * part + k % part);
     }},
    {"broadcast", false, OneFactor, Same, Same, true,
     [](ProcessGroup& g, const Tensor& in, const Tensor&) { return g.Broadcast(in, 0); },
     [](int64_t k, int, int, int64_t) { return InputValue(0, k); }},
};

const Descriptor* FindDescriptor(const std::string& name) {
  for (const Descriptor& d : kDescriptors) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

// ---- Element access ---------------------------------------------------------

void SetElement(DType dtype, void* base, int64_t i, double v) {
  switch (dtype) {
    case DType::kFloat32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      return;
    case DType::kFloat64:
      static_cast<double*>(base)[i] = v;
      return;
    case DType::kFloat16:
      static_cast<Float16*>(base)[i] = Float16(static_cast<float>(v));
      return;
    case DType::kBFloat16:
      static_cast<BFloat16*>(base)[i] = BFloat16(static_cast<float>(v));
      return;
    case DType::kInt8:
      static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v);
      return;
    case DType::kUInt8:
    case DType::kBool:
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
      return;
    case DType::kInt32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      return;
    case DType::kInt64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      return;
  }
}

double GetElement(DType dtype, const void* base, int64_t i) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(base)[i];
    case DType::kFloat64:
      return static_cast<const double*>(base)[i];
    case DType::kFloat16:
      return static_cast<float>(static_cast<const Float16*>(base)[i]);
    case DType::kBFloat16:
      return static_cast<float>(static_cast<const BFloat16*>(base)[i]);
    case DType::kInt8:
      return static_cast<const int8_t*>(base)[i];
    case DType::kUInt8:
    case DType::kBool:
      return static_cast<const uint8_t*>(base)[i];
    case DType::kInt32:
      return static_cast<const int32_t*>(base)[i];
    case DType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
  }
  return 0;
}

void FillInput(const Tensor& t, int rank) {
  for (int64_t i = 0; i < t.numel(); ++i) SetElement(t.dtype(), t.data(), i, InputValue(rank, i));
}

absl::Status Await(absl::StatusOr<ProcessGroup::WorkPtr> work) {
  if (!work.ok()) return work.status();
  return (*work)->Wait();
}

// One value reduced over all ranks (max of times, sum of error counts).
absl::StatusOr<double> ReduceScalar(ProcessGroup& g, double value, ReduceOp op) {
  auto t = Tensor::Empty(DType::kFloat64, {1});
  if (!t.ok()) return t.status();
  static_cast<double*>(t->data())[0] = value;
  if (absl::Status s = Await(g.AllReduce(*t, op)); !s.ok()) return s;
  return static_cast<double*>(t->data())[0];
}

// ---- Worker processes ---------------------------------------------------------

std::vector<std::string> WorkerArgs(const CollectivesBenchOptions& o, int rank,
                                    const std::string& coordinator, const std::string& job) {
  std::vector<std::string> args = {
      o.executable,
      "collectives",
      "--worker-rank",
      absl::StrCat(rank),
      "--coordinator",
      coordinator,
      "--job",
      job,
      "--nproc",
      absl::StrCat(o.nproc),
      "-b",
      absl::StrCat(o.min_bytes),
      "-e",
      absl::StrCat(o.max_bytes),
      "-f",
      absl::StrCat(o.factor),
      "-n",
      absl::StrCat(o.iterations),
      "-w",
      absl::StrCat(o.warmup),
      "--dtype",
      std::string(DTypeName(o.dtype)),
      "--algorithm",
      GlooAllreduceAlgorithmName(o.allreduce_algorithm),
      "--hostname",
      o.hostname,
      "--timeout",
      absl::StrCat(absl::ToInt64Seconds(o.timeout)),
      "--ops",
      absl::StrJoin(o.ops, ","),
  };
  if (o.check) args.push_back("-c");
  if (o.shared_memory) args.push_back("--shm");
  if (!o.batch_device_thread) args.push_back("--no-batch-device-thread");
  return args;
}

}  // namespace

absl::Status ValidateCollectivesOptions(const CollectivesBenchOptions& o) {
  if (o.min_bytes < 1 || o.max_bytes < o.min_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("need 1 <= min bytes (", o.min_bytes, ") <= max bytes (", o.max_bytes, ")"));
  }
  if (o.factor < 2) return absl::InvalidArgumentError("the size factor must be >= 2");
  if (o.iterations < 1 || o.warmup < 0) {
    return absl::InvalidArgumentError("need iterations >= 1 and warmup >= 0");
  }
  if (o.nproc < 1) return absl::InvalidArgumentError("need at least one process");
  if (o.ops.empty()) return absl::InvalidArgumentError("no ops to run");
  for (const std::string& op : o.ops) {
    if (FindDescriptor(op) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown op '", op,
                       "'; expected all_reduce, all_gather, reduce_scatter, all_to_all, "
                       "broadcast"));
    }
  }
  if (o.timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("timeout must be > 0");
  return absl::OkStatus();
}

absl::Status RunCollectivesWorker(const CollectivesBenchOptions& options, int rank,
                                  const std::string& coordinator, const std::string& job,
                                  const std::function<void(const CollectivesRow&)>& emit) {
  if (absl::Status s = ValidateCollectivesOptions(options); !s.ok()) return s;
  const int n = options.nproc;
  GlooOptions gloo;
  gloo.hostname = options.hostname;
  gloo.group.timeout = options.timeout;
  gloo.allreduce_algorithm = options.allreduce_algorithm;
  gloo.shared_memory = options.shared_memory;
  gloo.batch_device_thread = options.batch_device_thread;
  auto factory = ConnectBenchWorker(coordinator, job, rank, n, gloo, options.timeout);
  if (!factory.ok()) return factory.status();
  auto world = (*factory)->World();
  if (!world.ok()) return world.status();
  ProcessGroup& g = **world;
  auto* gloo_group = dynamic_cast<ProcessGroupGloo*>(&g);
  const size_t elem = ElementSize(options.dtype);

  for (const std::string& op : options.ops) {
    const Descriptor& d = *FindDescriptor(op);
    for (int64_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= options.factor) {
      int64_t count = bytes / static_cast<int64_t>(elem);
      if (d.splits) count -= count % n;
      if (count == 0) continue;
      auto in = Tensor::Empty(options.dtype, {d.in_count(count, n)});
      if (!in.ok()) return in.status();
      auto out_storage = Tensor::Empty(options.dtype, {d.out_count(count, n)});
      if (!out_storage.ok()) return out_storage.status();
      const Tensor& out = d.in_place ? *in : *out_storage;
      FillInput(*in, rank);

      for (int i = 0; i < options.warmup; ++i) {
        if (absl::Status s = Await(d.issue(g, *in, out)); !s.ok()) return s;
      }
      if (absl::Status s = Await(g.Barrier()); !s.ok()) return s;
      // Issued back to back, as nccl-tests does: the group runs them in
      // order, and waiting on the last covers them all.
      std::vector<ProcessGroup::WorkPtr> works;
      works.reserve(options.iterations);
      const absl::Time start = absl::Now();
      for (int i = 0; i < options.iterations; ++i) {
        auto work = d.issue(g, *in, out);
        if (!work.ok()) return work.status();
        works.push_back(*std::move(work));
      }
      for (const auto& work : works) {
        if (absl::Status s = work->Wait(); !s.ok()) return s;
      }
      const double local_us = absl::ToDoubleMicroseconds(absl::Now() - start) / options.iterations;
      auto time_us = ReduceScalar(g, local_us, ReduceOp::kMax);
      if (!time_us.ok()) return time_us.status();

      int64_t wrong = -1;
      if (options.check) {
        FillInput(*in, rank);
        if (absl::Status s = Await(d.issue(g, *in, out)); !s.ok()) return s;
        const int64_t part = count / n;
        double local_wrong = 0;
        for (int64_t k = 0; k < out.numel(); ++k) {
          if (GetElement(options.dtype, out.data(), k) != d.expected(k, rank, n, part)) {
            ++local_wrong;
          }
        }
        auto total = ReduceScalar(g, local_wrong, ReduceOp::kSum);
        if (!total.ok()) return total.status();
        wrong = static_cast<int64_t>(*total);
      }

      if (rank == 0 && emit) {
        CollectivesRow row;
        row.op = op;
        row.count = count;
        row.bytes = count * static_cast<int64_t>(elem);
        row.time_us = *time_us;
        row.algbw_gbps = static_cast<double>(row.bytes) / (row.time_us * 1e3);
        row.busbw_gbps = row.algbw_gbps * d.bus_factor(n);
        row.wrong = wrong;
        if (gloo_group != nullptr && gloo_group->uses_shared_memory()) {
          row.algorithm = "shm";
        } else if (op == "all_reduce" && gloo_group != nullptr) {
          row.algorithm = GlooAllreduceAlgorithmName(
              gloo_group->AllreduceAlgorithmFor(static_cast<size_t>(row.bytes)));
        }
        emit(row);
      }
    }
  }
  return Await(g.Barrier());
}

absl::StatusOr<CollectivesBenchResult> RunCollectivesBench(
    const CollectivesBenchOptions& options_in,
    const std::function<void(const CollectivesRow&)>& on_row) {
  CollectivesBenchOptions options = options_in;
  if (absl::Status s = ValidateCollectivesOptions(options); !s.ok()) return s;
  if (options.executable.empty()) options.executable = "/proc/self/exe";

  CollectivesBenchResult result;
  result.nproc = options.nproc;
  result.dtype = std::string(DTypeName(options.dtype));
  BenchWorkersOptions workers;
  workers.nproc = options.nproc;
  workers.job_prefix = "bench-collectives";
  workers.deadline = options.deadline;
  absl::Status status = RunBenchWorkers(
      workers,
      [&](int rank, const std::string& coordinator, const std::string& job) {
        return WorkerArgs(options, rank, coordinator, job);
      },
      [&](const nlohmann::json& json) -> absl::Status {
        auto row = RowFromJson(json);
        if (!row.ok()) return row.status();
        if (on_row) on_row(*row);
        result.rows.push_back(*std::move(row));
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  return result;
}

// ---- Output -------------------------------------------------------------------

nlohmann::json ToJson(const CollectivesRow& row) {
  nlohmann::json json = {
      {"op", row.op},           {"bytes", row.bytes},           {"count", row.count},
      {"time_us", row.time_us}, {"algbw_gbps", row.algbw_gbps}, {"busbw_gbps", row.busbw_gbps},
      {"wrong", row.wrong}};
  if (!row.algorithm.empty()) json["algorithm"] = row.algorithm;
  return json;
}

absl::StatusOr<CollectivesRow> RowFromJson(const nlohmann::json& json) {
  if (!json.is_object() || !json.contains("op") || !json.contains("bytes") ||
      !json.contains("time_us")) {
    return absl::InternalError(absl::StrCat("malformed row from rank 0: ", json.dump()));
  }
  CollectivesRow row;
  row.op = json.value("op", "");
  row.bytes = json.value("bytes", int64_t{0});
  row.count = json.value("count", int64_t{0});
  row.time_us = json.value("time_us", 0.0);
  row.algbw_gbps = json.value("algbw_gbps", 0.0);
  row.busbw_gbps = json.value("busbw_gbps", 0.0);
  row.wrong = json.value("wrong", int64_t{-1});
  row.algorithm = json.value("algorithm", "");
  return row;
}

nlohmann::json ToJson(const CollectivesBenchOptions& options,
                      const CollectivesBenchResult& result) {
  nlohmann::json rows = nlohmann::json::array();
  for (const CollectivesRow& row : result.rows) rows.push_back(ToJson(row));
  return {{"benchmark", "collectives"},
          {"backend", "gloo"},
          {"transport", absl::StrCat("tcp ", options.hostname)},
          {"nproc", result.nproc},
          {"dtype", result.dtype},
          {"iterations", options.iterations},
          {"warmup", options.warmup},
          {"check", options.check},
          {"allreduce_algorithm", GlooAllreduceAlgorithmName(options.allreduce_algorithm)},
          {"shared_memory", options.shared_memory},
          {"batch_device_thread", options.batch_device_thread},
          {"rows", rows}};
}

std::string CollectivesHeader(const CollectivesBenchOptions& o) {
  return absl::StrCat("# mesh-bench collectives: ", o.nproc, " processes, gloo over ",
                      o.shared_memory ? "shared memory (TCP for setup) " : "TCP ", o.hostname,
                      ", iterations ", o.iterations, ", warmup ", o.warmup, ", check ",
                      o.check ? "on" : "off", "\n#\n",
                      absl::StrFormat("# %-15s %12s %12s %9s %11s %11s %11s %7s  %s\n",
                                      "collective", "size(B)", "count", "type", "time(us)",
                                      "algbw(GB/s)", "busbw(GB/s)", "#wrong", "algorithm"));
}

std::string FormatRow(const CollectivesRow& row, const std::string& dtype) {
  return absl::StrFormat("  %-15s %12d %12d %9s %11.1f %11.3f %11.3f %7s  %s", row.op, row.bytes,
                         row.count, dtype, row.time_us, row.algbw_gbps, row.busbw_gbps,
                         row.wrong < 0 ? "N/A" : absl::StrCat(row.wrong), row.algorithm);
}

}  // namespace mesh::bench
