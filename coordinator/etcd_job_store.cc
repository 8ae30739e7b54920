#include "coordinator/etcd_job_store.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/check.h"
#include "mesh/store/v1/records.pb.h"

// File-local; #undef'd at the end.
#define ETCD_STORE_RETURN_IF_ERROR(expr) \
  do {                                   \
    absl::Status _status = (expr);       \
    if (!_status.ok()) return _status;   \
  } while (false)

namespace mesh::coordinator {
namespace {

namespace spb = ::mesh::store::v1;

// How often a write re-reads and tries again when another writer got in
// between its read and its Txn. Each retry follows someone else's commit,
// so this bounds contention, not time.
constexpr int kMaxConflictRetries = 64;
// Keys read per Range while listing.
constexpr int64_t kListBatch = 256;

std::string Padded(int64_t n) { return absl::StrFormat("%020d", n); }

absl::Status PrefixError(const std::string& prefix, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("etcd key prefix '", prefix, "' ", why,
                   " (write it as /name or /name/name..., of letters, digits, '.', '_' and '-')"));
}

absl::Status CheckPrefix(const std::string& prefix) {
  if (prefix.size() < 2 || prefix.front() != '/') return PrefixError(prefix, "is not absolute");
  if (prefix.back() == '/') return PrefixError(prefix, "ends with '/'");
  for (absl::string_view part : absl::StrSplit(prefix.substr(1), '/')) {
    if (part.empty()) return PrefixError(prefix, "has an empty name");
    for (char c : part) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
        return PrefixError(prefix, absl::StrCat("has the character '", std::string(1, c), "'"));
      }
    }
  }
  return absl::OkStatus();
}

uint64_t RandomToken() {
  static thread_local std::mt19937_64 random{std::random_device{}()};
  uint64_t token = 0;
  while (token == 0) token = random();
  return token;
}

spb::JobRecord ToProto(const JobRecord& job, int64_t number, uint64_t create_token) {
  spb::JobRecord p;
  p.set_number(number);
  p.set_idempotency_key(job.idempotency_key);
  p.set_name(job.name);
  p.set_state(job.state);
  p.set_pending_reason(job.pending_reason);
  p.set_generation(job.generation);
  p.set_restarts(job.restarts);
  p.set_spec(job.spec);
  p.set_root_cause(job.root_cause);
  p.set_placement(job.placement);
  p.set_resizes(job.resizes);
  p.set_owner(job.owner);
  p.set_version(job.version);
  p.set_created_at_us(absl::ToUnixMicros(job.created_at));
  p.set_updated_at_us(absl::ToUnixMicros(job.updated_at));
  p.set_create_token(create_token);
  return p;
}

JobRecord FromProto(const spb::JobRecord& p) {
  JobRecord job;
  job.id = job_store::JobId(p.number());
  job.idempotency_key = p.idempotency_key();
  job.name = p.name();
  job.state = p.state();
  job.pending_reason = p.pending_reason();
  job.generation = p.generation();
  job.restarts = p.restarts();
  job.spec = p.spec();
  job.root_cause = p.root_cause();
  job.placement = p.placement();
  job.resizes = p.resizes();
  job.owner = p.owner();
  job.version = p.version();
  job.created_at = absl::FromUnixMicros(p.created_at_us());
  job.updated_at = absl::FromUnixMicros(p.updated_at_us());
  return job;
}

std::string EventValue(const JobEvent& event) {
  spb::JobEvent p;
  p.set_seq(event.seq);
  p.set_time_us(absl::ToUnixMicros(event.time));
  p.set_from_state(event.from_state);
  p.set_to_state(event.to_state);
  p.set_reason(event.reason);
  p.set_generation(event.generation);
  return p.SerializeAsString();
}

std::string NodeValue(const NodeRecord& node) {
  spb::NodeRecord p;
  p.set_name(node.name);
  p.set_address(node.address);
  p.set_slots(node.slots);
  p.set_gpus(node.gpus);
  p.set_state(node.state);
  p.set_last_seen_us(absl::ToUnixMicros(node.last_seen));
  p.set_labels(node.labels);
  return p.SerializeAsString();
}

NodeRecord NodeFromProto(const spb::NodeRecord& p) {
  return NodeRecord{p.name(),  p.address(), p.slots(),
                    p.gpus(),  p.state(),   absl::FromUnixMicros(p.last_seen_us()),
                    p.labels()};
}

}  // namespace

// ---- Opening ----------------------------------------------------------------

