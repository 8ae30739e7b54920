// A stand-in for mesh-coordinator and mesh-agent in the `meshctl cluster up`
// process tests, so that supervision is tested without the real binaries.
//
// It takes the real command lines (cli/cluster.h CoordinatorArgv/AgentArgv)
// and exits 2 when a flag that meshctl must pass is missing.
//
// Coordinator mode (--port-file given): serves JobService.ListNodes on
// 127.0.0.1:--port, listing as READY every agent that wrote
// <cluster state>/agent-*/registered (<cluster state> is the parent of
// --state-dir); writes --port-file atomically once serving and its pid to
// <cluster state>/coordinator.pid. Exits 0 on SIGTERM or SIGINT.
//
// Agent mode (--name given): writes <work-dir>/pid, then
// <work-dir>/registered (containing its name); exits 0 on SIGTERM or SIGINT
// and 3 on SIGUSR1 (the "dies unexpectedly" case).
//
// Control files in <cluster state>, written by a test before the start:
//   fake.coordinator-fail      the coordinator exits 4 at once
//   fake.<name>-ignore-term    that process ignores SIGTERM (so meshctl
//                              must SIGKILL it after the grace)
//   fake.<name>-no-register    that agent never writes `registered`
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "mesh/v1/job.grpc.pb.h"

namespace {

namespace fs = std::filesystem;

void WriteAtomically(const fs::path& path, const std::string& content) {
  const fs::path tmp = path.string() + ".tmp";
  std::ofstream(tmp) << content;
  fs::rename(tmp, path);
}

class FakeJobService final : public mesh::v1::JobService::Service {
 public:
  explicit FakeJobService(fs::path cluster_dir) : cluster_dir_(std::move(cluster_dir)) {}

  grpc::Status ListNodes(grpc::ServerContext*, const mesh::v1::ListNodesRequest*,
                         mesh::v1::ListNodesResponse* response) override {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(cluster_dir_, ec)) {
      if (entry.path().filename().string().rfind("agent-", 0) != 0) continue;
      std::ifstream in(entry.path() / "registered");
      std::string name;
      if (!(in >> name)) continue;
      mesh::v1::Node* node = response->add_nodes();
      node->set_name(name);
      node->set_address("127.0.0.1");
      node->set_state(mesh::v1::NODE_STATE_READY);
    }
    return grpc::Status::OK;
  }

 private:
  const fs::path cluster_dir_;
};

int Fail(const char* what) {
  std::fprintf(stderr, "fake_cluster_child: %s\n", what);
  return 2;
}

sigset_t Block(std::initializer_list<int> signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : signals) sigaddset(&set, sig);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int RunCoordinator(const std::map<std::string, std::string>& flags) {
  for (const char* required : {"--insecure", "--listen", "--port", "--state-dir"}) {
    if (!flags.contains(required)) return Fail("coordinator flag missing");
  }
  const fs::path cluster_dir = fs::path(flags.at("--state-dir")).parent_path();
  if (fs::exists(cluster_dir / "fake.coordinator-fail")) {
    std::fprintf(stderr, "fake coordinator: failing at startup as asked\n");
    return 4;
  }
  const bool ignore_term = fs::exists(cluster_dir / "fake.coordinator-ignore-term");
  const sigset_t wait_for = ignore_term ? Block({SIGINT}) : Block({SIGTERM, SIGINT});
  if (ignore_term) signal(SIGTERM, SIG_IGN);

  FakeJobService service(cluster_dir);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(flags.at("--listen") + ":" + flags.at("--port"),
                           grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return Fail("cannot listen");
  WriteAtomically(cluster_dir / "coordinator.pid", std::to_string(getpid()) + "\n");
  WriteAtomically(flags.at("--port-file"), std::to_string(port) + "\n");
  std::printf("mesh-coordinator listening on 127.0.0.1:%d\n", port);
  std::fflush(stdout);

  int sig = 0;
  sigwait(&wait_for, &sig);
  std::fprintf(stderr, "fake coordinator: stopping on signal %d\n", sig);
  server->Shutdown();
  return 0;
}

int RunAgent(const std::map<std::string, std::string>& flags) {
  for (const char* required :
       {"--coordinator", "--name", "--address", "--slots", "--gpus", "--work-dir"}) {
    if (!flags.contains(required)) return Fail("agent flag missing");
  }
  const std::string& name = flags.at("--name");
  const fs::path work_dir = flags.at("--work-dir");
  const fs::path cluster_dir = work_dir.parent_path();
  const bool ignore_term = fs::exists(cluster_dir / ("fake." + name + "-ignore-term"));
  const sigset_t wait_for =
      ignore_term ? Block({SIGINT, SIGUSR1}) : Block({SIGTERM, SIGINT, SIGUSR1});
  if (ignore_term) signal(SIGTERM, SIG_IGN);

  WriteAtomically(work_dir / "pid", std::to_string(getpid()) + "\n");
  if (!fs::exists(cluster_dir / ("fake." + name + "-no-register"))) {
    WriteAtomically(work_dir / "registered", name + "\n");
  }
  std::printf("fake agent %s: registered with %s\n", name.c_str(),
              flags.at("--coordinator").c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&wait_for, &sig);
  if (sig == SIGUSR1) {
    std::fprintf(stderr, "fake agent %s: exiting 3 as asked\n", name.c_str());
    return 3;
  }
  std::fprintf(stderr, "fake agent %s: stopping on signal %d\n", name.c_str(), sig);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc;) {
    // --insecure is the one flag without a value.
    if (std::string(argv[i]) == "--insecure" || i + 1 == argc) {
      flags[argv[i++]] = "";
      continue;
    }
    flags[argv[i]] = argv[i + 1];
    i += 2;
  }
  if (flags.contains("--port-file")) return RunCoordinator(flags);
  if (flags.contains("--name")) return RunAgent(flags);
  return Fail("neither --port-file nor --name given");
}
