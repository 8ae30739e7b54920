// mesh-bench-launch-worker: the trivial worker of `mesh-bench launch`
// (bench/launch_bench.h). One rank of a Mesh job, started by mesh-agent:
//
//   main() ── read MESH_* ── WorkerService.Join (returns once the whole world
//   has joined: the "all ranks joined" moment) ── Leave ── write
//   $LAUNCH_BENCH_OUT/rank-<rank> ── exit 0
//
// The file holds one line, "<main_ns> <joined_ns>": CLOCK_REALTIME when
// main() started and when this rank's Join reply arrived, in nanoseconds
// since the epoch. The bench runs on the same host, so its clock is the
// same. It is written to a temp name and renamed, so the bench never reads a
// partial line.
//
// It links nothing of libmesh: a raw Join is the least a rank can do to be
// part of a job, so what the bench times is Mesh's launch path (scheduling,
// the agent's fork/exec, rendezvous) and not the worker's own setup.
//
// Exit codes: 0 done; 1 a call failed or the reply was wrong; 2 bad
// environment. Errors go to stderr (the agent's per-rank log).
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "mesh/v1/worker.grpc.pb.h"

namespace {

// Join waits for the other ranks; a launch that takes longer than this is a
// failed run, not a slow one.
constexpr double kJoinTimeoutSeconds = 60;
constexpr int kRpcSlackSeconds = 5;

int64_t RealtimeNs() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

const char* Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

bool EnvInt(const char* name, int64_t* out) {
  const char* value = Env(name);
  if (value == nullptr || !absl::SimpleAtoi(value, out)) {
    std::fprintf(stderr, "launch-worker: %s is %s; expected an integer\n", name,
                 value == nullptr ? "not set" : value);
    return false;
  }
  return true;
}

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "unknown-host";
  return name;
}

}  // namespace

int main() {
  const int64_t main_ns = RealtimeNs();
  const char* coordinator = Env("MESH_COORDINATOR");
  const char* job_id = Env("MESH_JOB_ID");
  const char* out_dir = Env("LAUNCH_BENCH_OUT");
  int64_t generation = 0, rank = 0, world_size = 0;
  if (coordinator == nullptr || job_id == nullptr || out_dir == nullptr) {
    std::fprintf(stderr,
                 "launch-worker: MESH_COORDINATOR, MESH_JOB_ID and LAUNCH_BENCH_OUT must be set "
                 "(this program is started by mesh-agent for `mesh-bench launch`)\n");
    return 2;
  }
  if (!EnvInt("MESH_GENERATION", &generation) || !EnvInt("MESH_RANK", &rank) ||
      !EnvInt("MESH_WORLD_SIZE", &world_size)) {
    return 2;
  }

  auto stub = mesh::v1::WorkerService::NewStub(
      grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
  mesh::v1::RankContext context;
  context.set_job_id(job_id);
  context.set_generation(generation);
  context.set_rank(static_cast<int32_t>(rank));
  // A fresh process picks a fresh incarnation (worker.proto RankContext).
  context.set_incarnation(std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1);

  mesh::v1::JoinRequest join;
  *join.mutable_context() = context;
  join.set_host(Hostname());
  join.set_timeout_seconds(kJoinTimeoutSeconds);
  mesh::v1::JoinResponse joined;
  {
    grpc::ClientContext call;
    call.set_wait_for_ready(true);  // The coordinator is up; ride out a slow connect.
    call.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::seconds(static_cast<int>(kJoinTimeoutSeconds) + kRpcSlackSeconds));
    const grpc::Status status = stub->Join(&call, join, &joined);
    if (!status.ok()) {
      std::fprintf(stderr, "launch-worker: rank %lld: Join(job %s, generation %lld) failed: %s\n",
                   static_cast<long long>(rank), job_id, static_cast<long long>(generation),
                   status.error_message().c_str());
      return 1;
    }
  }
  const int64_t joined_ns = RealtimeNs();
  if (joined.rank() != rank || joined.world_size() != world_size) {
    std::fprintf(stderr,
                 "launch-worker: Join reply says rank %d of %d; MESH_RANK/MESH_WORLD_SIZE say "
                 "%lld of %lld\n",
                 joined.rank(), joined.world_size(), static_cast<long long>(rank),
                 static_cast<long long>(world_size));
    return 1;
  }

  // A clean exit: without Leave the rank would later count as silent.
  {
    mesh::v1::LeaveRequest leave;
    *leave.mutable_context() = context;
    mesh::v1::LeaveResponse left;
    grpc::ClientContext call;
    call.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(kRpcSlackSeconds));
    const grpc::Status status = stub->Leave(&call, leave, &left);
    if (!status.ok()) {
      std::fprintf(stderr, "launch-worker: rank %lld: Leave failed: %s\n",
                   static_cast<long long>(rank), status.error_message().c_str());
      return 1;
    }
  }

  const std::string path = absl::StrCat(out_dir, "/rank-", rank);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream file(tmp, std::ios::trunc);
    file << main_ns << " " << joined_ns << "\n";
    file.flush();
    if (!file) {
      std::fprintf(stderr, "launch-worker: cannot write %s\n", tmp.c_str());
      return 1;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "launch-worker: cannot rename %s to %s\n", tmp.c_str(), path.c_str());
    return 1;
  }
  return 0;
}
