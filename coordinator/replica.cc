#include "coordinator/replica.h"

#include <unistd.h>

#include <utility>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "coordinator/etcd_job_store.h"

namespace mesh::coordinator {

absl::StatusOr<std::unique_ptr<Replica>> Replica::Start(ReplicaOptions options) {
  std::unique_ptr<Replica> replica(new Replica());
  absl::StatusOr<std::shared_ptr<EtcdClient>> client =
      EtcdClient::Connect(EtcdClientOptionsFor(options.url, options.etcd));
  if (!client.ok()) return client.status();
  replica->client_ = *std::move(client);
  absl::StatusOr<std::unique_ptr<StandbyServer>> standby =
      StandbyServer::Start(options.listen_host, options.port, options.credentials);
  if (!standby.ok()) return standby.status();
  replica->standby_ = *std::move(standby);
  replica->port_ = replica->standby_->port();
  replica->advertised_ = options.advertise;
  if (replica->advertised_.empty()) {
    std::string host = options.listen_host;
    if (host == "0.0.0.0" || host == "::" || host == "[::]") {
      char name[256] = {};
      host = ::gethostname(name, sizeof(name) - 1) == 0 ? name : "localhost";
    }
    replica->advertised_ = absl::StrCat(host, ":", replica->port_);
  }
  replica->key_ = absl::StrCat(options.url.prefix, "/", EtcdJobStore::kLeaderKey);
  replica->election_ = std::make_unique<LeaderElection>(
      replica->client_,
      LeaderElectionOptions{replica->key_, replica->advertised_, options.lease_ttl});
  replica->options_ = std::move(options);
  return replica;
}

Replica::~Replica() = default;

absl::StatusOr<EtcdStoreOptions> Replica::WaitToLead() {
  absl::StatusOr<LeaderTerm> term = election_->Campaign([this](const std::string& leader) {
    standby_->SetLeader(leader);
    if (leader.empty()) {
      spdlog::info("standby: no replica leads; campaigning");
    } else {
      spdlog::info("standby: the leader is {}", leader);
    }
  });
  if (!term.ok()) return term.status();
  took_over_ = term->took_over;
  spdlog::info("elected leader as {} (term {}, lease TTL {}{})", advertised_, term->create_revision,
               absl::FormatDuration(options_.lease_ttl),
               took_over_ ? ", taking over from the previous leader" : "");
  standby_->Shutdown();
  EtcdStoreOptions etcd = options_.etcd;
  etcd.client = client_;
  etcd.fence_key = key_;
  etcd.fence_revision = term->create_revision;
  return etcd;
}

void Replica::KeepLeading(std::function<void(const std::string& reason)> on_lost) {
  election_->KeepLeading(std::move(on_lost));
}

absl::Status Replica::Resign() { return election_->Resign(); }

void Replica::Stop() { election_->Stop(); }

}  // namespace mesh::coordinator
