#include "coordinator/store_url.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "coordinator/etcd_client.h"
#include "coordinator/etcd_job_store.h"
#include "coordinator/sqlite_job_store.h"

namespace mesh::coordinator {
namespace {

absl::Status Bad(const std::string& url, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("--store '", url, "': ", why,
                   " (expected sqlite:///absolute/path.db, sqlite::memory: or "
                   "etcd://host:port[,host:port...]/prefix)"));
}

}  // namespace

absl::StatusOr<StoreUrl> ParseStoreUrl(const std::string& url) {
  StoreUrl parsed;
  absl::string_view rest = url;
  if (url == "sqlite::memory:") {
    parsed.kind = StoreUrl::Kind::kSqlite;
    parsed.sqlite_path = ":memory:";
    return parsed;
  }
  if (absl::ConsumePrefix(&rest, "sqlite://")) {
    if (rest.empty() || rest.front() != '/') {
      return Bad(url, "a SQLite path must be absolute (three slashes: sqlite:///var/lib/...)");
    }
    if (rest.back() == '/') return Bad(url, "the SQLite path names a directory");
    parsed.kind = StoreUrl::Kind::kSqlite;
    parsed.sqlite_path = std::string(rest);
    return parsed;
  }
  if (absl::ConsumePrefix(&rest, "etcd://")) {
    parsed.kind = StoreUrl::Kind::kEtcd;
    const size_t slash = rest.find('/');
    if (slash == absl::string_view::npos || slash + 1 == rest.size()) {
      return Bad(url, "an etcd URL needs a key prefix after the endpoints (etcd://host:2379/mesh)");
    }
    const absl::string_view hosts = rest.substr(0, slash);
    parsed.prefix = std::string(rest.substr(slash));
    if (hosts.empty()) return Bad(url, "no etcd endpoints");
    for (absl::string_view endpoint : absl::StrSplit(hosts, ',')) {
      const size_t colon = endpoint.rfind(':');
      int port = 0;
      if (colon == absl::string_view::npos || colon == 0 ||
          !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port < 1 || port > 65535) {
        return Bad(url, absl::StrCat("endpoint '", endpoint, "' is not host:port (port 1..65535)"));
      }
      parsed.endpoints.emplace_back(endpoint);
    }
    if (parsed.prefix.back() == '/') return Bad(url, "the key prefix ends with '/'");
    for (char c : parsed.prefix) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-' || c == '/';
      if (!ok) {
        return Bad(url, absl::StrCat("the key prefix has the character '", std::string(1, c),
                                     "' (letters, digits, '.', '_', '-' and '/' only)"));
      }
    }
    if (absl::StrContains(parsed.prefix, "//")) return Bad(url, "the key prefix has an empty name");
    return parsed;
  }
  return Bad(url, "unknown scheme");
}

EtcdClientOptions EtcdClientOptionsFor(const StoreUrl& url, const EtcdStoreOptions& etcd) {
  EtcdClientOptions options;
  options.endpoints = url.endpoints;
  options.ca_file = etcd.ca_file;
  options.cert_file = etcd.cert_file;
  options.key_file = etcd.key_file;
  options.call_timeout = etcd.call_timeout;
  options.connect_timeout = etcd.connect_timeout;
  return options;
}

absl::StatusOr<std::unique_ptr<JobStore>> OpenJobStore(const StoreUrl& url, const Clock* clock,
                                                       const EtcdStoreOptions& etcd) {
  if (url.kind == StoreUrl::Kind::kSqlite) {
    absl::StatusOr<std::unique_ptr<SqliteJobStore>> store =
        SqliteJobStore::Open(url.sqlite_path, clock);
    if (!store.ok()) return store.status();
    return std::unique_ptr<JobStore>(*std::move(store));
  }
  std::shared_ptr<EtcdClient> client = etcd.client;
  if (client == nullptr) {
    absl::StatusOr<std::shared_ptr<EtcdClient>> connected =
        EtcdClient::Connect(EtcdClientOptionsFor(url, etcd));
    if (!connected.ok()) return connected.status();
    client = *std::move(connected);
  }
  absl::StatusOr<std::unique_ptr<EtcdJobStore>> store =
      EtcdJobStore::Open(std::move(client), url.prefix, clock);
  if (!store.ok()) return store.status();
  if (etcd.fence_revision != 0) (*store)->SetFence(etcd.fence_key, etcd.fence_revision);
  return std::unique_ptr<JobStore>(*std::move(store));
}

}  // namespace mesh::coordinator
