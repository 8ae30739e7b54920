// Records for the job store tests (job_store_test.cc, SQLite's files;
// job_store_conformance_test.cc, every backend): one maker each, so that
// both suites store the same shapes.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/job_store.h"

namespace mesh::coordinator::job_store_records {

// A PENDING job whose spec holds an embedded NUL (binary-safe storage).
inline NewJob MakeJob(const std::string& name, const std::string& key = "") {
  NewJob job;
  job.name = name;
  job.idempotency_key = key;
  job.state = "PENDING";
  job.pending_reason = "waiting for 2 nodes";
  job.spec = std::string("spec\0of ", 8) + name;
  return job;
}

// A READY node: 8 slots, 4 GPUs, address 127.0.0.1:<7000 + name length>.
inline NodeRecord MakeNode(const std::string& name, absl::Time seen) {
  NodeRecord node;
  node.name = name;
  node.address = absl::StrCat("127.0.0.1:", name.size() + 7000);
  node.slots = 8;
  node.gpus = 4;
  node.state = "READY";
  node.last_seen = seen;
  node.labels = "zone=a";
  return node;
}

}  // namespace mesh::coordinator::job_store_records
