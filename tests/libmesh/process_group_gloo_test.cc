// Over 800 lines on purpose: every collective of ProcessGroupGloo, each
// dtype and size against one reference implementation, on worlds of ranks
// as threads shared by all cases (set up once at the top), one section per
// family of operations.

// ProcessGroupGloo against a single-process reference: N ranks as threads,
// an InMemoryStore, real Gloo TCP on 127.0.0.1. Every output is filled with
// garbage before the call, so elements an op fails to write show up.
#include "mesh/process_group_gloo.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mesh/float16.h"
#include "process_group_gloo_test_util.h"

namespace mesh {
namespace process_group_gloo_test {

using gloo_test::Get;
using gloo_test::kTestTimeout;
using gloo_test::MakeRanks;
using gloo_test::OnRanks;
using gloo_test::Poisoned;
using gloo_test::Ranks;
using gloo_test::Set;
using gloo_test::TestOptions;
using ::testing::HasSubstr;

// ---- Shared worlds ------------------------------------------------------------
//
// Rendezvous costs more than most ops, so a world per size is built once per
// process and reused by every test that leaves it healthy.

Ranks& SharedWorld(int n, bool shm = false) {
  static std::mutex mu;
  static auto* worlds = new std::map<std::pair<int, bool>, std::unique_ptr<Ranks>>;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*worlds)[{n, shm}];
  if (slot == nullptr || !slot->healthy()) {
    GlooOptions options = TestOptions();
    options.shared_memory = shm;
    // Small slots, so that the test sizes take several rounds.
    options.shared_memory_slot_bytes = 64 * 1024;
    auto made = MakeRanks(n, options);
    EXPECT_TRUE(made.ok()) << made.status();
    slot = *std::move(made);
  }
  return *slot;
}

absl::Status Await(absl::StatusOr<ProcessGroup::WorkPtr> work) {
  if (!work.ok()) return work.status();
  return (*work)->Wait(kTestTimeout);
}

// ---- Deterministic data and the reference -----------------------------------
//
// Small integers, so that every dtype holds every input and every result
// exactly (sums over 8 ranks stay within bf16's 8-bit significand, products
// within int8) and the reference does not depend on reduction order.

bool IsUnsigned(DType dtype) { return dtype == DType::kUInt8 || dtype == DType::kBool; }

double Value(DType dtype, ReduceOp op, int rank, int64_t i, int salt) {
  if (dtype == DType::kBool) return (i % 5 == 0 || (rank + i + salt) % 3 == 0) ? 1 : 0;
  if (op == ReduceOp::kProd) {
    switch ((rank + i + salt) % 3) {
      case 0:
        return IsUnsigned(dtype) ? 1 : -1;
      case 1:
        return 1;
      default:
        return rank < 3 ? 2 : 1;  // |product| <= 8.
    }
  }
  const int64_t v = (rank * 7 + i * 13 + salt) % 9;
  return IsUnsigned(dtype) ? static_cast<double>(v) : static_cast<double>(v - 4);
}

// What the backend's kAvg does to an exact sum: divide in the dtype's own
// arithmetic (float for f32/f16/bf16), truncate for integers.
double AverageLike(DType dtype, double sum, int n) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<float>(sum) / static_cast<float>(n);
    case DType::kFloat64:
      return sum / n;
    case DType::kFloat16:
      return static_cast<float>(Float16(static_cast<float>(sum) / static_cast<float>(n)));
    case DType::kBFloat16:
      return static_cast<float>(BFloat16(static_cast<float>(sum) / static_cast<float>(n)));
    default:
      return static_cast<double>(static_cast<int64_t>(sum) / n);
  }
}

double Fold(DType dtype, ReduceOp op, int n, const std::function<double(int)>& value) {
  double acc = value(0);
  for (int r = 1; r < n; ++r) {
    const double x = value(r);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += x;
        break;
      case ReduceOp::kProd:
        acc *= x;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, x);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, x);
        break;
    }
  }
  return op == ReduceOp::kAvg ? AverageLike(dtype, acc, n) : acc;
}

std::vector<ReduceOp> OpsFor(DType dtype) {
  if (dtype == DType::kBool) return {ReduceOp::kMin, ReduceOp::kMax};
  return {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd};
}

void FillWith(const Tensor& t, const std::function<double(int64_t)>& value) {
  for (int64_t i = 0; i < t.numel(); ++i) Set(t, i, value(i));
}

// Reports the first mismatch only, so a broken op does not flood the log.
void ExpectElements(const Tensor& t, const std::function<double(int64_t)>& expected,
                    const std::string& what) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double got = Get(t, i);
    const double want = expected(i);
    if (got != want) {
      ADD_FAILURE() << what << ": element " << i << " of " << t.numel() << " is " << got
                    << ", expected " << want;
      return;
    }
  }
}

// ---- Every collective, every dtype, every size --------------------------------

struct Case {
  int n;
  DType dtype;
  int64_t count;
  bool shm = false;  // GlooOptions::shared_memory.
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return absl::StrCat("n", info.param.n, "_", DTypeName(info.param.dtype), "_", info.param.count,
                      info.param.shm ? "_shm" : "");
}

// The large count (past gloo's 1 MiB segments and our 512 KiB ones, and
// not divisible by any group size) runs for float32 at every size and for
// one dtype of each other element size at 2 and 3 ranks; the small counts
// run for all nine dtypes. That keeps the suite near a minute on 2 cores.
constexpr int64_t kLarge = (int64_t{1} << 18) + 3;
std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (int n : {1, 2, 3, 4, 5, 8}) {
    for (DType dtype : kAllDTypes) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1021}}) {
        cases.push_back({n, dtype, count});
      }
    }
    cases.push_back({n, DType::kFloat32, kLarge});
    if (n == 2 || n == 3) {
      for (DType dtype : {DType::kBFloat16, DType::kInt64, DType::kBool}) {
        cases.push_back({n, dtype, kLarge});
      }
    }
  }
  // The shared-memory path: one dtype per element size and bool, with
  // 64 KiB slots so that 1021 elements and the large count take several
  // rounds.
  for (int n : {2, 3, 5, 8}) {
    for (DType dtype :
         {DType::kFloat32, DType::kBFloat16, DType::kInt8, DType::kInt64, DType::kBool}) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1021}}) {
        cases.push_back({n, dtype, count, true});
      }
    }
    cases.push_back({n, DType::kFloat32, kLarge, true});
  }
  return cases;
}

class GlooCollectives : public ::testing::TestWithParam<Case> {};

