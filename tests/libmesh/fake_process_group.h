// FakeGroup: a ProcessGroup for tests of code that makes, holds or aborts
// groups without running collectives (DeviceMesh, the Runtime's decorating
// factory). Every op is UNIMPLEMENTED; Abort records its first reason as
// health() and counts the calls.
//
// Thread safety: thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "mesh/process_group.h"

namespace mesh::testing {

class FakeGroup final : public ProcessGroup {
 public:
  FakeGroup(int rank, std::vector<int> ranks, std::string name)
      : ProcessGroup(rank, std::move(ranks), std::move(name), ProcessGroupOptions{}) {}

  absl::string_view backend() const override { return "fake"; }
  absl::StatusOr<WorkPtr> AllReduce(Tensor, ReduceOp) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> AllReduce(Tensor, Tensor, ReduceOp) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> Broadcast(Tensor, int) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> Reduce(Tensor, int, ReduceOp) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> AllGather(Tensor, Tensor) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> ReduceScatter(Tensor, Tensor, ReduceOp) override {
    return Unimplemented();
  }
  absl::StatusOr<WorkPtr> AllToAll(Tensor, Tensor, std::vector<int64_t>,
                                   std::vector<int64_t>) override {
    return Unimplemented();
  }
  absl::StatusOr<WorkPtr> Send(Tensor, int, int) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> Recv(Tensor, int, int) override { return Unimplemented(); }
  absl::StatusOr<WorkPtr> Barrier() override { return Unimplemented(); }
  void Abort(absl::Status reason) override {
    absl::MutexLock lock(&mu_);
    ++aborts_;
    if (health_.ok()) health_ = std::move(reason);
  }
  absl::Status health() const override {
    absl::MutexLock lock(&mu_);
    return health_;
  }
  // How many times Abort was called.
  int aborts() const {
    absl::MutexLock lock(&mu_);
    return aborts_;
  }

 private:
  static absl::Status Unimplemented() { return absl::UnimplementedError("fake group"); }
  mutable absl::Mutex mu_;
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  int aborts_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mesh::testing
