#include "coordinator/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace mesh::coordinator {
namespace {

constexpr absl::string_view kWorkerTokenPrefix = "mw1_";
constexpr size_t kMacHexLength = 64;  // HMAC-SHA256, hex.
constexpr size_t kKeyBytes = 32;

std::string Sha256(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(digest), length);
}

std::string WorkerMac(absl::string_view key, absl::string_view job_id) {
  // Domain-separated so that the key could never sign anything else by
  // accident.
  const std::string message =
      absl::StrCat("mesh worker token v1", absl::string_view("\0", 1), job_id);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(mac), length));
}

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

bool IsHex(absl::string_view s) {
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// Reads the key file, or creates it (O_EXCL, 0600) with fresh random bytes.
absl::StatusOr<std::string> LoadOrCreateKey(const std::string& path) {
  if (path.empty()) {
    std::string key(kKeyBytes, '\0');
    if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), kKeyBytes) != 1) {
      return absl::InternalError("no randomness for the worker-token key");
    }
    return key;
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    std::string key(kKeyBytes, '\0');
    if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), kKeyBytes) != 1) {
      ::close(fd);
      ::unlink(path.c_str());
      return absl::InternalError("no randomness for the worker-token key");
    }
    const ssize_t written = ::write(fd, key.data(), key.size());
    const int err = errno;
    const bool synced = ::fsync(fd) == 0;
    ::close(fd);
    if (written != static_cast<ssize_t>(key.size()) || !synced) {
      ::unlink(path.c_str());
      return ErrnoStatus(written < 0 ? err : EIO, absl::StrCat("writing ", path));
    }
    return key;
  }
  if (errno != EEXIST) return ErrnoStatus(errno, absl::StrCat("creating ", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, absl::StrCat("reading ", path));
  std::ostringstream content;
  content << in.rdbuf();
  std::string key = content.str();
  if (key.size() < kKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " holds ", key.size(), " bytes; a worker-token key needs at least ", kKeyBytes));
  }
  return key;
}

absl::StatusOr<Role> ParseRole(const std::string& role) {
  if (role == "admin") return Role::kAdmin;
  if (role == "user") return Role::kUser;
  if (role == "agent") return Role::kAgent;
  return absl::InvalidArgumentError(
      absl::StrCat("role \"", role, "\" is not one of admin, user, agent"));
}

bool IsOwnerOf(const Principal& caller, const std::optional<std::string>& owner) {
  return owner.has_value() && *owner == caller.name;
}

// "job-<digits>": the ids JobService hands out (JobStore). Such an id without
// an owner is a job not submitted yet, not an ad-hoc one.
bool IsJobServiceId(absl::string_view job_id) {
  if (!absl::ConsumePrefix(&job_id, "job-") || job_id.empty()) return false;
  return std::all_of(job_id.begin(), job_id.end(), [](char c) { return absl::ascii_isdigit(c); });
}

// A POSIX portable user name, as useradd accepts by default:
// [A-Za-z_][A-Za-z0-9_.-]{0,31}, optionally ending in '$'.
bool IsValidUnixUserName(const std::string& name) {
  if (name.empty() || name.size() > 32) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_';
    if (i == 0 ? !alpha
               : !(alpha || absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '.' ||
                   c == '-' || (c == '$' && i + 1 == name.size()))) {
      return false;
    }
  }
  return true;
}

// Reads `unix_user` and `allow_root` of the token entry of `principal`.
absl::Status ParseUnixAccount(const YAML::Node& entry, const std::string& where,
                              const Principal& principal, std::string& unix_user,
                              bool& allow_root) {
  const bool has_user = static_cast<bool>(entry["unix_user"]);
  const bool has_root = static_cast<bool>(entry["allow_root"]);
  if (!has_user && !has_root) return absl::OkStatus();
  if (principal.role != Role::kUser && principal.role != Role::kAdmin) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " (", principal.name,
                     "): unix_user and allow_root are for users and admins, who own jobs"));
  }
  if (has_user) {
    unix_user = entry["unix_user"].as<std::string>("");
    if (!IsValidUnixUserName(unix_user)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " (", principal.name, "): unix_user \"", unix_user,
          "\" is not a Unix user name ([A-Za-z_][A-Za-z0-9_.-]*, at most 32 characters)"));
    }
  }
  if (has_root) {
    bool value = false;
    if (!YAML::convert<bool>::decode(entry["allow_root"], value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " (", principal.name, "): allow_root must be true or false"));
    }
    allow_root = value;
    if (!has_user) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " (", principal.name, "): allow_root needs a unix_user"));
    }
  }
  if (unix_user == "root" && !allow_root) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " (", principal.name,
                     "): unix_user root runs this principal's workers as root; add "
                     "`allow_root: true` if that is intended"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kUser:
      return "user";
    case Role::kAgent:
      return "agent";
    case Role::kWorker:
      return "worker";
  }
  return "unknown";
}