// Rows that member `from` sends to member `to` in the uneven all-to-all:
// 0, 1/3, 2/3 or the whole count, so some pairs exchange nothing.
int64_t UnevenRows(int64_t count, int from, int to) { return count * ((from + 2 * to) % 4) / 3; }

void RunEveryCollective(ProcessGroup& g, const Case& c) {
  const int n = c.n;
  const int r = g.rank();
  const DType dtype = c.dtype;
  const int64_t count = c.count;
  ASSERT_EQ(g.size(), n);

  // AllReduce, every op the dtype allows.
  for (ReduceOp op : OpsFor(dtype)) {
    const std::string what = absl::StrCat("rank ", r, " all_reduce ", ReduceOpName(op));
    Tensor t = Poisoned(dtype, {count});
    FillWith(t, [&](int64_t i) { return Value(dtype, op, r, i, 1); });
    ASSERT_TRUE(Await(g.AllReduce(t, op)).ok()) << what;
    ExpectElements(
        t,
        [&](int64_t i) {
          return Fold(dtype, op, n, [&](int q) { return Value(dtype, op, q, i, 1); });
        },
        what);
  }

  // AllReduce out of place, every op: the input is left as it was.
  for (ReduceOp op : OpsFor(dtype)) {
    const std::string what = absl::StrCat("rank ", r, " all_reduce(in, out) ", ReduceOpName(op));
    Tensor in = Poisoned(dtype, {count});
    FillWith(in, [&](int64_t i) { return Value(dtype, op, r, i, 10); });
    Tensor out = Poisoned(dtype, {count});
    ASSERT_TRUE(Await(g.AllReduce(in, out, op)).ok()) << what;
    ExpectElements(
        out,
        [&](int64_t i) {
          return Fold(dtype, op, n, [&](int q) { return Value(dtype, op, q, i, 10); });
        },
        what);
    ExpectElements(
        in, [&](int64_t i) { return Value(dtype, op, r, i, 10); }, what + " (input)");
  }

  // Broadcast from every root; non-roots start with garbage.
  for (int root = 0; root < n; ++root) {
    const std::string what = absl::StrCat("rank ", r, " broadcast from ", root);
    Tensor t = Poisoned(dtype, {count});
    if (r == root) FillWith(t, [&](int64_t i) { return Value(dtype, ReduceOp::kSum, r, i, 2); });
    ASSERT_TRUE(Await(g.Broadcast(t, root)).ok()) << what;
    ExpectElements(
        t, [&](int64_t i) { return Value(dtype, ReduceOp::kSum, root, i, 2); }, what);
  }

  // Reduce to the last rank (non-zero whenever n > 1).
  for (ReduceOp op : {OpsFor(dtype).front(), OpsFor(dtype).back()}) {
    const int root = n - 1;
    const std::string what = absl::StrCat("rank ", r, " reduce ", ReduceOpName(op), " to ", root);
    Tensor t = Poisoned(dtype, {count});
    FillWith(t, [&](int64_t i) { return Value(dtype, op, r, i, 3); });
    ASSERT_TRUE(Await(g.Reduce(t, root, op)).ok()) << what;
    if (r == root) {
      ExpectElements(
          t,
          [&](int64_t i) {
            return Fold(dtype, op, n, [&](int q) { return Value(dtype, op, q, i, 3); });
          },
          what);
    }
  }

  // AllGather.
  {
    const std::string what = absl::StrCat("rank ", r, " all_gather");
    Tensor in = Poisoned(dtype, {count});
    FillWith(in, [&](int64_t i) { return Value(dtype, ReduceOp::kSum, r, i, 4); });
    Tensor out = Poisoned(dtype, {n, count});
    ASSERT_TRUE(Await(g.AllGather(in, out)).ok()) << what;
    ExpectElements(
        out,
        [&](int64_t k) {
          return Value(dtype, ReduceOp::kSum, static_cast<int>(k / count), k % count, 4);
        },
        what);
  }

  // ReduceScatter: chunk r of the reduction lands on rank r.
  for (ReduceOp op : OpsFor(dtype)) {
    if (op == ReduceOp::kMin) continue;  // Same code path as max.
    const std::string what = absl::StrCat("rank ", r, " reduce_scatter ", ReduceOpName(op));
    Tensor in = Poisoned(dtype, {n * count});
    FillWith(in, [&](int64_t k) { return Value(dtype, op, r, k, 5); });
    Tensor out = Poisoned(dtype, {count});
    ASSERT_TRUE(Await(g.ReduceScatter(in, out, op)).ok()) << what;
    ExpectElements(
        out,
        [&](int64_t i) {
          return Fold(dtype, op, n, [&](int q) { return Value(dtype, op, q, r * count + i, 5); });
        },
        what);
  }

  // AllToAll with equal splits: block j of rank r's input goes to rank j.
  {
    const std::string what = absl::StrCat("rank ", r, " all_to_all (equal)");
    Tensor in = Poisoned(dtype, {n * count});
    FillWith(in, [&](int64_t k) { return Value(dtype, ReduceOp::kSum, r, k, 6); });
    Tensor out = Poisoned(dtype, {n * count});
    ASSERT_TRUE(Await(g.AllToAll(in, out)).ok()) << what;
    ExpectElements(
        out,
        [&](int64_t k) {
          const int from = static_cast<int>(k / count);
          return Value(dtype, ReduceOp::kSum, from, r * count + k % count, 6);
        },
        what);
  }

  // AllToAll with uneven splits of rows of two elements.
  {
    const std::string what = absl::StrCat("rank ", r, " all_to_all (uneven)");
    std::vector<int64_t> in_splits(n), out_splits(n);
    int64_t in_rows = 0, out_rows = 0;
    for (int j = 0; j < n; ++j) {
      in_splits[j] = UnevenRows(count, r, j);
      out_splits[j] = UnevenRows(count, j, r);
      in_rows += in_splits[j];
      out_rows += out_splits[j];
    }
    Tensor in = Poisoned(dtype, {in_rows, 2});
    FillWith(in, [&](int64_t k) { return Value(dtype, ReduceOp::kSum, r, k, 7); });
    Tensor out = Poisoned(dtype, {out_rows, 2});
    ASSERT_TRUE(Await(g.AllToAll(in, out, in_splits, out_splits)).ok()) << what;
    // Row t of the block from j was row (sum_{b<r} UnevenRows(j, b)) + t of j's input.
    std::vector<double> expected;
    expected.reserve(out_rows * 2);
    for (int j = 0; j < n; ++j) {
      int64_t first = 0;
      for (int b = 0; b < r; ++b) first += UnevenRows(count, j, b);
      for (int64_t k = first * 2; k < (first + UnevenRows(count, j, r)) * 2; ++k) {
        expected.push_back(Value(dtype, ReduceOp::kSum, j, k, 7));
      }
    }
    ExpectElements(
        out, [&](int64_t k) { return expected[k]; }, what);
  }

  // Send/Recv around the ring; odd ranks post their receive first, so both
  // orders of posting are covered.
  if (n > 1) {
    const std::string what = absl::StrCat("rank ", r, " send/recv");
    const int to = (r + 1) % n;
    const int from = (r + n - 1) % n;
    Tensor send = Poisoned(dtype, {count});
    FillWith(send, [&](int64_t i) { return Value(dtype, ReduceOp::kSum, r, i, 8); });
    Tensor recv = Poisoned(dtype, {count});
    absl::StatusOr<ProcessGroup::WorkPtr> s, q;
    if (r % 2 == 1) {
      q = g.Recv(recv, from, 7);
      s = g.Send(send, to, 7);
    } else {
      s = g.Send(send, to, 7);
      q = g.Recv(recv, from, 7);
    }
    ASSERT_TRUE(Await(s).ok()) << what;
    ASSERT_TRUE(Await(q).ok()) << what;
    ExpectElements(
        recv, [&](int64_t i) { return Value(dtype, ReduceOp::kSum, from, i, 8); }, what);
  }

  ASSERT_TRUE(Await(g.Barrier()).ok()) << "rank " << r << " barrier";
}

