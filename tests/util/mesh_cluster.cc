#include "tests/util/mesh_cluster.h"

#include "tests/util/proc.h"

#include <signal.h>
#include <stdlib.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace mesh::testing {

namespace {

constexpr absl::Duration kStartTimeout = absl::Seconds(30);
constexpr char kBanner[] = "mesh-coordinator listening on ";

}  // namespace

std::vector<std::string> CoordinatorArgv(const std::string& binary, const std::string& listen,
                                         int port, const std::string& state_dir,
                                         absl::Duration node_interval,
                                         absl::Duration node_timeout) {
  return {binary,
          "--insecure",
          "--listen",
          listen,
          "--port",
          absl::StrCat(port),
          "--state-dir",
          state_dir,
          "--node-heartbeat-interval",
          absl::StrCat(absl::ToDoubleSeconds(node_interval)),
          "--node-heartbeat-timeout",
          absl::StrCat(absl::ToDoubleSeconds(node_timeout)),
          "--kill-grace",
          "1",
          "--shutdown-grace",
          "0.5"};
}

std::vector<std::string> AgentArgv(const std::string& binary, const std::string& coordinator,
                                   const std::string& name, const std::string& address, int slots,
                                   const std::string& work_dir, const std::string& gpus) {
  return {binary,
          "--coordinator",
          coordinator,
          "--name",
          name,
          "--address",
          address,
          "--slots",
          absl::StrCat(slots),
          "--gpus",
          gpus,
          "--work-dir",
          work_dir,
          "--grace",
          "1",
          "--unowned-job-user",
          CurrentUserName()};
}

absl::StatusOr<StartedCoordinator> StartCoordinatorProcess(const std::vector<std::string>& argv,
                                                           const std::vector<std::string>& env) {
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv, env);
  if (!process.ok()) return process.status();
  absl::StatusOr<std::string> line = process->ReadLine(kStartTimeout);
  if (!line.ok()) return line.status();
  if (!absl::StartsWith(*line, kBanner)) {
    return absl::FailedPreconditionError(absl::StrCat("coordinator printed: ", *line));
  }
  StartedCoordinator started;
  started.address = line->substr(sizeof(kBanner) - 1);
  if (!absl::SimpleAtoi(started.address.substr(started.address.rfind(':') + 1), &started.port)) {
    return absl::FailedPreconditionError(absl::StrCat("no port in banner: ", *line));
  }
  started.process = std::make_unique<Subprocess>(*std::move(process));
  return started;
}

std::shared_ptr<grpc::Channel> NewPrivateChannel(const std::string& address) {
  grpc::ChannelArguments args;
  // A fresh connection of its own, not one shared with other channels.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

MeshCluster::MeshCluster(MeshClusterBinaries binaries, const std::string& prefix)
    : binaries_(std::move(binaries)) {
  std::string pattern = absl::StrCat("/tmp/", prefix, "-XXXXXX");
  const char* dir = mkdtemp(pattern.data());
  dir_ = dir == nullptr ? "/tmp" : dir;
  state_dir_ = dir_ + "/state";
}

MeshCluster::~MeshCluster() {
  agents_.clear();  // SIGKILL + reap, each.
  coordinator_.reset();
  if (dir_ != "/tmp") std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
}

absl::Status MeshCluster::StartCoordinator(int port, const std::vector<std::string>& extra,
                                           absl::Duration node_timeout) {
  std::vector<std::string> argv = CoordinatorArgv(
      binaries_.coordinator, "127.0.0.1", port, state_dir_, absl::Milliseconds(200), node_timeout);
  argv.insert(argv.end(), extra.begin(), extra.end());
  absl::StatusOr<StartedCoordinator> started = StartCoordinatorProcess(argv, coordinator_env_);
  if (!started.ok()) return started.status();
  address_ = started->address;
  port_ = started->port;
  coordinator_ = std::move(started->process);
  channel_ = NewChannel();
  jobs_ = mesh::v1::JobService::NewStub(channel_);
  workers_ = mesh::v1::WorkerService::NewStub(channel_);
  admin_ = mesh::v1::AdminService::NewStub(channel_);
  return absl::OkStatus();
}

absl::Status MeshCluster::KillCoordinator() {
  if (coordinator_ == nullptr) return absl::OkStatus();
  coordinator_->Signal(SIGKILL);
  absl::StatusOr<int> status = coordinator_->Wait(absl::Seconds(10));
  coordinator_.reset();
  return status.status();
}

pid_t MeshCluster::coordinator_pid() const {
  return coordinator_ == nullptr ? -1 : coordinator_->pid();
}

absl::Status MeshCluster::StartAgent(int i, int slots, const std::string& gpus,
                                     const std::vector<std::string>& extra,
                                     const std::vector<std::string>& prefix) {
  std::vector<std::string> argv = prefix;
  for (std::string& arg : AgentArgv(binaries_.agent, address_, absl::StrCat("node-", i),
                                    "127.0.0.1", slots, absl::StrCat(dir_, "/agent-", i), gpus)) {
    argv.push_back(std::move(arg));
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv);
  if (!process.ok()) return process.status();
  if (static_cast<int>(agents_.size()) <= i) agents_.resize(i + 1);
  agents_[i] = std::make_unique<Subprocess>(*std::move(process));
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> MeshCluster::NewChannel() const {
  return NewPrivateChannel(address_);
}

int MeshCluster::ReadyNodes() { return ::mesh::testing::ReadyNodes(*jobs_).value_or(-1); }

int MeshCluster::NodesSeenSince(absl::Time since) {
  return CountNodes(*jobs_,
                    [since](const mesh::v1::Node& node) {
                      return absl::FromUnixMillis(node.last_seen_unix_ms()) >= since;
                    })
      .value_or(-1);
}

}  // namespace mesh::testing
