// elastic_train: a data-parallel step loop that survives the loss of a
// replica (in-place recovery, docs/elastic.md).
//
// Submit it with restart_policy IN_PLACE and a mesh with a "dp" dim:
//
//   meshctl submit --nodes 1 --nproc-per-node 4 --mesh-shape 4,1 --dim-names dp,tp
//       --restart-policy in_place --max-restarts 3 -- elastic_train --steps 500
//
// (one command line)
//
// Each step it calls ElasticMesh::Sync(), all-reduces a vector of ones over
// "dp" (every element ends as the number of replicas) and adds the result to
// its weights. The state (weights and step) is what a replacement process
// takes from a live peer. A step whose collective failed is not committed.
//
// Every committed step prints one line to stdout:
//
//   step S replicas R sum X epoch E pid P ms T
//
// and, with --die-at-step K, rank --die-rank exits with code 3 after
// committing step K (only the process that started with the job: its
// replacement carries on). --restart-delay-ms D makes a process started
// after a restart (TORCHELASTIC_RESTART_COUNT > 0, as the agent sets it)
// wait D ms before it joins, as a real replacement spends loading its
// framework and data.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/mesh.h"

namespace {

struct Flags {
  int64_t steps = 100;
  int step_ms = 20;
  int64_t die_at_step = -1;
  int die_rank = -1;
  std::string gloo_host;
  int restart_delay_ms = 0;
};

absl::Status Train(mesh::Runtime& rt, const Flags& flags) {
  std::vector<float> weights(4, 0.0f);
  int64_t step = 0;
  mesh::ElasticMeshOptions options;
  options.timeout = absl::Minutes(2);
  options.state = [&]() -> absl::StatusOr<std::vector<mesh::Tensor>> {
    return std::vector<mesh::Tensor>{
        mesh::Tensor::Contiguous(weights.data(), mesh::DType::kFloat32, {4}),
        mesh::Tensor::Contiguous(&step, mesh::DType::kInt64, {1})};
  };
  absl::StatusOr<std::unique_ptr<mesh::ElasticMesh>> elastic =
      mesh::ElasticMesh::Create(rt, options);
  if (!elastic.ok()) return elastic.status();
  const bool original = rt.info().membership_epoch == 0;
  if (!original) {
    std::printf("rank %d: replacement, took step %lld from rank %d\n", rt.rank(),
                static_cast<long long>(step), (*elastic)->last_donor().value_or(-1));
    std::fflush(stdout);
  }
  // Consecutive Sync timeouts while waiting outside the mesh.
  int outside = 0;
  while (step < flags.steps) {
    absl::StatusOr<bool> changed = (*elastic)->Sync();
    if (!changed.ok()) {
      // Not a member (its replica misses a rank): keep waiting for the
      // replacement a while, then give up.
      if (changed.status().code() == absl::StatusCode::kDeadlineExceeded &&
          !(*elastic)->is_member() && ++outside < 5) {
        continue;
      }
      return changed.status();
    }
    outside = 0;
    if (!(*elastic)->is_member()) continue;
    absl::StatusOr<std::shared_ptr<mesh::ProcessGroup>> dp = (*elastic)->mesh().GetGroup("dp");
    if (!dp.ok()) return dp.status();
    // A tensor that owns its memory, held by the op: a step given up on an
    // error never leaves the op writing into memory this loop has freed.
    absl::StatusOr<mesh::Tensor> ones = mesh::Tensor::Empty(mesh::DType::kFloat32, {4});
    if (!ones.ok()) return ones.status();
    if (absl::Status s = mesh::Fill(*ones, 1.0); !s.ok()) return s;
    absl::StatusOr<mesh::ProcessGroup::WorkPtr> work =
        (*dp)->AllReduce(*ones, mesh::ReduceOp::kSum);
    if (!work.ok()) continue;
    if (absl::Status s = (*work)->Wait(absl::Minutes(2)); !s.ok()) {
      std::printf("rank %d: step %lld not committed: %s\n", rt.rank(),
                  static_cast<long long>(step + 1), s.ToString().c_str());
      std::fflush(stdout);
      continue;
    }
    const float* sum = ones->data_as<float>();
    for (int i = 0; i < 4; ++i) weights[i] += sum[i];
    ++step;
    std::printf("step %lld replicas %lld sum %g epoch %lld pid %d ms %lld\n",
                static_cast<long long>(step), static_cast<long long>((*elastic)->replicas()),
                static_cast<double>(sum[0]), static_cast<long long>((*elastic)->membership_epoch()),
                static_cast<int>(getpid()),
                static_cast<long long>(absl::ToUnixMillis(absl::Now())));
    std::fflush(stdout);
    if (original && rt.rank() == flags.die_rank && step == flags.die_at_step) {
      std::printf("rank %d: dying at step %lld on purpose\n", rt.rank(),
                  static_cast<long long>(step));
      std::fflush(stdout);
      _exit(3);
    }
    if (flags.step_ms > 0) absl::SleepFor(absl::Milliseconds(flags.step_ms));
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A data-parallel loop that survives the loss of a replica (docs/elastic.md)."};
  Flags flags;
  app.add_option("--steps", flags.steps, "Steps to run")->check(CLI::PositiveNumber);
  app.add_option("--step-ms", flags.step_ms, "Sleep after each step, milliseconds")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--die-at-step", flags.die_at_step, "Step after which --die-rank exits");
  app.add_option("--die-rank", flags.die_rank, "Rank that exits at --die-at-step");
  app.add_option("--gloo-host", flags.gloo_host, "Address Gloo binds and advertises");
  app.add_option("--restart-delay-ms", flags.restart_delay_ms,
                 "After a restart, wait this long before joining")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (flags.restart_delay_ms > 0 && restarts != nullptr && std::string(restarts) != "0") {
    absl::SleepFor(absl::Milliseconds(flags.restart_delay_ms));
  }

  mesh::RuntimeOptions options;
  mesh::GlooOptions gloo;
  gloo.hostname = flags.gloo_host;
  options.backend = mesh::GlooBackend(gloo);
  absl::StatusOr<std::unique_ptr<mesh::Runtime>> rt = mesh::Runtime::Init(std::move(options));
  if (!rt.ok()) {
    std::fprintf(stderr, "elastic_train: %s\n", rt.status().ToString().c_str());
    return 1;
  }
  const absl::Status done = (*rt)->Finish(Train(**rt, flags));
  if (!done.ok()) {
    std::fprintf(stderr, "elastic_train rank %d: %s\n", (*rt)->rank(), done.ToString().c_str());
    return 1;
  }
  return 0;
}