TEST_P(GlooCollectives, EveryCollectiveMatchesTheReference) {
  const Case c = GetParam();
  Ranks& ranks = SharedWorld(c.n, c.shm);
  ASSERT_EQ(ranks.size(), c.n);
  auto* gloo = dynamic_cast<ProcessGroupGloo*>(ranks.world[0].get());
  ASSERT_NE(gloo, nullptr);
  EXPECT_EQ(gloo->uses_shared_memory(), c.shm && c.n > 1);
  OnRanks(c.n, [&](int r) { RunEveryCollective(*ranks.world[r], c); });
  EXPECT_TRUE(ranks.healthy());
}

INSTANTIATE_TEST_SUITE_P(SizesDTypesCounts, GlooCollectives, ::testing::ValuesIn(AllCases()),
                         CaseName);

// ---- Both AllReduce algorithms at every size ------------------------------------

class GlooAllreduceAlgorithms
    : public ::testing::TestWithParam<std::tuple<int, GlooAllreduceAlgorithm>> {};

TEST_P(GlooAllreduceAlgorithms, SumMatchesTheReferenceAcrossSegmentBoundaries) {
  const auto [n, algorithm] = GetParam();
  GlooOptions options = TestOptions();
  options.allreduce_algorithm = algorithm;
  auto ranks = MakeRanks(n, options);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  OnRanks(n, [&](int r) {
    auto* group = dynamic_cast<ProcessGroupGloo*>((*ranks)->world[r].get());
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->AllreduceAlgorithmFor(1), algorithm);
    // Odd sizes around gloo's 1 MiB segments and n-way chunking.
    for (int64_t count :
         {int64_t{1}, int64_t{7}, int64_t{n * 2 + 1}, int64_t{262147}, int64_t{600001}}) {
      Tensor t = Poisoned(DType::kInt32, {count});
      FillWith(t, [&](int64_t i) { return Value(DType::kInt32, ReduceOp::kSum, r, i, 9); });
      ASSERT_TRUE(Await(group->AllReduce(t, ReduceOp::kSum)).ok());
      ExpectElements(
          t,
          [&](int64_t i) {
            return Fold(DType::kInt32, ReduceOp::kSum, n,
                        [&](int q) { return Value(DType::kInt32, ReduceOp::kSum, q, i, 9); });
          },
          absl::StrCat("rank ", r, " count ", count));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(RingAndBcube, GlooAllreduceAlgorithms,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 8),
                                            ::testing::Values(GlooAllreduceAlgorithm::kRing,
                                                              GlooAllreduceAlgorithm::kBcube)),
                         [](const auto& info) {
                           return absl::StrCat("n", std::get<0>(info.param), "_",
                                               GlooAllreduceAlgorithmName(std::get<1>(info.param)));
                         });

TEST(GlooAllreduceAlgorithm, AutoPicksRingForTwoAndSwitchesAtTheThresholdForMore) {
  const size_t threshold = TestOptions().allreduce_ring_min_bytes;
  auto* three = dynamic_cast<ProcessGroupGloo*>(SharedWorld(3).world[0].get());
  ASSERT_NE(three, nullptr);
  EXPECT_EQ(three->AllreduceAlgorithmFor(1), GlooAllreduceAlgorithm::kBcube);
  EXPECT_EQ(three->AllreduceAlgorithmFor(threshold - 1), GlooAllreduceAlgorithm::kBcube);
  EXPECT_EQ(three->AllreduceAlgorithmFor(threshold), GlooAllreduceAlgorithm::kRing);
  auto* two = dynamic_cast<ProcessGroupGloo*>(SharedWorld(2).world[0].get());
  ASSERT_NE(two, nullptr);
  EXPECT_EQ(two->AllreduceAlgorithmFor(1), GlooAllreduceAlgorithm::kRing);
  EXPECT_EQ(two->AllreduceAlgorithmFor(threshold - 1), GlooAllreduceAlgorithm::kRing);
}

// ---- Non-contiguous inputs and outputs ---------------------------------------------

// Every third element of a poisoned buffer, starting at element 1: a strided
// view whose gaps must stay garbage.
struct Strided {
  Tensor base;
  Tensor view;
};

Strided StridedOf(DType dtype, int64_t count) {
  Strided s;
  s.base = Poisoned(dtype, {count * 3 + 1});
  auto* data = static_cast<unsigned char*>(s.base.data()) + s.base.element_size();
  s.view = Tensor(data, dtype, {count}, {3}, Device::Cpu(), s.base.keep_alive());
  return s;
}

void ExpectGapsPoisoned(const Strided& s, const std::string& what) {
  const auto* bytes = static_cast<const unsigned char*>(s.base.data());
  const size_t es = s.base.element_size();
  for (int64_t i = 0; i < s.base.numel(); ++i) {
    if (i % 3 == 1 && i / 3 < s.view.numel()) continue;
    for (size_t b = 0; b < es; ++b) {
      if (bytes[i * es + b] != 0xA5) {
        ADD_FAILURE() << what << ": gap element " << i << " was written";
        return;
      }
    }
  }
}

class GlooNonContiguous : public ::testing::TestWithParam<std::tuple<int, DType, bool>> {};

TEST_P(GlooNonContiguous, StridedTensorsAreStagedBothWays) {
  const auto [n, dtype, shm] = GetParam();
  const int64_t count = 37;
  Ranks& ranks = SharedWorld(n, shm);
  OnRanks(n, [&, n = n, dtype = dtype](int r) {
    ProcessGroup& g = *ranks.world[r];
    {
      Strided t = StridedOf(dtype, count);
      FillWith(t.view, [&](int64_t i) { return Value(dtype, ReduceOp::kMax, r, i, 10); });
      ASSERT_TRUE(Await(g.AllReduce(t.view, ReduceOp::kMax)).ok());
      ExpectElements(
          t.view,
          [&](int64_t i) {
            return Fold(dtype, ReduceOp::kMax, n,
                        [&](int q) { return Value(dtype, ReduceOp::kMax, q, i, 10); });
          },
          "strided all_reduce");
      ExpectGapsPoisoned(t, "strided all_reduce");
    }
    {
      Strided t = StridedOf(dtype, count);
      if (r == 0)
        FillWith(t.view, [&](int64_t i) { return Value(dtype, ReduceOp::kSum, 0, i, 11); });
      ASSERT_TRUE(Await(g.Broadcast(t.view, 0)).ok());
      ExpectElements(
          t.view, [&](int64_t i) { return Value(dtype, ReduceOp::kSum, 0, i, 11); },
          "strided broadcast");
      ExpectGapsPoisoned(t, "strided broadcast");
    }
    {
      // A transposed (column-major) input and a strided output.
      Tensor in_storage = Poisoned(dtype, {3, count});
      auto in = Tensor(in_storage.data(), dtype, {count, 3}, {1, count}, Device::Cpu(),
                       in_storage.keep_alive());
      ASSERT_FALSE(in.is_contiguous());
      FillWith(in, [&](int64_t k) { return Value(dtype, ReduceOp::kSum, r, k, 12); });
      Strided out = StridedOf(dtype, n * count * 3);
      ASSERT_TRUE(Await(g.AllGather(in, out.view)).ok());
      ExpectElements(
          out.view,
          [&](int64_t k) {
            return Value(dtype, ReduceOp::kSum, static_cast<int>(k / (count * 3)), k % (count * 3),
                         12);
          },
          "strided all_gather");
      ExpectGapsPoisoned(out, "strided all_gather");
    }
    if (dtype != DType::kBool) {
      Strided in = StridedOf(dtype, n * count);
      FillWith(in.view, [&](int64_t k) { return Value(dtype, ReduceOp::kSum, r, k, 13); });
      Strided out = StridedOf(dtype, count);
      ASSERT_TRUE(Await(g.ReduceScatter(in.view, out.view, ReduceOp::kSum)).ok());
      ExpectElements(
          out.view,
          [&](int64_t i) {
            return Fold(dtype, ReduceOp::kSum, n,
                        [&](int q) { return Value(dtype, ReduceOp::kSum, q, r * count + i, 13); });
          },
          "strided reduce_scatter");
      ExpectGapsPoisoned(out, "strided reduce_scatter");
    }
    {
      Strided in = StridedOf(dtype, n * count);
      FillWith(in.view, [&](int64_t k) { return Value(dtype, ReduceOp::kSum, r, k, 14); });
      Strided out = StridedOf(dtype, n * count);
      ASSERT_TRUE(Await(g.AllToAll(in.view, out.view)).ok());
      ExpectElements(
          out.view,
          [&](int64_t k) {
            return Value(dtype, ReduceOp::kSum, static_cast<int>(k / count), r * count + k % count,
                         14);
          },
          "strided all_to_all");
      ExpectGapsPoisoned(out, "strided all_to_all");
    }
    if (n > 1) {
      Strided send = StridedOf(dtype, count);
      FillWith(send.view, [&](int64_t i) { return Value(dtype, ReduceOp::kSum, r, i, 15); });
      Strided recv = StridedOf(dtype, count);
      auto s = g.Send(send.view, (r + 1) % n);
      auto q = g.Recv(recv.view, (r + n - 1) % n);
      ASSERT_TRUE(Await(s).ok());
      ASSERT_TRUE(Await(q).ok());
      ExpectElements(
          recv.view,
          [&](int64_t i) { return Value(dtype, ReduceOp::kSum, (r + n - 1) % n, i, 15); },
          "strided recv");
      ExpectGapsPoisoned(recv, "strided recv");
    }
  });
}

INSTANTIATE_TEST_SUITE_P(SizesAndDTypes, GlooNonContiguous,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5),
                                            ::testing::Values(DType::kFloat32, DType::kBFloat16,
                                                              DType::kInt64, DType::kBool),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat("n", std::get<0>(info.param), "_",
                                               DTypeName(std::get<1>(info.param)),
                                               std::get<2>(info.param) ? "_shm" : "");
                         });

