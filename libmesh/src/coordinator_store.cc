#include "mesh/coordinator_store.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/duration_format.h"
#include "libmesh/src/coordinator_client.h"

namespace mesh {
namespace {

// The coordinator's own timeout names the missing keys. When the transport's
// deadline fires first (a slow or lost coordinator), the message is gRPC's
// "Deadline Exceeded"; name the keys here so every timeout reads alike.
absl::Status NameKeysOnTimeout(absl::Status status, absl::Span<const std::string> keys,
                               absl::Duration timeout,
                               absl::Status (*timeout_error)(absl::Span<const std::string>,
                                                             absl::Duration)) {
  if (status.code() != absl::StatusCode::kDeadlineExceeded) return status;
  // The coordinator's message names the keys that were missing.
  for (const std::string& key : keys) {
    if (absl::StrContains(status.message(), absl::StrCat("'", key, "'"))) return status;
  }
  // Which keys were missing is unknown here, so all are named.
  return absl::DeadlineExceededError(
      absl::StrCat(timeout_error(keys, timeout).message(), " (", status.message(), ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorStore>> CoordinatorStore::Create(
    const CoordinatorStoreOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("CoordinatorStore needs the coordinator's address");
  }
  const RankIdentity& id = options.identity;
  if (id.job_id.empty()) return absl::InvalidArgumentError("CoordinatorStore needs a job id");
  if (id.rank < 0 || id.generation < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CoordinatorStore: bad identity: rank ", id.rank,
                                                   ", generation ", id.generation));
  }
  if (options.timeout <= absl::ZeroDuration() || options.timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CoordinatorStore timeout must be positive and finite, got ",
                     FormatDurationShort(options.timeout)));
  }
  if (options.rpc_margin < absl::ZeroDuration() || options.rpc_margin == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CoordinatorStore rpc_margin must be non-negative and finite, got ",
                     FormatDurationShort(options.rpc_margin)));
  }
  internal::CoordinatorClientOptions client_options;
  client_options.deadline_margin = options.rpc_margin;
  client_options.auth_token = options.auth_token;
  security::ClientSecurity security;
  security.ca_file = options.tls_ca;
  security.cert_file = options.tls_cert;
  security.key_file = options.tls_key;
  security.server_name = options.tls_server_name;
  auto client = internal::NewGrpcCoordinatorClient(options.address, security, options.identity,
                                                   client_options);
  if (!client.ok()) return client.status();
  return std::make_unique<CoordinatorStore>(*std::move(client), options.timeout);
}

CoordinatorStore::CoordinatorStore(std::shared_ptr<internal::CoordinatorClient> client,
                                   absl::Duration timeout)
    : Store(timeout), client_(std::move(client)) {
  MESH_CHECK(client_ != nullptr, "CoordinatorStore needs a client");
}

CoordinatorStore::~CoordinatorStore() = default;

const RankIdentity& CoordinatorStore::identity() const { return client_->identity(); }

const std::string& CoordinatorStore::address() const { return client_->target(); }

absl::Status CoordinatorStore::DoSet(const std::string& key, absl::string_view value) {
  return client_->KvSet(key, value, timeout());
}

absl::StatusOr<std::string> CoordinatorStore::DoGet(const std::string& key,
                                                    absl::Duration timeout) {
  auto value = client_->KvGet(key, /*wait=*/true, timeout);
  if (!value.ok()) return NameKeysOnTimeout(value.status(), {key}, timeout, &KeyTimeoutError);
  return value;
}

absl::StatusOr<std::string> CoordinatorStore::DoTryGet(const std::string& key) {
  return client_->KvGet(key, /*wait=*/false, timeout());
}

absl::Status CoordinatorStore::DoWait(absl::Span<const std::string> keys, absl::Duration timeout) {
  return NameKeysOnTimeout(client_->KvWait(keys, timeout), keys, timeout, &KeyTimeoutError);
}

absl::StatusOr<int64_t> CoordinatorStore::DoAdd(const std::string& key, int64_t delta) {
  return client_->KvAdd(key, delta, timeout());
}

absl::StatusOr<CompareSetResult> CoordinatorStore::DoCompareSet(const std::string& key,
                                                                absl::string_view expected,
                                                                absl::string_view desired) {
  std::optional<std::string> wire_expected;
  if (!expected.empty()) wire_expected = std::string(expected);
  auto reply = client_->KvCompareSet(key, std::move(wire_expected), desired, timeout());
  // c10d's empty `expected` also matches a key that holds "", which the
  // wire's "absent" does not; a second, equally atomic, call covers it.
  if (reply.ok() && expected.empty() && !reply->swapped && reply->present && reply->value.empty()) {
    reply = client_->KvCompareSet(key, std::string(), desired, timeout());
  }
  if (!reply.ok()) return reply.status();
  return CompareSetResult{reply->swapped, reply->present, std::move(reply->value)};
}

absl::StatusOr<bool> CoordinatorStore::DoDeleteKey(const std::string& key) {
  auto deleted = client_->KvDelete(key, /*prefix=*/false, timeout());
  if (!deleted.ok()) return deleted.status();
  return *deleted > 0;
}

absl::StatusOr<int64_t> CoordinatorStore::DoNumKeys() {
  auto stats = client_->KvNumKeys(timeout());
  if (!stats.ok()) return stats.status();
  return stats->num_keys;
}

absl::StatusOr<std::vector<std::string>> CoordinatorStore::DoMultiGet(
    absl::Span<const std::string> keys, absl::Duration timeout) {
  auto values = client_->KvMultiGet(keys, /*wait=*/true, timeout);
  if (!values.ok()) return NameKeysOnTimeout(values.status(), keys, timeout, &KeyTimeoutError);
  return values;
}

absl::Status CoordinatorStore::DoMultiSet(absl::Span<const std::string> keys,
                                          absl::Span<const std::string> values) {
  return client_->KvMultiSet(keys, values, timeout());
}

}  // namespace mesh
