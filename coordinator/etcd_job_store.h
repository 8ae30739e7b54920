// EtcdJobStore: the JobStore (coordinator/job_store.h) in an etcd v3
// cluster, under one key prefix, for coordinator replicas (docs/ha.md,
// docs/persistence.md). It speaks etcd's own gRPC protocol (KV, Txn) through
// EtcdClient (coordinator/etcd_client.h).
//
// Keys, under <prefix>/ (numbers zero-padded to 20 digits, so that key order
// is number order):
//   schema               this layout's version, kSchemaVersion
//   counter/job          the last job number handed out
//   jobs/<n>             job-<n>: a mesh.store.v1.JobRecord
//   events/<n>/<seq>     its events: mesh.store.v1.JobEvent
//   idempotency/<key>    the job id a key created
//   nodes/<name>         a mesh.store.v1.NodeRecord
//   leader               the replicas' election key (coordinator/replica.h)
//
// Every mutation is one Txn whose compares hold the values it read (the
// counter's and the job's mod revisions): a concurrent writer makes the Txn
// fail, and the call reads again and retries, with the preconditions
// checked against what it reads, so optimistic concurrency behaves as on
// SQLite. An acknowledged Txn is in the logs of a quorum of etcd members.
//
// Fencing (SetFence): once set, every Txn also compares the fence key's
// create revision, so a coordinator that lost its leadership (its election
// key was deleted or re-created by another) cannot write, however late its
// requests arrive; such a write fails with FAILED_PRECONDITION.
//
// Errors, in the terms of job_store.h's common contract: UNAVAILABLE when
// no endpoint answers or etcd has no quorum (etcd's "request timed out",
// "no leader", or no answer within the client's call timeout);
// RESOURCE_EXHAUSTED for a record over etcd's request size limit or a full
// quota (etcd's NOSPACE alarm); DATA_LOSS for a value under the prefix that
// does not parse; FAILED_PRECONDITION for a schema newer than this build's,
// a prefix that holds keys but no Mesh schema, or a lost fence. Messages
// name the store (etcd://<endpoints><prefix>).
//
// Thread safety: thread-safe; calls run concurrently (etcd orders them).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/etcd_client.h"
#include "coordinator/job_store.h"

namespace mesh::coordinator {

class EtcdJobStore final : public JobStore {
 public:
  // The key layout this build writes.
  static constexpr int kSchemaVersion = 1;
  // The election key of the replicas on this store, under the prefix.
  static constexpr char kLeaderKey[] = "leader";

  // Connects to `client`'s cluster, checks (or, under an empty prefix,
  // writes) the schema. `prefix` is "/" followed by one or more
  // slash-separated names of [A-Za-z0-9._-], without a trailing slash.
  // `clock` stamps records and must outlive the store.
  // Possible errors: INVALID_ARGUMENT (a malformed prefix); UNAVAILABLE (no
  // endpoint answered within the client's connect timeout);
  // FAILED_PRECONDITION (a newer schema, or keys under the prefix without a
  // Mesh schema: not a Mesh store); DATA_LOSS (an unreadable schema key).
  static absl::StatusOr<std::unique_ptr<EtcdJobStore>> Open(std::shared_ptr<EtcdClient> client,
                                                            std::string prefix, const Clock* clock);

  ~EtcdJobStore() override;

  std::string Describe() const override;
  const std::string& prefix() const { return prefix_; }
  EtcdClient& client() const { return *client_; }

  // Makes every later write conditional on `key` (a full etcd key) having
  // create revision `create_revision`; 0 clears the fence.
  void SetFence(std::string key, int64_t create_revision);

  absl::StatusOr<CreateJobResult> CreateJob(const NewJob& job) override;
  absl::StatusOr<JobRecord> GetJob(const std::string& id) const override;
  absl::StatusOr<JobPage> ListJobs(const JobQuery& query) const override;
  absl::StatusOr<JobRecord> UpdateJob(const std::string& id, const JobUpdate& update) override;
  absl::StatusOr<std::vector<JobEvent>> ListEvents(const std::string& id) const override;
  absl::Status UpsertNode(const NodeRecord& node) override;
  absl::StatusOr<NodeRecord> GetNode(const std::string& name) const override;
  absl::StatusOr<std::vector<NodeRecord>> ListNodes() const override;
  absl::Status MarkNode(const std::string& name, const std::string& state) override;

 private:
  struct Fence {
    std::string key;
    int64_t create_revision = 0;
  };

  EtcdJobStore(std::shared_ptr<EtcdClient> client, std::string prefix, const Clock* clock);

  absl::Status CheckSchema();
  std::string Key(const std::string& suffix) const;
  std::string JobKey(int64_t number) const;
  std::string EventKey(int64_t number, int64_t seq) const;
  // `status` with the store named in front of its message.
  absl::Status Named(const absl::Status& status, const std::string& what) const;
  // Runs `txn` with the fence's compare added; records the commit. Returns
  // whether the compares held. A lost fence is FAILED_PRECONDITION.
  absl::StatusOr<bool> Commit(EtcdTxn txn);
  absl::StatusOr<std::optional<JobRecord>> ReadJob(int64_t number, int64_t* mod_revision) const;

  const std::shared_ptr<EtcdClient> client_;
  const std::string prefix_;
  const Clock* const clock_;

  mutable absl::Mutex fence_mu_;
  Fence fence_ ABSL_GUARDED_BY(fence_mu_);
};

}  // namespace mesh::coordinator
