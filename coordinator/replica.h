// Replica: a coordinator on an etcd store before it leads (docs/ha.md). It
// connects to etcd, serves the standby server on the coordinator's address
// (every RPC: UNAVAILABLE naming the leader) and campaigns; once elected it
// stops the standby server and hands back what the store needs to fence
// every write by its term. main.cc then starts the CoordinatorServer on the
// same address and keeps the leadership renewed through KeepLeading.
//
// Thread safety: one owner calls Start, WaitToLead, KeepLeading and Resign
// in that order; Stop from any thread (a signal watcher).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/etcd_client.h"
#include "coordinator/leader_election.h"
#include "coordinator/standby_server.h"
#include "coordinator/store_url.h"

namespace mesh::coordinator {

struct ReplicaOptions {
  StoreUrl url;  // An etcd:// store.
  EtcdStoreOptions etcd;
  std::string listen_host;
  int port = 0;
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // host:port that clients reach this replica at; empty: listen_host:port,
  // or this host's name for a wildcard listen_host.
  std::string advertise;
  absl::Duration lease_ttl = absl::Seconds(5);
};

class Replica {
 public:
  // Possible errors: those of EtcdClient::Connect; UNAVAILABLE when the
  // standby server cannot bind its address.
  static absl::StatusOr<std::unique_ptr<Replica>> Start(ReplicaOptions options);
  ~Replica();

  // The bound port (the leader's server binds it too) and the address this
  // replica is known by.
  int port() const { return port_; }
  const std::string& advertised() const { return advertised_; }
  const std::string& election_key() const { return key_; }

  // Campaigns until this replica leads. Then the standby server is stopped
  // and the result is options.etcd with the fence and the etcd connection
  // filled in, to open the store with.
  // Possible errors: CANCELLED after Stop(); those of
  // LeaderElection::Campaign.
  absl::StatusOr<EtcdStoreOptions> WaitToLead();

  // After WaitToLead: whether another replica led before this one took
  // over (LeaderTerm::took_over).
  bool took_over() const { return took_over_; }

  // After WaitToLead: see LeaderElection::KeepLeading.
  void KeepLeading(std::function<void(const std::string& reason)> on_lost);
  // Hands the leadership over at once (at a clean shutdown).
  absl::Status Resign();
  void Stop();

 private:
  Replica() = default;

  ReplicaOptions options_;
  std::shared_ptr<EtcdClient> client_;
  std::unique_ptr<StandbyServer> standby_;
  std::unique_ptr<LeaderElection> election_;
  std::string key_;
  std::string advertised_;
  int port_ = 0;
  bool took_over_ = false;
};

}  // namespace mesh::coordinator