// ---- The segmented rings (backends/gloo/gloo_ring.h) -------------------------------
//
// Tiny segments, so that a chunk is cut into 1 to 9 segments: fewer and
// more than the reduce-scatter's two receive slots and accumulators, and
// every count in between (a chunk of exactly slots + accumulators segments
// is where a careless ring deadlocks). Every element size, odd segment
// sizes (rounded down to whole elements), and a count per rank that leaves
// a short last segment.

struct RingCase {
  int n;
  DType dtype;
  size_t segment_bytes;
};

class GlooRings : public ::testing::TestWithParam<RingCase> {};

TEST_P(GlooRings, ReduceScatterAllGatherAndAllReduceMatchTheReference) {
  const RingCase c = GetParam();
  GlooOptions options = TestOptions();
  options.allreduce_algorithm = GlooAllreduceAlgorithm::kRing;
  options.reduce_scatter_segment_bytes = c.segment_bytes;
  options.all_gather_segment_bytes = c.segment_bytes;
  options.all_reduce_segment_bytes = c.segment_bytes;
  auto ranks = MakeRanks(c.n, options);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  const int n = c.n;
  const DType dtype = c.dtype;
  const int64_t per_segment =
      std::max<int64_t>(1, static_cast<int64_t>(c.segment_bytes / ElementSize(dtype)));
  OnRanks(n, [&](int r) {
    ProcessGroup& g = *(*ranks)->world[r];
    for (int64_t segments = 1; segments <= 9; ++segments) {
      // The last segment one element short, except for a single segment.
      const int64_t count = segments == 1 ? per_segment : segments * per_segment - 1;
      const std::string at = absl::StrCat("rank ", r, ", ", count, " per rank (", segments,
                                          " segments of ", per_segment, ")");
      const ReduceOp op = dtype == DType::kBool ? ReduceOp::kMax : ReduceOp::kSum;

      Tensor in = Poisoned(dtype, {n * count});
      FillWith(in, [&](int64_t k) { return Value(dtype, op, r, k, 20 + segments); });
      Tensor chunk = Poisoned(dtype, {count});
      ASSERT_TRUE(Await(g.ReduceScatter(in, chunk, op)).ok()) << at;
      ExpectElements(
          chunk,
          [&](int64_t i) {
            return Fold(dtype, op, n,
                        [&](int q) { return Value(dtype, op, q, r * count + i, 20 + segments); });
          },
          "reduce_scatter, " + at);

      Tensor gathered = Poisoned(dtype, {n * count});
      ASSERT_TRUE(Await(g.AllGather(chunk, gathered)).ok()) << at;
      Tensor reduced = Poisoned(dtype, {n * count});
      ASSERT_TRUE(Await(g.AllReduce(in, reduced, op)).ok()) << at;
      auto expected_sum = [&](int64_t k) {
        return Fold(dtype, op, n, [&](int q) { return Value(dtype, op, q, k, 20 + segments); });
      };
      ExpectElements(gathered, expected_sum, "all_gather of the reduce_scatter, " + at);
      ExpectElements(reduced, expected_sum, "all_reduce(in, out), " + at);

      // The in-place forms: reduce-scatter into this rank's chunk of its
      // input, then all-gather from it.
      Tensor whole = Poisoned(dtype, {n * count});
      FillWith(whole, [&](int64_t k) { return Value(dtype, op, r, k, 20 + segments); });
      auto own = whole.Narrow(0, r * count, count);
      ASSERT_TRUE(own.ok());
      ASSERT_TRUE(Await(g.ReduceScatter(whole, *own, op)).ok()) << at;
      ASSERT_TRUE(Await(g.AllGather(*own, whole)).ok()) << at;
      ExpectElements(whole, expected_sum, "in-place reduce_scatter + all_gather, " + at);
      ExpectElements(
          in, [&](int64_t k) { return Value(dtype, op, r, k, 20 + segments); },
          "all_reduce(in, out) input, " + at);
    }
  });
  EXPECT_TRUE((*ranks)->healthy());
}

