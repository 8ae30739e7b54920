#include "backends/nccl/unique_id_broker.h"

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace mesh::nccl {
namespace {

absl::Status Prefixed(const absl::Status& status, absl::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

// The checks every broker applies, whatever its transport.
absl::Status CheckIdsToPublish(absl::Span<const std::pair<std::string, std::string>> ids) {
  for (const auto& [key, id] : ids) {
    if (id.size() != kUniqueIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat("NCCL unique id for '", key, "' has ",
                                                     id.size(), " bytes, not ", kUniqueIdBytes));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFetchedIds(absl::Span<const std::string> keys,
                             const std::vector<std::string>& values) {
  if (values.size() != keys.size()) {
    return absl::InternalError(
        absl::StrCat("broker returned ", values.size(), " ids for ", keys.size(), " keys"));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (values[i].size() != kUniqueIdBytes) {
      return absl::DataLossError(absl::StrCat("NCCL unique id under '", keys[i], "' has ",
                                              values[i].size(), " bytes, not ", kUniqueIdBytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

StoreUniqueIdBroker::StoreUniqueIdBroker(std::shared_ptr<Store> store) : store_(std::move(store)) {
  MESH_CHECK(store_ != nullptr, "StoreUniqueIdBroker needs a store");
}

absl::Status StoreUniqueIdBroker::Publish(
    absl::Span<const std::pair<std::string, std::string>> ids) {
  if (ids.empty()) return absl::OkStatus();
  if (absl::Status s = CheckIdsToPublish(ids); !s.ok()) return s;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  keys.reserve(ids.size());
  values.reserve(ids.size());
  for (const auto& [key, id] : ids) {
    keys.push_back(key);
    values.push_back(id);
  }
  return store_->MultiSet(keys, values);
}

absl::StatusOr<std::vector<std::string>> StoreUniqueIdBroker::Get(
    absl::Span<const std::string> keys, absl::Time deadline) {
  if (keys.empty()) return std::vector<std::string>{};
  const absl::Duration timeout = deadline - absl::Now();
  if (timeout <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "no time left to fetch ", keys.size(), " NCCL unique id(s), first '", keys.front(), "'"));
  }
  absl::StatusOr<std::vector<std::string>> values = store_->MultiGet(keys, timeout);
  if (!values.ok()) return values.status();
  if (absl::Status s = CheckFetchedIds(keys, *values); !s.ok()) return s;
  return values;
}

CallbackUniqueIdBroker::CallbackUniqueIdBroker(PublishFn publish, GetFn get)
    : publish_(std::move(publish)), get_(std::move(get)) {
  MESH_CHECK(publish_ != nullptr && get_ != nullptr, "CallbackUniqueIdBroker needs both callbacks");
}

absl::Status CallbackUniqueIdBroker::Publish(
    absl::Span<const std::pair<std::string, std::string>> ids) {
  if (ids.empty()) return absl::OkStatus();
  if (absl::Status s = CheckIdsToPublish(ids); !s.ok()) return s;
  return publish_(ids);
}

absl::StatusOr<std::vector<std::string>> CallbackUniqueIdBroker::Get(
    absl::Span<const std::string> keys, absl::Time deadline) {
  if (keys.empty()) return std::vector<std::string>{};
  absl::StatusOr<std::vector<std::string>> values = get_(keys, deadline);
  if (!values.ok()) return values.status();
  if (absl::Status s = CheckFetchedIds(keys, *values); !s.ok()) return s;
  return values;
}

std::string UniqueIdKey(uint64_t call, const GroupSpec& spec) {
  if (call == kMembersOnlyCall) {
    return absl::StrCat("nccl/uid/members/", spec.family, "/", spec.color);
  }
  return absl::StrCat("nccl/uid/", call, "/", spec.family, "/", spec.color);
}

absl::StatusOr<std::vector<std::string>> ExchangeUniqueIds(
    absl::Span<const GroupSpec> specs, int world_rank, uint64_t call, NcclUniqueIdBroker& broker,
    absl::FunctionRef<absl::StatusOr<std::string>()> generate, absl::Time deadline) {
  const std::string context =
      absl::StrCat("rank ", world_rank, ", NewGroups call ", call, ": NCCL unique-id exchange");
  std::vector<std::string> ids(specs.size());
  std::vector<std::pair<std::string, std::string>> to_publish;
  std::vector<std::string> to_fetch;
  std::vector<size_t> fetch_index;
  for (size_t i = 0; i < specs.size(); ++i) {
    const GroupSpec& spec = specs[i];
    const bool leads = spec.global_ranks.front() == world_rank;
    if (leads) {
      absl::StatusOr<std::string> id = generate();
      if (!id.ok()) return Prefixed(id.status(), context);
      if (id->size() != kUniqueIdBytes) {
        return absl::InternalError(absl::StrCat(context, ": generated id has ", id->size(),
                                                " bytes, not ", kUniqueIdBytes));
      }
      ids[i] = *id;
      // A group of one has no one to tell.
      if (spec.global_ranks.size() > 1) to_publish.emplace_back(UniqueIdKey(call, spec), *id);
    } else {
      to_fetch.push_back(UniqueIdKey(call, spec));
      fetch_index.push_back(i);
    }
  }
  // Publish before fetching: two ranks that each lead one group and need the
  // other's would otherwise wait for each other.
  if (absl::Status s = broker.Publish(to_publish); !s.ok()) return Prefixed(s, context);
  absl::StatusOr<std::vector<std::string>> fetched = broker.Get(to_fetch, deadline);
  if (!fetched.ok()) return Prefixed(fetched.status(), context);
  if (fetched->size() != to_fetch.size()) {
    return absl::InternalError(absl::StrCat(context, ": broker returned ", fetched->size(),
                                            " ids for ", to_fetch.size(), " keys"));
  }
  for (size_t j = 0; j < fetch_index.size(); ++j) ids[fetch_index[j]] = std::move((*fetched)[j]);
  return ids;
}

}  // namespace mesh::nccl