EtcdJobStore::EtcdJobStore(std::shared_ptr<EtcdClient> client, std::string prefix,
                           const Clock* clock)
    : client_(std::move(client)), prefix_(std::move(prefix)), clock_(clock) {}

EtcdJobStore::~EtcdJobStore() = default;

absl::StatusOr<std::unique_ptr<EtcdJobStore>> EtcdJobStore::Open(std::shared_ptr<EtcdClient> client,
                                                                 std::string prefix,
                                                                 const Clock* clock) {
  MESH_CHECK(client != nullptr && clock != nullptr, "EtcdJobStore needs a client and a clock");
  ETCD_STORE_RETURN_IF_ERROR(CheckPrefix(prefix));
  std::unique_ptr<EtcdJobStore> store(
      new EtcdJobStore(std::move(client), std::move(prefix), clock));
  ETCD_STORE_RETURN_IF_ERROR(store->CheckSchema());
  return store;
}

absl::Status EtcdJobStore::CheckSchema() {
  const std::string key = Key("schema");
  for (int attempt = 0; attempt < kMaxConflictRetries; ++attempt) {
    absl::StatusOr<std::optional<EtcdKeyValue>> schema = client_->Get(key);
    if (!schema.ok()) return Named(schema.status(), "read the schema");
    if (schema->has_value()) {
      int version = 0;
      if (!absl::SimpleAtoi((*schema)->value, &version) || version < 1) {
        return absl::DataLossError(absl::StrCat(Describe(), ": the schema key ", key, " holds '",
                                                (*schema)->value, "', not a version"));
      }
      if (version > kSchemaVersion) {
        return absl::FailedPreconditionError(absl::StrCat(
            Describe(), ": schema version ", version, " was written by a newer coordinator; this ",
            "one reads up to version ", kSchemaVersion, " (upgrade it, or use another prefix)"));
      }
      return absl::OkStatus();
    }
    // No schema: an empty prefix becomes a Mesh store; one holding other
    // keys is someone else's. The replicas' election key (kLeaderKey) may
    // come first.
    absl::StatusOr<EtcdRangeResult> any =
        client_->Range(prefix_ + "/", EtcdClient::PrefixEnd(prefix_ + "/"), 2);
    if (!any.ok()) return Named(any.status(), "look under the prefix");
    for (const EtcdKeyValue& kv : any->kvs) {
      if (kv.key == Key(kLeaderKey)) continue;
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(), ": the prefix holds keys (", kv.key,
                       ") but no Mesh schema: not a Mesh store (wrong prefix?)"));
    }
    EtcdTxn txn;
    txn.IfCreateRevision(key, 0).Put(key, absl::StrCat(kSchemaVersion));
    absl::StatusOr<bool> created = Commit(std::move(txn));
    if (!created.ok()) return created.status();
    if (*created) return absl::OkStatus();
    // Another coordinator wrote it first: read what it wrote.
  }
  return absl::AbortedError(absl::StrCat(Describe(), ": the schema key keeps changing"));
}

std::string EtcdJobStore::Describe() const {
  return absl::StrCat("etcd://", client_->endpoints(), prefix_);
}

void EtcdJobStore::SetFence(std::string key, int64_t create_revision) {
  absl::MutexLock lock(&fence_mu_);
  fence_ = Fence{std::move(key), create_revision};
}

std::string EtcdJobStore::Key(const std::string& suffix) const {
  return absl::StrCat(prefix_, "/", suffix);
}

std::string EtcdJobStore::JobKey(int64_t number) const {
  return absl::StrCat(prefix_, "/jobs/", Padded(number));
}

std::string EtcdJobStore::EventKey(int64_t number, int64_t seq) const {
  return absl::StrCat(prefix_, "/events/", Padded(number), "/", Padded(seq));
}

absl::Status EtcdJobStore::Named(const absl::Status& status, const std::string& what) const {
  return absl::Status(status.code(),
                      absl::StrCat("job store ", Describe(), ": ", what, ": ", status.message()));
}