std::vector<RingCase> RingCases() {
  std::vector<RingCase> cases;
  for (int n : {2, 3, 4, 5, 8}) cases.push_back({n, DType::kFloat32, 64});
  for (DType dtype : {DType::kBFloat16, DType::kInt64, DType::kBool, DType::kInt8}) {
    cases.push_back({3, dtype, 100});  // 100 B: 50, 12, 100 and 100 elements.
  }
  cases.push_back({4, DType::kFloat64, 7});  // Below one element: one per segment.
  return cases;
}

INSTANTIATE_TEST_SUITE_P(SegmentCounts, GlooRings, ::testing::ValuesIn(RingCases()),
                         [](const auto& info) {
                           return absl::StrCat("n", info.param.n, "_", DTypeName(info.param.dtype),
                                               "_", info.param.segment_bytes, "B");
                         });

// The fused ring is chosen only where the ring is and the group size
// divides numel; elsewhere the out-of-place form copies, then reduces in
// place. Both give the same answer, and the input is never written.
TEST(GlooOutOfPlaceAllReduce, FallsBackWhereTheFusedRingDoesNotApply) {
  const int n = 3;
  // Ring forced, so that counts not divisible by 3 take the fallback with
  // the ring chosen; the shared world (auto: bcube below 16 MiB for 3
  // ranks) takes it with bcube.
  GlooOptions options = TestOptions();
  options.allreduce_algorithm = GlooAllreduceAlgorithm::kRing;
  auto ring = MakeRanks(n, options);
  ASSERT_TRUE(ring.ok()) << ring.status();
  for (Ranks* ranks : {ring->get(), &SharedWorld(n)})
    OnRanks(n, [&](int r) {
      ProcessGroup& g = *ranks->world[r];
      for (int64_t count : {int64_t{3}, int64_t{4}, int64_t{3 * 1000}, int64_t{3001}}) {
        Tensor in = Poisoned(DType::kInt32, {count});
        FillWith(in, [&](int64_t i) { return Value(DType::kInt32, ReduceOp::kSum, r, i, 30); });
        Tensor out = Poisoned(DType::kInt32, {count});
        ASSERT_TRUE(Await(g.AllReduce(in, out, ReduceOp::kSum)).ok());
        ExpectElements(
            out,
            [&](int64_t i) {
              return Fold(DType::kInt32, ReduceOp::kSum, n,
                          [&](int q) { return Value(DType::kInt32, ReduceOp::kSum, q, i, 30); });
            },
            absl::StrCat("rank ", r, " count ", count));
        ExpectElements(
            in, [&](int64_t i) { return Value(DType::kInt32, ReduceOp::kSum, r, i, 30); }, "input");
      }
    });
}

// Strided input and output are staged; the same view is the in-place form.
TEST(GlooOutOfPlaceAllReduce, StridedTensorsAndTheSameViewWork) {
  const int n = 2;
  Ranks& ranks = SharedWorld(n);
  OnRanks(n, [&](int r) {
    ProcessGroup& g = *ranks.world[r];
    Tensor in_base = Poisoned(DType::kFloat32, {8, 2});
    Tensor out_base = Poisoned(DType::kFloat32, {8, 3});
    auto in = in_base.Narrow(1, 1, 1);
    auto out = out_base.Narrow(1, 2, 1);
    ASSERT_TRUE(in.ok() && out.ok());
    FillWith(*in, [&](int64_t i) { return Value(DType::kFloat32, ReduceOp::kMax, r, i, 31); });
    ASSERT_TRUE(Await(g.AllReduce(*in, *out, ReduceOp::kMax)).ok());
    ExpectElements(
        *out,
        [&](int64_t i) {
          return Fold(DType::kFloat32, ReduceOp::kMax, n,
                      [&](int q) { return Value(DType::kFloat32, ReduceOp::kMax, q, i, 31); });
        },
        "strided");

    Tensor same = Poisoned(DType::kFloat32, {6});
    FillWith(same, [&](int64_t i) { return Value(DType::kFloat32, ReduceOp::kSum, r, i, 32); });
    // The same buffer under another shape is the in-place form too.
    Tensor reshaped = Tensor::Contiguous(same.data(), DType::kFloat32, {2, 3});
    ASSERT_TRUE(Await(g.AllReduce(same, reshaped, ReduceOp::kSum)).ok());
    ExpectElements(
        same,
        [&](int64_t i) {
          return Fold(DType::kFloat32, ReduceOp::kSum, n,
                      [&](int q) { return Value(DType::kFloat32, ReduceOp::kSum, q, i, 32); });
        },
        "same view");
  });
}

