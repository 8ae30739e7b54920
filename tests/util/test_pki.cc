#include "tests/util/test_pki.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace mesh::testing {
namespace {

// One config for every command: `req` needs a distinguished_name section,
// `x509 -extfile` and `ca -extensions` read the *_ext sections, and `ca`
// reads its database from test_ca. Our own file, so that the system's
// openssl.cnf (and its default extensions) cannot change the result.
std::string ConfigText(const std::string& dir) {
  return absl::StrCat(R"([ ca ]
default_ca = test_ca

[ test_ca ]
database = )",
                      dir, R"(/ca_index.txt
new_certs_dir = )",
                      dir, R"(/ca_newcerts
serial = )",
                      dir, R"(/ca_serial
default_md = sha256
policy = policy_any
unique_subject = no
copy_extensions = none

[ policy_any ]
commonName = supplied

[ req ]
distinguished_name = req_dn

[ req_dn ]

[ v3_ca ]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always

[ server_ext ]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[ client_ext ]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
)");
}

absl::Status WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

bool HaveOpenssl() {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  for (absl::string_view entry : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(entry, "/openssl");
    if (::access(candidate.c_str(), X_OK) == 0) return true;
  }
  return false;
}

absl::StatusOr<std::string> RunOpenssl(const std::vector<std::string>& args) {
  if (!HaveOpenssl()) return absl::FailedPreconditionError("no openssl binary on PATH");
  std::vector<std::string> argv_storage = {"openssl"};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_storage) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const std::string command = absl::StrJoin(argv_storage, " ");

  int fds[2];
  // O_CLOEXEC: children spawned concurrently by other threads must not
  // inherit the write end, or our read would not see EOF.
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // stdin from /dev/null: openssl never waits for a pass phrase or prompt.
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, "openssl", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return absl::InternalError(absl::StrCat("cannot start '", command, "': ", std::strerror(rc)));
  }
  std::string output;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::read(fds[0], buffer, sizeof(buffer));
    if (n > 0) {
      output.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fds[0]);
  int wait_status = 0;
  while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
    return absl::InternalError(
        absl::StrCat("'", command, "' failed (wait status ", wait_status, "): ", output));
  }
  return output;
}

absl::StatusOr<TestPki> MakeTestPki(const std::string& dir) {
  if (!HaveOpenssl()) return absl::FailedPreconditionError("no openssl binary on PATH");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::filesystem::create_directories(dir + "/ca_newcerts", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));

  const std::string config = dir + "/openssl.cnf";
  if (absl::Status s = WriteFile(config, ConfigText(dir)); !s.ok()) return s;
  if (absl::Status s = WriteFile(dir + "/ca_index.txt", ""); !s.ok()) return s;
  if (absl::Status s = WriteFile(dir + "/ca_serial", "1000\n"); !s.ok()) return s;

  const std::vector<std::string> new_key = {"-newkey", "ec", "-pkeyopt",
                                            "ec_paramgen_curve:prime256v1", "-nodes"};
  auto make_ca = [&](const std::string& name, const std::string& cn) -> absl::Status {
    std::vector<std::string> args = {"req",  "-x509",       "-new", "-config",
                                     config, "-extensions", "v3_ca"};
    args.insert(args.end(), new_key.begin(), new_key.end());
    args.insert(args.end(), {"-keyout", dir + "/" + name + ".key", "-out",
                             dir + "/" + name + ".pem", "-days", "3650", "-subj", "/CN=" + cn});
    return RunOpenssl(args).status();
  };
  auto make_csr = [&](const std::string& name, const std::string& cn) -> absl::Status {
    std::vector<std::string> args = {"req", "-new", "-config", config};
    args.insert(args.end(), new_key.begin(), new_key.end());
    args.insert(args.end(), {"-keyout", dir + "/" + name + ".key", "-out",
                             dir + "/" + name + ".csr", "-subj", "/CN=" + cn});
    return RunOpenssl(args).status();
  };
  int next_serial = 1;
  auto make_leaf = [&](const std::string& name, const std::string& cn, const std::string& ca,
                       const std::string& extensions) -> absl::Status {
    if (absl::Status s = make_csr(name, cn); !s.ok()) return s;
    return RunOpenssl({"x509", "-req", "-in", dir + "/" + name + ".csr", "-CA",
                       dir + "/" + ca + ".pem", "-CAkey", dir + "/" + ca + ".key", "-set_serial",
                       std::to_string(next_serial++), "-days", "3650", "-sha256", "-extfile",
                       config, "-extensions", extensions, "-out", dir + "/" + name + ".pem"})
        .status();
  };

  absl::Status s = make_ca("ca", "Mesh Test CA");
  if (s.ok()) s = make_ca("other_ca", "Mesh Other Test CA");
  if (s.ok()) s = make_leaf("server", "localhost", "ca", "server_ext");
  if (s.ok()) s = make_leaf("client", "mesh-test-client", "ca", "client_ext");
  if (s.ok()) s = make_leaf("other_server", "localhost", "other_ca", "server_ext");
  if (s.ok()) s = make_leaf("other_client", "mesh-test-client", "other_ca", "client_ext");
  if (s.ok()) s = make_csr("expired_client", "mesh-test-expired-client");
  if (s.ok()) {
    s = RunOpenssl({"ca", "-config", config, "-batch", "-notext", "-in",
                    dir + "/expired_client.csr", "-out", dir + "/expired_client.pem", "-cert",
                    dir + "/ca.pem", "-keyfile", dir + "/ca.key", "-startdate", "20200101000000Z",
                    "-enddate", "20200102000000Z", "-extensions", "client_ext"})
            .status();
  }
  if (!s.ok()) return s;

  TestPki pki;
  pki.dir = dir;
  pki.ca_cert = dir + "/ca.pem";
  pki.server_cert = dir + "/server.pem";
  pki.server_key = dir + "/server.key";
  pki.client_cert = dir + "/client.pem";
  pki.client_key = dir + "/client.key";
  pki.other_ca_cert = dir + "/other_ca.pem";
  pki.other_server_cert = dir + "/other_server.pem";
  pki.other_server_key = dir + "/other_server.key";
  pki.other_client_cert = dir + "/other_client.pem";
  pki.other_client_key = dir + "/other_client.key";
  pki.expired_client_cert = dir + "/expired_client.pem";
  pki.expired_client_key = dir + "/expired_client.key";
  return pki;
}

}  // namespace mesh::testing