absl::StatusOr<bool> EtcdJobStore::Commit(EtcdTxn txn) {
  Fence fence;
  {
    absl::MutexLock lock(&fence_mu_);
    fence = fence_;
  }
  if (fence.create_revision != 0) txn.IfCreateRevision(fence.key, fence.create_revision);
  const absl::Time start = absl::Now();
  absl::StatusOr<EtcdTxnResult> result = client_->Txn(txn);
  RecordCommit(absl::Now() - start, result.ok());
  if (!result.ok()) return Named(result.status(), "commit");
  if (!result->succeeded && fence.create_revision != 0) {
    // Was it the fence? Then this replica must not write again.
    absl::StatusOr<std::optional<EtcdKeyValue>> holder = client_->Get(fence.key);
    if (!holder.ok()) return Named(holder.status(), "read the fence");
    if (!holder->has_value() || (*holder)->create_revision != fence.create_revision) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job store ", Describe(), ": not written: the fence ", fence.key, " (create revision ",
          fence.create_revision, ") is gone: this coordinator no longer leads"));
    }
  }
  return result->succeeded;
}

// ---- Jobs -------------------------------------------------------------------

absl::StatusOr<std::optional<JobRecord>> EtcdJobStore::ReadJob(int64_t number,
                                                               int64_t* mod_revision) const {
  absl::StatusOr<std::optional<EtcdKeyValue>> kv = client_->Get(JobKey(number));
  if (!kv.ok()) return Named(kv.status(), "read job");
  if (!kv->has_value()) return std::optional<JobRecord>();
  spb::JobRecord record;
  if (!record.ParseFromString((*kv)->value)) {
    return absl::DataLossError(
        absl::StrCat("job store ", Describe(), ": ", (*kv)->key, " does not parse"));
  }
  if (mod_revision != nullptr) *mod_revision = (*kv)->mod_revision;
  return std::optional<JobRecord>(FromProto(record));
}

absl::StatusOr<CreateJobResult> EtcdJobStore::CreateJob(const NewJob& job) {
  ETCD_STORE_RETURN_IF_ERROR(job_store::CheckNewJob(job));
  const std::string counter_key = Key("counter/job");
  const std::string idempotency_key =
      job.idempotency_key.empty() ? "" : Key(absl::StrCat("idempotency/", job.idempotency_key));
  const uint64_t token = RandomToken();
  for (int attempt = 0; attempt < kMaxConflictRetries; ++attempt) {
    if (!idempotency_key.empty()) {
      absl::StatusOr<std::optional<EtcdKeyValue>> existing = client_->Get(idempotency_key);
      if (!existing.ok()) return Named(existing.status(), "look up idempotency key");
      if (existing->has_value()) {
        const std::optional<int64_t> number = job_store::JobNumber((*existing)->value);
        if (!number.has_value()) {
          return absl::DataLossError(absl::StrCat("job store ", Describe(), ": ", idempotency_key,
                                                  " names '", (*existing)->value, "'"));
        }
        absl::StatusOr<std::optional<JobRecord>> record = ReadJob(*number, nullptr);
        if (!record.ok()) return record.status();
        if (!record->has_value()) {
          return absl::DataLossError(absl::StrCat("job store ", Describe(), ": ", idempotency_key,
                                                  " names ", (*existing)->value,
                                                  ", which does not exist"));
        }
        return CreateJobResult{**std::move(record), /*existed=*/true};
      }
    }
    absl::StatusOr<std::optional<EtcdKeyValue>> counter = client_->Get(counter_key);
    if (!counter.ok()) return Named(counter.status(), "read the job counter");
    int64_t last = 0;
    if (counter->has_value() && !absl::SimpleAtoi((*counter)->value, &last)) {
      return absl::DataLossError(absl::StrCat("job store ", Describe(), ": ", counter_key,
                                              " holds '", (*counter)->value, "'"));
    }
    const int64_t number = last + 1;
    const absl::Time now = job_store::ToMicros(clock_->Now());
    JobRecord record = job_store::NewJobRecord(job, number, now);

    EtcdTxn txn;
    txn.IfModRevision(counter_key, counter->has_value() ? (*counter)->mod_revision : 0);
    if (!idempotency_key.empty()) {
      txn.IfCreateRevision(idempotency_key, 0).Put(idempotency_key, record.id);
    }
    txn.Put(counter_key, absl::StrCat(number))
        .Put(JobKey(number), ToProto(record, number, token).SerializeAsString())
        .Put(EventKey(number, 1),
             EventValue(JobEvent{record.id, 1, now, "", record.state, job.reason, 0}));
    absl::StatusOr<bool> committed = Commit(std::move(txn));
    if (!committed.ok()) {
      if (committed.status().code() != absl::StatusCode::kUnavailable) return committed.status();
      // Unknown outcome: the Txn may have been applied. If the job is there
      // with this call's token, it was, and the job is acknowledged now;
      // otherwise the error stands (the caller may retry, with its
      // idempotency key).
      absl::StatusOr<std::optional<EtcdKeyValue>> kv = client_->Get(JobKey(number));
      spb::JobRecord stored;
      if (kv.ok() && kv->has_value() && stored.ParseFromString((*kv)->value) &&
          stored.create_token() == token) {
        return CreateJobResult{FromProto(stored), /*existed=*/false};
      }
      return committed.status();
    }
    if (*committed) return CreateJobResult{std::move(record), /*existed=*/false};
    // Another writer took the number or the key; read again.
  }
  return absl::AbortedError(absl::StrCat("job store ", Describe(), ": CreateJob lost ",
                                         kMaxConflictRetries,
                                         " races for the job counter in a row"));
}