// ---- In-place forms ---------------------------------------------------------------

class GlooInPlace : public ::testing::TestWithParam<bool> {};

TEST_P(GlooInPlace, AllGatherFromOwnChunkAndReduceScatterIntoOwnChunk) {
  const int n = 3;
  const int64_t count = 40000;  // Several shared-memory rounds.
  Ranks& ranks = SharedWorld(n, GetParam());
  OnRanks(n, [&](int r) {
    ProcessGroup& g = *ranks.world[r];
    Tensor out = Poisoned(DType::kFloat32, {n * count});
    auto own = out.Narrow(0, r * count, count);
    ASSERT_TRUE(own.ok());
    FillWith(*own, [&](int64_t i) { return Value(DType::kFloat32, ReduceOp::kSum, r, i, 16); });
    ASSERT_TRUE(Await(g.AllGather(*own, out)).ok());
    ExpectElements(
        out,
        [&](int64_t k) {
          return Value(DType::kFloat32, ReduceOp::kSum, static_cast<int>(k / count), k % count, 16);
        },
        "in-place all_gather");

    Tensor in = Poisoned(DType::kFloat32, {n * count});
    FillWith(in, [&](int64_t k) { return Value(DType::kFloat32, ReduceOp::kSum, r, k, 17); });
    auto chunk = in.Narrow(0, r * count, count);
    ASSERT_TRUE(chunk.ok());
    ASSERT_TRUE(Await(g.ReduceScatter(in, *chunk, ReduceOp::kSum)).ok());
    ExpectElements(
        *chunk,
        [&](int64_t i) {
          return Fold(DType::kFloat32, ReduceOp::kSum, n, [&](int q) {
            return Value(DType::kFloat32, ReduceOp::kSum, q, r * count + i, 17);
          });
        },
        "in-place reduce_scatter");
  });
}

INSTANTIATE_TEST_SUITE_P(TcpAndShm, GlooInPlace, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "shm" : "tcp"; });

// ---- f16 / bf16 accumulate in float -----------------------------------------------

TEST(GlooHalfPrecision, SumsRoundOncePerStepInFloat) {
  // 1 + 2^-11 is not a half; adding 2^-11 twice in half would round to 1
  // each time, but each pairwise sum is computed in float and rounded once:
  // 2 ranks: 1 + 2^-11 -> rounds to even (1.0); 1.5 + 0.25 is exact.
  Ranks& ranks = SharedWorld(2);
  OnRanks(2, [&](int r) {
    Tensor t = Poisoned(DType::kFloat16, {2});
    static_cast<Float16*>(t.data())[0] = Float16(r == 0 ? 1.0f : 0x1p-11f);
    static_cast<Float16*>(t.data())[1] = Float16(r == 0 ? 1.5f : 0.25f);
    ASSERT_TRUE(Await(ranks.world[r]->AllReduce(t, ReduceOp::kSum)).ok());
    EXPECT_EQ(static_cast<float>(static_cast<Float16*>(t.data())[0]), 1.0f);
    EXPECT_EQ(static_cast<float>(static_cast<Float16*>(t.data())[1]), 1.75f);

    Tensor b = Poisoned(DType::kBFloat16, {1});
    static_cast<BFloat16*>(b.data())[0] = BFloat16(r == 0 ? 256.0f : 3.0f);
    ASSERT_TRUE(Await(ranks.world[r]->AllReduce(b, ReduceOp::kSum)).ok());
    // 259 is not a bfloat16; nearest even is 260.
    EXPECT_EQ(static_cast<float>(static_cast<BFloat16*>(b.data())[0]), 260.0f);
  });
}

TEST(GlooHalfPrecision, MinAndMaxPropagateNaN) {
  Ranks& ranks = SharedWorld(2);
  OnRanks(2, [&](int r) {
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      Tensor t = Poisoned(DType::kFloat32, {2});
      static_cast<float*>(t.data())[0] = r == 0 ? NAN : 1.0f;
      static_cast<float*>(t.data())[1] = r == 0 ? 1.0f : NAN;
      ASSERT_TRUE(Await(ranks.world[r]->AllReduce(t, op)).ok());
      EXPECT_TRUE(std::isnan(static_cast<float*>(t.data())[0]));
      EXPECT_TRUE(std::isnan(static_cast<float*>(t.data())[1]));
    }
  });
}

// ---- Synchronous validation -------------------------------------------------------

