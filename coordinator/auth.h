// Who may call the coordinator, and what each caller may do.
//
// Authentication turns a bearer token into a Principal:
//   - Static tokens come from a YAML file (--auth-tokens), one entry per
//     person or machine:
//
//       tokens:
//         - name: alice          # a user: submits jobs, owns them
//           role: user
//           token_sha256: 5e88...  # hex SHA-256 of the token; or `token:`
//           unix_user: alice     # the account alice's workers run as
//                                # (docs/security.md)
//         - name: ops
//           role: admin          # everything, every job
//           token: "a-long-random-string"
//         - name: gpu-node-7     # an agent: may act only as node gpu-node-7
//           role: agent
//           token_sha256: ...
//
//     `unix_user` (users and admins only) maps the principal to a Unix
//     account: an agent running as root starts the principal's workers as
//     that account, and refuses them when there is none. `unix_user: root`
//     also needs `allow_root: true`, the operator's explicit consent. Entries
//     of one name must agree on both.
//     A token must be at least kMinTokenLength characters. The file is read
//     again when it changes (ReloadIfChanged); a file that no longer parses
//     is reported and the previous set stays in force.
//   - Worker tokens are minted by the coordinator, one per job
//     (MintWorkerToken), and handed to that job's workers by their agent
//     (MESH_TOKEN). A worker token is "mw1_<hmac>_<job id>": an HMAC-SHA256
//     of the job id under the coordinator's key, so it is checked without a
//     table and stays valid across coordinator restarts as long as the key
//     file (--worker-token-key, default <state-dir>/worker-token.key) does.
//
// Authorization is a set of pure functions over a Principal (below), called
// by the gRPC adapters with the job's owner when the decision needs it:
//
//   | caller | JobService                           | WorkerService / Admin.CreateJob | NodeService
//   |
//   |--------|--------------------------------------|---------------------------------|-------------|
//   | admin  | everything                           | every job                       | every node
//   | | user   | submit; read all; cancel+logs own    | own and unowned (ad-hoc) jobs*  | no | |
//   agent  | no                                   | no                              | its node    |
//   | worker | no                                   | its own job only                | no |
//
// * An unowned job whose id has JobService's form, job-<number>, is a job not
//   submitted yet, not an ad-hoc one: users may not create or join it (they
//   would own the rendezvous, KV included, of someone else's future job).
//
// Errors: UNAUTHENTICATED for a missing or unknown token; PERMISSION_DENIED
// for a known caller acting outside its rights (the message names both the
// caller and what it tried to reach); INVALID_ARGUMENT / NOT_FOUND /
// PERMISSION_DENIED from Create and ReloadIfChanged for bad files.
//
// Thread safety: Authenticator is thread-safe (Authenticate may race with
// ReloadIfChanged). The free functions are pure.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace mesh::coordinator {

enum class Role { kAdmin, kUser, kAgent, kWorker };

// "admin", "user", "agent", "worker".
absl::string_view RoleName(Role role);

struct Principal {
  Role role = Role::kAdmin;
  // The user's or admin's name, the agent's node name, or the worker's job
  // id.
  std::string name;

  // "user alice", "worker of job job-3", ... for messages.
  std::string Describe() const;
};

struct AuthOptions {
  // YAML token file (format above). Required: Create fails without one.
  std::string tokens_file;
  // File holding the worker-token HMAC key. Created with mode 0600 and 32
  // random bytes when missing. Empty: a random key held in memory only, so
  // worker tokens die with the process (in-memory coordinators).
  std::string worker_token_key_file;
};

inline constexpr size_t kMinTokenLength = 16;

class Authenticator {
 public:
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const AuthOptions& options);

  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  // The principal `token` stands for. UNAUTHENTICATED when it is empty,
  // unknown, or a worker token whose HMAC does not match.
  absl::StatusOr<Principal> Authenticate(absl::string_view token) const;

  // The worker token of `job_id`.
  std::string MintWorkerToken(absl::string_view job_id) const;

  // The Unix account of the user or admin named `name`, from the token file
  // as loaded now: (unix_user, allow_root). nullopt when no user or admin of
  // that name has a `unix_user`.
  struct UnixAccount {
    std::string unix_user;
    bool allow_root = false;
  };
  std::optional<UnixAccount> UnixAccountOf(absl::string_view name) const;

  // Re-reads the token file when its size, mtime or inode changed. On
  // success the new set replaces the old one at once (calls already
  // authenticated keep their principal); on error the old set stays and
  // the error is returned. OK and no-op when nothing changed.
  absl::Status ReloadIfChanged();

  // Entries currently loaded, for logs and tests.
  size_t token_count() const;

 private:
  struct FileStamp {
    int64_t size = -1;
    int64_t mtime_ns = -1;
    uint64_t inode = 0;
    bool operator==(const FileStamp&) const = default;
  };
  // SHA-256 of the token (raw 32 bytes) -> who.
  using TokenTable = absl::flat_hash_map<std::string, Principal>;
  // User or admin name -> its Unix account (entries with a unix_user only).
  using AccountTable = absl::flat_hash_map<std::string, UnixAccount>;
  struct Loaded {
    TokenTable tokens;
    AccountTable accounts;
  };

  Authenticator(AuthOptions options, std::string key, Loaded loaded, FileStamp stamp);

  static absl::StatusOr<Loaded> LoadTokens(const std::string& path);
  static absl::StatusOr<FileStamp> StampOf(const std::string& path);

  const AuthOptions options_;
  const std::string key_;  // HMAC key of worker tokens.

  mutable absl::Mutex mu_;
  TokenTable tokens_ ABSL_GUARDED_BY(mu_);
  AccountTable accounts_ ABSL_GUARDED_BY(mu_);
  FileStamp stamp_ ABSL_GUARDED_BY(mu_);
};

// --- Authorization --------------------------------------------------------
// `owner` is the job's owner when the job is one JobService accepted (the
// submitting principal's name), nullopt for a job that exists only in the
// rendezvous layer (an ad-hoc job, created by AdminService.CreateJob or by a
// Join) or that does not exist.

// WorkerService calls and AdminService.CreateJob on `job_id`.
absl::Status AuthorizeJobData(const Principal& caller, absl::string_view job_id,
                              const std::optional<std::string>& owner);
// JobService calls not bound to one job's owner: SubmitJob, GetJob,
// ListJobs, WaitJob, WatchJobState, ListNodes.
absl::Status AuthorizeJobClient(const Principal& caller);
// CancelJob and GetLogs of a job owned by `owner`.
absl::Status AuthorizeJobControl(const Principal& caller, absl::string_view job_id,
                                 const std::optional<std::string>& owner);
// NodeService calls made in the name of node `node`.
absl::Status AuthorizeNode(const Principal& caller, absl::string_view node);

}  // namespace mesh::coordinator
