#include "coordinator/service_discovery.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mesh::coordinator {

ServiceDiscovery::ServiceDiscovery(std::string path) : path_(std::move(path)) {}

std::string ServiceDiscovery::Target(const std::string& host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

void ServiceDiscovery::SetCoordinator(const std::string& target) {
  absl::MutexLock lock(&mu_);
  if (coordinator_ == target) return;
  coordinator_ = target;
  ++version_;
}

void ServiceDiscovery::SetAgent(const std::string& node, const std::string& target) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = agents_.try_emplace(node, target);
  if (!inserted && it->second == target) return;
  it->second = target;
  ++version_;
}

void ServiceDiscovery::RemoveNode(const std::string& node) {
  absl::MutexLock lock(&mu_);
  bool changed = agents_.erase(node) > 0;
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->second.node == node) {
      it = workers_.erase(it);
      changed = true;
    } else {
      ++it;
    }
  }
  if (changed) ++version_;
}

void ServiceDiscovery::SetWorker(const std::string& job, int rank, const std::string& node,
                                 const std::string& target) {
  absl::MutexLock lock(&mu_);
  Worker& worker = workers_[{job, rank}];
  if (worker.node == node && worker.target == target) return;
  worker.node = node;
  worker.target = target;
  ++version_;
}

void ServiceDiscovery::RemoveWorker(const std::string& job, int rank) {
  absl::MutexLock lock(&mu_);
  if (workers_.erase({job, rank}) > 0) ++version_;
}

void ServiceDiscovery::RemoveJob(const std::string& job) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.lower_bound({job, std::numeric_limits<int>::min()});
  bool changed = false;
  while (it != workers_.end() && it->first.first == job) {
    it = workers_.erase(it);
    changed = true;
  }
  if (changed) ++version_;
}

std::string ServiceDiscovery::ToJson() const {
  nlohmann::json groups = nlohmann::json::array();
  absl::MutexLock lock(&mu_);
  if (!coordinator_.empty()) {
    groups.push_back(
        {{"targets", {coordinator_}}, {"labels", {{"mesh_component", "coordinator"}}}});
  }
  for (const auto& [node, target] : agents_) {
    groups.push_back(
        {{"targets", {target}}, {"labels", {{"mesh_component", "agent"}, {"node", node}}}});
  }
  for (const auto& [key, worker] : workers_) {
    groups.push_back(
        {{"targets", {worker.target}},
         {"labels",
          {{"mesh_component", "worker"}, {"node", worker.node}, {"mesh_job", key.first}}}});
  }
  return groups.dump(2) + "\n";
}

absl::Status ServiceDiscovery::Flush() {
  if (path_.empty()) return absl::OkStatus();
  absl::MutexLock write_lock(&write_mu_);
  uint64_t version;
  {
    absl::MutexLock lock(&mu_);
    version = version_;
  }
  if (version == written_) return absl::OkStatus();
  // ToJson reads the state again; it is at least as new as `version`.
  const std::string content = ToJson();
  const std::string tmp = absl::StrCat(path_, ".tmp");
  auto fail = [&](const char* what) {
    const int error = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("service discovery file ", path_, ": ", what, ": ", std::strerror(error)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("cannot create the temporary file");
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return fail("cannot write");
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return fail("cannot close");
  if (::rename(tmp.c_str(), path_.c_str()) != 0) return fail("cannot rename");
  written_ = version;
  return absl::OkStatus();
}

}  // namespace mesh::coordinator