std::string Principal::Describe() const {
  switch (role) {
    case Role::kWorker:
      return absl::StrCat("a worker of job ", name);
    case Role::kAgent:
      return absl::StrCat("the agent of node ", name);
    default:
      return absl::StrCat(RoleName(role), " ", name);
  }
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const AuthOptions& options) {
  if (options.tokens_file.empty()) {
    return absl::InvalidArgumentError("token authentication needs a token file (--auth-tokens)");
  }
  absl::StatusOr<FileStamp> stamp = StampOf(options.tokens_file);
  if (!stamp.ok()) return stamp.status();
  absl::StatusOr<Loaded> tokens = LoadTokens(options.tokens_file);
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<std::string> key = LoadOrCreateKey(options.worker_token_key_file);
  if (!key.ok()) return key.status();
  return std::unique_ptr<Authenticator>(
      new Authenticator(options, *std::move(key), *std::move(tokens), *stamp));
}

Authenticator::Authenticator(AuthOptions options, std::string key, Loaded loaded, FileStamp stamp)
    : options_(std::move(options)),
      key_(std::move(key)),
      tokens_(std::move(loaded.tokens)),
      accounts_(std::move(loaded.accounts)),
      stamp_(stamp) {}

absl::StatusOr<Authenticator::FileStamp> Authenticator::StampOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, path);
  FileStamp stamp;
  stamp.size = st.st_size;
  stamp.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  stamp.inode = st.st_ino;
  return stamp;
}

absl::StatusOr<Authenticator::Loaded> Authenticator::LoadTokens(const std::string& path) {
  std::ifstream in(path);
  if (!in) return ErrnoStatus(errno, absl::StrCat("reading ", path));
  YAML::Node root;
  try {
    root = YAML::Load(in);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  const YAML::Node list = root.IsMap() ? root["tokens"] : YAML::Node();
  if (!list || !list.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected a `tokens:` list"));
  }
  TokenTable table;
  AccountTable accounts;
  // Names seen, with the account each entry of that name gave ("" for none).
  absl::flat_hash_map<std::string, UnixAccount> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node entry = list[i];
    const std::string where = absl::StrCat(path, ": tokens[", i, "]");
    if (!entry.IsMap()) return absl::InvalidArgumentError(absl::StrCat(where, ": not a map"));
    for (const auto& field : entry) {
      const std::string key = field.first.as<std::string>("");
      if (key != "name" && key != "role" && key != "token" && key != "token_sha256" &&
          key != "unix_user" && key != "allow_root") {
        return absl::InvalidArgumentError(absl::StrCat(where, ": unknown field \"", key, "\""));
      }
    }
    Principal principal;
    principal.name = entry["name"] ? entry["name"].as<std::string>("") : "";
    if (principal.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": `name` is required"));
    }
    absl::StatusOr<Role> role = ParseRole(entry["role"] ? entry["role"].as<std::string>("") : "");
    if (!role.ok())
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", role.status().message()));
    principal.role = *role;
    UnixAccount account;
    if (absl::Status s =
            ParseUnixAccount(entry, where, principal, account.unix_user, account.allow_root);
        !s.ok()) {
      return s;
    }
    if (auto [it, added] = seen.emplace(principal.name, account); !added) {
      if (it->second.unix_user != account.unix_user ||
          it->second.allow_root != account.allow_root) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " (", principal.name, "): every entry named \"", principal.name,
                         "\" must give the same unix_user and allow_root"));
      }
    }
    if (!account.unix_user.empty()) accounts[principal.name] = account;
    const bool has_plain = static_cast<bool>(entry["token"]);
    const bool has_hash = static_cast<bool>(entry["token_sha256"]);
    if (has_plain == has_hash) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": give exactly one of `token` and `token_sha256`"));
    }
    std::string digest;
    if (has_plain) {
      const std::string token = entry["token"].as<std::string>("");
      if (token.size() < kMinTokenLength) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": the token is shorter than ", kMinTokenLength, " characters"));
      }
      if (absl::StartsWith(token, kWorkerTokenPrefix)) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": tokens starting with \"",
                                                       kWorkerTokenPrefix, "\" are worker tokens"));
      }
      digest = Sha256(token);
    } else {
      const std::string hex = entry["token_sha256"].as<std::string>("");
      if (hex.size() != 64 || !IsHex(hex)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": token_sha256 must be 64 hex digits"));
      }
      digest = absl::HexStringToBytes(absl::AsciiStrToLower(hex));
    }
    if (!table.emplace(std::move(digest), principal).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " (", principal.name, "): the same token appears twice"));
    }
  }
  return Loaded{std::move(table), std::move(accounts)};
}

