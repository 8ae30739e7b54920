// The coordinator's --store URL, and opening the JobStore it names
// (coordinator/job_store.h, docs/persistence.md, docs/ha.md):
//
//   sqlite:///var/lib/mesh/mesh.db     a SQLite file (an absolute path)
//   sqlite::memory:                    SQLite in memory: nothing durable
//   etcd://host1:2379,host2:2379/mesh  an etcd cluster, keys under /mesh
//
// etcd's TLS files come from EtcdTlsFiles; with a CA file the connection
// uses TLS. A URL says nothing secret, so it may be logged as given.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/etcd_client.h"
#include "coordinator/job_store.h"

namespace mesh::coordinator {

struct StoreUrl {
  enum class Kind { kSqlite, kEtcd };
  Kind kind = Kind::kSqlite;
  std::string sqlite_path;             // kSqlite: the file, or ":memory:".
  std::vector<std::string> endpoints;  // kEtcd: host:port, each.
  std::string prefix;                  // kEtcd: "/name[/name...]".
};

// Possible errors: INVALID_ARGUMENT naming what is wrong (an unknown scheme,
// a relative SQLite path, an etcd URL without endpoints or prefix, a port
// outside 1..65535, a prefix with a trailing slash or characters outside
// [A-Za-z0-9._-/]).
absl::StatusOr<StoreUrl> ParseStoreUrl(const std::string& url);

struct EtcdStoreOptions {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  absl::Duration call_timeout = absl::Seconds(5);
  absl::Duration connect_timeout = absl::Seconds(10);
  // The replica's leadership (coordinator/leader_election.h): when set,
  // every write of the store requires this key to have this create revision
  // (EtcdJobStore::SetFence).
  std::string fence_key;
  int64_t fence_revision = 0;
  // An etcd connection to use instead of making one.
  std::shared_ptr<EtcdClient> client;
};

// The client options of an etcd:// `url` with `etcd`'s files and deadlines.
EtcdClientOptions EtcdClientOptionsFor(const StoreUrl& url, const EtcdStoreOptions& etcd);

// Opens the store `url` names. The errors of ParseStoreUrl, then those of
// SqliteJobStore::Open or of EtcdClient::Connect and EtcdJobStore::Open.
absl::StatusOr<std::unique_ptr<JobStore>> OpenJobStore(const StoreUrl& url, const Clock* clock,
                                                       const EtcdStoreOptions& etcd = {});

}  // namespace mesh::coordinator