absl::StatusOr<JobRecord> EtcdJobStore::GetJob(const std::string& id) const {
  const std::optional<int64_t> number = job_store::JobNumber(id);
  if (!number.has_value()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  absl::StatusOr<std::optional<JobRecord>> record = ReadJob(*number, nullptr);
  if (!record.ok()) return record.status();
  if (!record->has_value()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  return **std::move(record);
}

absl::StatusOr<JobPage> EtcdJobStore::ListJobs(const JobQuery& query) const {
  absl::StatusOr<job_store::PageWindow> window = job_store::ParsePage(query);
  if (!window.ok()) return window.status();
  const std::string end = EtcdClient::PrefixEnd(Key("jobs/"));
  std::string from = JobKey(window->after + 1);
  JobPage page;
  int64_t last_number = 0;
  for (;;) {
    absl::StatusOr<EtcdRangeResult> batch = client_->Range(from, end, kListBatch);
    if (!batch.ok()) return Named(batch.status(), "list jobs");
    for (const EtcdKeyValue& kv : batch->kvs) {
      spb::JobRecord record;
      if (!record.ParseFromString(kv.value)) {
        return absl::DataLossError(
            absl::StrCat("job store ", Describe(), ": ", kv.key, " does not parse"));
      }
      if (!query.states.empty() && std::find(query.states.begin(), query.states.end(),
                                             record.state()) == query.states.end()) {
        continue;
      }
      if (static_cast<int>(page.jobs.size()) == window->limit) {
        page.next_page_token = job_store::PageToken(last_number);
        return page;
      }
      page.jobs.push_back(FromProto(record));
      last_number = record.number();
    }
    if (!batch->more || batch->kvs.empty()) return page;
    from = batch->kvs.back().key + std::string(1, '\0');
  }
}

absl::StatusOr<JobRecord> EtcdJobStore::UpdateJob(const std::string& id, const JobUpdate& update) {
  ETCD_STORE_RETURN_IF_ERROR(job_store::CheckUpdate(id, update));
  const std::optional<int64_t> number = job_store::JobNumber(id);
  if (!number.has_value()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  for (int attempt = 0; attempt < kMaxConflictRetries; ++attempt) {
    int64_t mod_revision = 0;
    absl::StatusOr<std::optional<JobRecord>> current = ReadJob(*number, &mod_revision);
    if (!current.ok()) return current.status();
    if (!current->has_value()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
    JobRecord job = **std::move(current);
    JobEvent event;
    ETCD_STORE_RETURN_IF_ERROR(job_store::ApplyUpdate(update, clock_->Now(), &job, &event));
    EtcdTxn txn;
    txn.IfModRevision(JobKey(*number), mod_revision)
        .Put(JobKey(*number), ToProto(job, *number, 0).SerializeAsString())
        .Put(EventKey(*number, event.seq), EventValue(event));
    absl::StatusOr<bool> committed = Commit(std::move(txn));
    if (!committed.ok()) return committed.status();
    if (*committed) return job;
    // Someone else updated the job in between: check the preconditions
    // against what it is now.
  }
  return absl::AbortedError(
      absl::StrCat("job ", id, ": lost ", kMaxConflictRetries, " update races in a row"));
}

absl::StatusOr<std::vector<JobEvent>> EtcdJobStore::ListEvents(const std::string& id) const {
  const std::optional<int64_t> number = job_store::JobNumber(id);
  if (!number.has_value()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  absl::StatusOr<std::optional<EtcdKeyValue>> job = client_->Get(JobKey(*number));
  if (!job.ok()) return Named(job.status(), "read job");
  if (!job->has_value()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  const std::string start = absl::StrCat(Key("events/"), Padded(*number), "/");
  const std::string end = EtcdClient::PrefixEnd(start);
  std::string from = start;
  std::vector<JobEvent> events;
  for (;;) {
    absl::StatusOr<EtcdRangeResult> batch = client_->Range(from, end, kListBatch);
    if (!batch.ok()) return Named(batch.status(), "list job events");
    for (const EtcdKeyValue& kv : batch->kvs) {
      spb::JobEvent p;
      if (!p.ParseFromString(kv.value)) {
        return absl::DataLossError(
            absl::StrCat("job store ", Describe(), ": ", kv.key, " does not parse"));
      }
      events.push_back(JobEvent{id, p.seq(), absl::FromUnixMicros(p.time_us()), p.from_state(),
                                p.to_state(), p.reason(), p.generation()});
    }
    if (!batch->more || batch->kvs.empty()) return events;
    from = batch->kvs.back().key + std::string(1, '\0');
  }
}

// ---- Nodes ------------------------------------------------------------------

absl::Status EtcdJobStore::UpsertNode(const NodeRecord& node) {
  ETCD_STORE_RETURN_IF_ERROR(job_store::CheckNode(node));
  NodeRecord stored = node;
  stored.last_seen = job_store::ToMicros(node.last_seen);
  EtcdTxn txn;
  txn.Put(Key(absl::StrCat("nodes/", node.name)), NodeValue(stored));
  absl::StatusOr<bool> committed = Commit(std::move(txn));
  if (!committed.ok()) return committed.status();
  if (!*committed) {
    return absl::FailedPreconditionError(
        absl::StrCat("job store ", Describe(), ": node ", node.name, " not written (fenced)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<NodeRecord> EtcdJobStore::GetNode(const std::string& name) const {
  absl::StatusOr<std::optional<EtcdKeyValue>> kv = client_->Get(Key(absl::StrCat("nodes/", name)));
  if (!kv.ok()) return Named(kv.status(), "read node");
  if (!kv->has_value()) return absl::NotFoundError(absl::StrCat("node ", name, " not found"));
  spb::NodeRecord p;
  if (!p.ParseFromString((*kv)->value)) {
    return absl::DataLossError(
        absl::StrCat("job store ", Describe(), ": ", (*kv)->key, " does not parse"));
  }
  return NodeFromProto(p);
}

absl::StatusOr<std::vector<NodeRecord>> EtcdJobStore::ListNodes() const {
  const std::string start = Key("nodes/");
  const std::string end = EtcdClient::PrefixEnd(start);
  std::string from = start;
  std::vector<NodeRecord> nodes;
  for (;;) {
    absl::StatusOr<EtcdRangeResult> batch = client_->Range(from, end, kListBatch);
    if (!batch.ok()) return Named(batch.status(), "list nodes");
    for (const EtcdKeyValue& kv : batch->kvs) {
      spb::NodeRecord p;
      if (!p.ParseFromString(kv.value)) {
        return absl::DataLossError(
            absl::StrCat("job store ", Describe(), ": ", kv.key, " does not parse"));
      }
      nodes.push_back(NodeFromProto(p));
    }
    if (!batch->more || batch->kvs.empty()) return nodes;
    from = batch->kvs.back().key + std::string(1, '\0');
  }
}

absl::Status EtcdJobStore::MarkNode(const std::string& name, const std::string& state) {
  ETCD_STORE_RETURN_IF_ERROR(job_store::CheckNodeState(name, state));
  const std::string key = Key(absl::StrCat("nodes/", name));
  for (int attempt = 0; attempt < kMaxConflictRetries; ++attempt) {
    absl::StatusOr<std::optional<EtcdKeyValue>> kv = client_->Get(key);
    if (!kv.ok()) return Named(kv.status(), "read node");
    if (!kv->has_value()) return absl::NotFoundError(absl::StrCat("node ", name, " not found"));
    spb::NodeRecord p;
    if (!p.ParseFromString((*kv)->value)) {
      return absl::DataLossError(
          absl::StrCat("job store ", Describe(), ": ", key, " does not parse"));
    }
    p.set_state(state);
    EtcdTxn txn;
    txn.IfModRevision(key, (*kv)->mod_revision).Put(key, p.SerializeAsString());
    absl::StatusOr<bool> committed = Commit(std::move(txn));
    if (!committed.ok()) return committed.status();
    if (*committed) return absl::OkStatus();
  }
  return absl::AbortedError(
      absl::StrCat("node ", name, ": lost ", kMaxConflictRetries, " update races in a row"));
}

}  // namespace mesh::coordinator

#undef ETCD_STORE_RETURN_IF_ERROR