TEST(GlooValidation, BadArgumentsFailAtOnceAndLeaveTheGroupHealthy) {
  Ranks& ranks = SharedWorld(2);
  ProcessGroup& g = *ranks.world[0];
  const auto invalid = absl::StatusCode::kInvalidArgument;
  Tensor f = Poisoned(DType::kFloat32, {4});
  Tensor f8 = Poisoned(DType::kFloat32, {8});
  Tensor i8 = Poisoned(DType::kInt32, {8});
  Tensor b = Poisoned(DType::kBool, {4});
  Tensor scalar = Poisoned(DType::kFloat32, {});
  Tensor cuda(f.data(), DType::kFloat32, {4}, {1}, Device::Cuda(0));
  Tensor broadcast_view(f.data(), DType::kFloat32, {4}, {0}, Device::Cpu());

  EXPECT_EQ(g.AllReduce(cuda, ReduceOp::kSum).status().code(), invalid);
  EXPECT_THAT(std::string(g.AllReduce(cuda, ReduceOp::kSum).status().message()),
              HasSubstr("CPU tensor"));
  EXPECT_EQ(g.AllReduce(broadcast_view, ReduceOp::kSum).status().code(), invalid);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd}) {
    EXPECT_EQ(g.AllReduce(b, op).status().code(), invalid) << ReduceOpName(op);
    EXPECT_EQ(g.Reduce(b, 0, op).status().code(), invalid) << ReduceOpName(op);
  }
  EXPECT_EQ(g.Broadcast(f, -1).status().code(), invalid);
  EXPECT_EQ(g.Broadcast(f, 2).status().code(), invalid);
  EXPECT_EQ(g.Reduce(f, 2, ReduceOp::kSum).status().code(), invalid);
  EXPECT_EQ(g.AllReduce(f, f8, ReduceOp::kSum).status().code(), invalid);    // numel
  EXPECT_EQ(g.AllReduce(f8, i8, ReduceOp::kSum).status().code(), invalid);   // dtype
  EXPECT_EQ(g.AllReduce(cuda, f, ReduceOp::kSum).status().code(), invalid);  // device
  EXPECT_EQ(g.AllReduce(f, broadcast_view, ReduceOp::kSum).status().code(), invalid);
  EXPECT_EQ(g.AllReduce(b, Poisoned(DType::kBool, {4}), ReduceOp::kSum).status().code(), invalid);
  {
    // Overlapping spans that are not the same view: [0, 4) and [2, 6).
    auto low = f8.Narrow(0, 0, 4);
    auto high = f8.Narrow(0, 2, 4);
    ASSERT_TRUE(low.ok() && high.ok());
    const absl::Status overlap = g.AllReduce(*low, *high, ReduceOp::kSum).status();
    EXPECT_EQ(overlap.code(), invalid);
    EXPECT_THAT(std::string(overlap.message()), HasSubstr("overlap"));
    // all_gather's input may be this rank's chunk of the output (rank 0:
    // elements [0, 4) of 8), nothing else of it; likewise reduce_scatter's
    // output and its input.
    EXPECT_EQ(g.AllGather(*high, f8).status().code(), invalid);
    EXPECT_EQ(g.ReduceScatter(f8, *high, ReduceOp::kSum).status().code(), invalid);
  }
  EXPECT_EQ(g.AllGather(f, f).status().code(), invalid);      // numel
  EXPECT_EQ(g.AllGather(f, i8).status().code(), invalid);     // dtype
  EXPECT_EQ(g.AllGather(cuda, f8).status().code(), invalid);  // device
  EXPECT_EQ(g.ReduceScatter(f, f, ReduceOp::kSum).status().code(), invalid);
  EXPECT_EQ(g.AllToAll(scalar, scalar).status().code(), invalid);
  Tensor odd = Poisoned(DType::kFloat32, {3});
  EXPECT_EQ(g.AllToAll(odd, odd).status().code(), invalid);                 // 3 rows, 2 ranks
  EXPECT_EQ(g.AllToAll(f, f, {1, 1, 2}, {2, 2}).status().code(), invalid);  // entries
  EXPECT_EQ(g.AllToAll(f, f, {-1, 5}, {2, 2}).status().code(), invalid);    // negative
  EXPECT_EQ(g.AllToAll(f, f, {1, 1}, {2, 2}).status().code(), invalid);     // sum
  EXPECT_EQ(g.AllToAll(f, f, {1, 3}, {2, 2}).status().code(), invalid);     // self 1 vs 2
  EXPECT_EQ(g.Send(f, 0).status().code(), invalid);                         // self
  EXPECT_EQ(g.Send(f, 2).status().code(), invalid);
  EXPECT_EQ(g.Recv(f, -1).status().code(), invalid);
  EXPECT_EQ(g.Send(f, 1, -3).status().code(), invalid);
  EXPECT_EQ(g.Recv(cuda, 1).status().code(), invalid);
  EXPECT_TRUE(g.health().ok());
  // Nothing was queued: the world still runs collectives.
  OnRanks(2, [&](int r) { EXPECT_TRUE(Await(ranks.world[r]->Barrier()).ok()); });
}

