// A worker for exit_without_leave_test: joins its job over raw
// WorkerService calls (the agent's MESH_* environment), then
//   - the rank named by EXIT_RANK exits 0 at once, without Leave;
//   - every other rank waits at barrier "step" with a 120 s timeout and
//     writes "<code> <seconds>\n<message>\n" of the outcome to
//     $RESULT_DIR/rank-<r>.txt, then exits 0 if the barrier passed, 3 if not.
// It never heartbeats; the test runs the coordinator with a long heartbeat
// timeout, so liveness cannot be what ends the barrier.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

int Int(const char* name) {
  int value = -1;
  if (!absl::SimpleAtoi(Env(name), &value)) {
    std::fprintf(stderr, "worker: bad %s='%s'\n", name, Env(name).c_str());
    std::exit(2);
  }
  return value;
}

}  // namespace

int main() {
  // The job fails the moment the barrier does, and its KILL order (SIGTERM,
  // SIGKILL after the grace) must not beat the result file.
  signal(SIGTERM, SIG_IGN);
  const int rank = Int("MESH_RANK");
  const int exit_rank = Int("EXIT_RANK");
  auto channel = grpc::CreateChannel(Env("MESH_COORDINATOR"), grpc::InsecureChannelCredentials());
  auto stub = mesh::v1::WorkerService::NewStub(channel);
  mesh::v1::RankContext context;
  context.set_job_id(Env("MESH_JOB_ID"));
  context.set_generation(Int("MESH_GENERATION"));
  context.set_rank(rank);
  context.set_incarnation(static_cast<uint64_t>(getpid()));

  mesh::v1::JoinRequest join;
  *join.mutable_context() = context;
  join.set_host(Env("MESH_NODE_NAME").empty() ? "localhost" : Env("MESH_NODE_NAME"));
  join.set_timeout_seconds(60);
  mesh::v1::JoinResponse joined;
  grpc::ClientContext join_context;
  join_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(65)));
  const grpc::Status join_status = stub->Join(&join_context, join, &joined);
  if (!join_status.ok()) {
    std::fprintf(stderr, "worker rank %d: join: %s\n", rank, join_status.error_message().c_str());
    return 2;
  }
  std::printf("rank %d joined\n", rank);
  std::fflush(stdout);
  if (rank == exit_rank) _exit(0);  // No Leave: an exit the job did not plan.

  mesh::v1::BarrierRequest barrier;
  *barrier.mutable_context() = context;
  barrier.set_name("step");
  barrier.set_timeout_seconds(120);
  mesh::v1::BarrierResponse passed;
  grpc::ClientContext barrier_context;
  barrier_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(125)));
  const absl::Time start = absl::Now();
  const grpc::Status status = stub->Barrier(&barrier_context, barrier, &passed);
  const double took = absl::ToDoubleSeconds(absl::Now() - start);
  std::ofstream(absl::StrCat(Env("RESULT_DIR"), "/rank-", rank, ".txt"))
      << static_cast<int>(status.error_code()) << " " << took << "\n"
      << status.error_message() << "\n";
  std::printf("rank %d barrier after %.3f s: %d %s\n", rank, took,
              static_cast<int>(status.error_code()), status.error_message().c_str());
  return status.ok() ? 0 : 3;
}