std::optional<Authenticator::UnixAccount> Authenticator::UnixAccountOf(
    absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = accounts_.find(name);
  if (it == accounts_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<Principal> Authenticator::Authenticate(absl::string_view token) const {
  if (token.empty()) return absl::UnauthenticatedError("no token");
  if (absl::StartsWith(token, kWorkerTokenPrefix)) {
    const absl::string_view rest = token.substr(kWorkerTokenPrefix.size());
    if (rest.size() > kMacHexLength + 1 && rest[kMacHexLength] == '_') {
      const absl::string_view mac = rest.substr(0, kMacHexLength);
      const absl::string_view job_id = rest.substr(kMacHexLength + 1);
      const std::string expected = WorkerMac(key_, job_id);
      if (CRYPTO_memcmp(expected.data(), mac.data(), kMacHexLength) == 0) {
        return Principal{Role::kWorker, std::string(job_id)};
      }
    }
    return absl::UnauthenticatedError("invalid worker token");
  }
  const std::string digest = Sha256(token);
  absl::MutexLock lock(&mu_);
  auto it = tokens_.find(digest);
  if (it == tokens_.end()) return absl::UnauthenticatedError("unknown token");
  return it->second;
}

std::string Authenticator::MintWorkerToken(absl::string_view job_id) const {
  return absl::StrCat(kWorkerTokenPrefix, WorkerMac(key_, job_id), "_", job_id);
}

absl::Status Authenticator::ReloadIfChanged() {
  absl::StatusOr<FileStamp> stamp = StampOf(options_.tokens_file);
  if (!stamp.ok()) return stamp.status();
  {
    absl::MutexLock lock(&mu_);
    if (*stamp == stamp_) return absl::OkStatus();
  }
  absl::StatusOr<Loaded> tokens = LoadTokens(options_.tokens_file);
  absl::MutexLock lock(&mu_);
  // Remember the stamp either way, so a broken file is reported once, not on
  // every tick; the next edit is picked up.
  stamp_ = *stamp;
  if (!tokens.ok()) return tokens.status();
  tokens_ = std::move(tokens->tokens);
  accounts_ = std::move(tokens->accounts);
  return absl::OkStatus();
}

size_t Authenticator::token_count() const {
  absl::MutexLock lock(&mu_);
  return tokens_.size();
}

absl::Status AuthorizeJobData(const Principal& caller, absl::string_view job_id,
                              const std::optional<std::string>& owner) {
  switch (caller.role) {
    case Role::kAdmin:
      return absl::OkStatus();
    case Role::kWorker:
      if (caller.name == job_id) return absl::OkStatus();
      break;
    case Role::kUser:
      if (owner.has_value() ? *owner == caller.name : !IsJobServiceId(job_id)) {
        return absl::OkStatus();
      }
      // A user who created (or joined) "job-<n>" ad hoc before JobService
      // handed that id out would own the rendezvous of someone else's job:
      // JobManager reuses a record of the right world size and generation,
      // KV keys included.
      if (!owner.has_value()) {
        return absl::PermissionDeniedError(
            absl::StrCat(caller.Describe(), " may not use job ", job_id,
                         ": ids job-<number> are JobService's; pick another id for an ad-hoc job"));
      }
      break;
    case Role::kAgent:
      break;
  }
  if (job_id.empty()) {
    // CreateJob without an id asks for a new ad-hoc job.
    return absl::PermissionDeniedError(absl::StrCat(
        caller.Describe(), " may not create an ad-hoc job; that needs a user or admin token"));
  }
  return absl::PermissionDeniedError(
      absl::StrCat(caller.Describe(), " may not use the data of job ", job_id));
}

absl::Status AuthorizeJobClient(const Principal& caller) {
  if (caller.role == Role::kAdmin || caller.role == Role::kUser) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(caller.Describe(), " may not use JobService; it needs a user token"));
}

absl::Status AuthorizeJobControl(const Principal& caller, absl::string_view job_id,
                                 const std::optional<std::string>& owner) {
  if (caller.role == Role::kAdmin) return absl::OkStatus();
  if (caller.role == Role::kUser && IsOwnerOf(caller, owner)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(caller.Describe(), " does not own job ", job_id,
                   owner.has_value() ? absl::StrCat(" (owner: ", *owner, ")") : std::string()));
}

absl::Status AuthorizeNode(const Principal& caller, absl::string_view node) {
  if (caller.role == Role::kAdmin) return absl::OkStatus();
  if (caller.role == Role::kAgent && caller.name == node) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(caller.Describe(), " may not act for node ", node));
}

}  // namespace mesh::coordinator