TEST(GlooValidation, AGroupOfOneRejectsPointToPoint) {
  Ranks& ranks = SharedWorld(1);
  Tensor f = Poisoned(DType::kFloat32, {4});
  EXPECT_EQ(ranks.world[0]->Send(f, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ranks.world[0]->Recv(f, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- Point to point ---------------------------------------------------------------

TEST(GlooPointToPoint, MessagesMatchInIssueOrderPerTag) {
  Ranks& ranks = SharedWorld(2);
  const int kMessages = 5;
  OnRanks(2, [&](int r) {
    ProcessGroup& g = *ranks.world[r];
    std::vector<Tensor> tensors;
    std::vector<ProcessGroup::WorkPtr> works;
    for (int m = 0; m < kMessages; ++m) {
      for (int tag : {1, 2}) {
        Tensor t = Poisoned(DType::kInt32, {3});
        if (r == 0) {
          FillWith(t, [&](int64_t i) { return m * 100 + tag * 10 + i; });
          auto w = g.Send(t, 1, tag);
          ASSERT_TRUE(w.ok());
          works.push_back(*w);
        } else {
          // Tag 2's receives are posted before tag 1's: tags are
          // independent streams.
          auto w = g.Recv(t, 0, 3 - tag);
          ASSERT_TRUE(w.ok());
          works.push_back(*w);
        }
        tensors.push_back(t);
      }
    }
    for (auto& w : works) ASSERT_TRUE(w->Wait(kTestTimeout).ok());
    if (r == 1) {
      for (int m = 0; m < kMessages; ++m) {
        for (int k = 0; k < 2; ++k) {
          const int tag = 2 - k;  // Posted as 3 - {1, 2}.
          ExpectElements(
              tensors[m * 2 + k], [&](int64_t i) { return m * 100 + tag * 10 + i; },
              absl::StrCat("message ", m, " tag ", tag));
        }
      }
    }
  });
}

// A Recv of tag 0 posted before collectives run must catch only its Send:
// the rings' segments travel on slots of their own (gloo_slots.h).
TEST(GlooPointToPoint, APendingRecvNeverCatchesACollectivesMessages) {
  const int n = 2;
  const int64_t count = 1000;
  Ranks& ranks = SharedWorld(n);
  OnRanks(n, [&](int r) {
    ProcessGroup& g = *ranks.world[r];
    const int peer = 1 - r;
    Tensor recv = Poisoned(DType::kInt32, {count});
    auto pending = g.Recv(recv, peer, 0);
    ASSERT_TRUE(pending.ok()) << pending.status();

    Tensor in = Poisoned(DType::kInt32, {count});
    FillWith(in, [&](int64_t i) { return Value(DType::kInt32, ReduceOp::kSum, r, i, 40); });
    Tensor gathered = Poisoned(DType::kInt32, {n * count});
    ASSERT_TRUE(Await(g.AllGather(in, gathered)).ok());
    Tensor reduced = Poisoned(DType::kInt32, {count});
    ASSERT_TRUE(Await(g.AllReduce(in, reduced, ReduceOp::kSum)).ok());
    Tensor chunk = Poisoned(DType::kInt32, {count / n});
    ASSERT_TRUE(Await(g.ReduceScatter(in, chunk, ReduceOp::kSum)).ok());
    EXPECT_FALSE((*pending)->IsCompleted()) << "the Recv matched a collective's message";
    ASSERT_TRUE(Await(g.Barrier()).ok());  // Both have looked before either sends.

    Tensor send = Poisoned(DType::kInt32, {count});
    FillWith(send, [&](int64_t i) { return Value(DType::kInt32, ReduceOp::kSum, r, i, 41); });
    ASSERT_TRUE(Await(g.Send(send, peer, 0)).ok());
    ASSERT_TRUE(Await(std::move(pending)).ok());
    ExpectElements(
        recv, [&](int64_t i) { return Value(DType::kInt32, ReduceOp::kSum, peer, i, 41); },
        absl::StrCat("rank ", r, " recv"));
    ExpectElements(
        gathered,
        [&](int64_t k) {
          return Value(DType::kInt32, ReduceOp::kSum, static_cast<int>(k / count), k % count, 40);
        },
        absl::StrCat("rank ", r, " all_gather"));
  });
}

// ---- Factory ------------------------------------------------------------------------

TEST(GlooFactory, NewGroupsBuildsTheFamiliesOfA2x2Mesh) {
  auto ranks = MakeRanks(4);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  OnRanks(4, [&](int r) {
    // dp groups {0,2},{1,3}; tp groups {0,1},{2,3}.
    std::vector<GroupSpec> specs = {
        {"mesh/dp", r % 2, {r % 2, r % 2 + 2}},
        {"mesh/tp", r / 2, {r / 2 * 2, r / 2 * 2 + 1}},
    };
    auto groups = (*ranks)->factories[r]->NewGroups(specs);
    ASSERT_TRUE(groups.ok()) << groups.status();
    ASSERT_EQ(groups->size(), 2u);
    ProcessGroup& dp = *(*groups)[0];
    ProcessGroup& tp = *(*groups)[1];
    EXPECT_EQ(dp.name(), absl::StrCat("mesh/dp/", r % 2));
    EXPECT_EQ(dp.rank(), r / 2);
    EXPECT_EQ(dp.global_ranks(), (std::vector<int>{r % 2, r % 2 + 2}));
    EXPECT_EQ(tp.rank(), r % 2);
    EXPECT_EQ(tp.backend(), "gloo");
    Tensor t = Poisoned(DType::kInt64, {1});
    Set(t, 0, r);
    ASSERT_TRUE(Await(dp.AllReduce(t, ReduceOp::kSum)).ok());
    EXPECT_EQ(Get(t, 0), (r % 2) + (r % 2 + 2));
    Set(t, 0, r);
    ASSERT_TRUE(Await(tp.AllReduce(t, ReduceOp::kSum)).ok());
    EXPECT_EQ(Get(t, 0), (r / 2 * 2) + (r / 2 * 2 + 1));
    // Rebuilding a family gets fresh rendezvous keys.
    auto again = (*ranks)->factories[r]->NewGroups({specs[0]});
    ASSERT_TRUE(again.ok()) << again.status();
    Set(t, 0, 1);
    ASSERT_TRUE(Await((*again)[0]->AllReduce(t, ReduceOp::kSum)).ok());
    EXPECT_EQ(Get(t, 0), 2);
  });
}

TEST(GlooFactory, WorldIsMadeOnceAndShared) {
  Ranks& ranks = SharedWorld(2);
  auto again = ranks.factories[0]->World();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), ranks.world[0].get());
  EXPECT_EQ(ranks.world[0]->name(), "world");
  EXPECT_EQ(ranks.factories[0]->address(), "127.0.0.1");
}

TEST(GlooFactory, RejectsBadSpecsAndOptions) {
  Ranks& ranks = SharedWorld(2);
  GlooProcessGroupFactory& f = *ranks.factories[0];
  const auto invalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(f.NewGroups({{"x", 0, {1}}}).status().code(), invalid);     // omits caller
  EXPECT_EQ(f.NewGroups({{"x", 0, {0, 0}}}).status().code(), invalid);  // duplicate
  EXPECT_EQ(f.NewGroups({{"x", 0, {0, 2}}}).status().code(), invalid);  // outside world
  EXPECT_EQ(f.NewGroups({{"", 0, {0}}}).status().code(), invalid);      // no family
  auto store = std::make_shared<InMemoryStore>();
  EXPECT_EQ(GlooProcessGroupFactory::Create(nullptr, 0, 1).status().code(), invalid);
  EXPECT_EQ(GlooProcessGroupFactory::Create(store, 2, 2).status().code(), invalid);
  GlooOptions bad_host = TestOptions();
  bad_host.hostname = "no-such-host.invalid";
  EXPECT_EQ(GlooProcessGroupFactory::Create(store, 0, 1, bad_host).status().code(), invalid);
  GlooOptions bad_iface = TestOptions();
  bad_iface.hostname.clear();
  bad_iface.iface = "nosuchif0";
  EXPECT_EQ(GlooProcessGroupFactory::Create(store, 0, 1, bad_iface).status().code(), invalid);
  GlooOptions bad_timeout = TestOptions();
  bad_timeout.group.timeout = absl::ZeroDuration();
  EXPECT_EQ(GlooProcessGroupFactory::Create(store, 0, 1, bad_timeout).status().code(), invalid);
}

TEST(GlooFactory, AGroupOfOneWorksWithoutPeers) {
  auto store = std::make_shared<InMemoryStore>();
  auto factory = GlooProcessGroupFactory::Create(store, 0, 2, TestOptions());
  ASSERT_TRUE(factory.ok());
  auto groups = (*factory)->NewGroups({{"solo", 0, {0}}});
  ASSERT_TRUE(groups.ok()) << groups.status();
  Tensor t = Poisoned(DType::kFloat32, {3});
  FillWith(t, [](int64_t i) { return i + 1; });
  ASSERT_TRUE(Await((*groups)[0]->AllReduce(t, ReduceOp::kAvg)).ok());
  ExpectElements(
      t, [](int64_t i) { return i + 1; }, "solo all_reduce");
}

}  // namespace process_group_gloo_test
}  // namespace mesh
