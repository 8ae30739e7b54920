// A throw-away PKI for TLS/mTLS tests, made with the `openssl` command-line
// tool (OpenSSL 3.0) in a directory the test owns.
//
// What MakeTestPki writes (all PEM, EC prime256v1 keys so that it is quick):
//   ca_cert                      "Mesh Test CA", self-signed.
//   server_cert/server_key       signed by ca_cert; CN=localhost,
//                                SAN DNS:localhost + IP:127.0.0.1, serverAuth.
//   client_cert/client_key       signed by ca_cert; CN=mesh-test-client,
//                                clientAuth.
//   other_ca_cert                "Mesh Other Test CA", unrelated to ca_cert.
//   other_server_cert/_key       like server_*, signed by other_ca_cert.
//   other_client_cert/_key       like client_*, signed by other_ca_cert.
//   expired_client_cert/_key     signed by ca_cert, valid only during
//                                2020-01-01..2020-01-02 (notAfter in the
//                                past; made with `openssl ca -enddate`, since
//                                OpenSSL 3.0's x509 has no -not_after).
// Certificates are valid for ~10 years otherwise. The CA keys and the
// `openssl ca` bookkeeping files stay in `dir` as well.
//
// Errors: FAILED_PRECONDITION when the openssl binary is missing (tests call
// HaveOpenssl() first and GTEST_SKIP); INTERNAL when a command fails (the
// message holds the command and its output); whatever creating `dir` gives.
//
// Thread safety: MakeTestPki runs child processes and blocks until they are
// done; calls with different directories may run concurrently.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mesh::testing {

struct TestPki {
  std::string dir;
  std::string ca_cert;
  std::string server_cert;
  std::string server_key;
  std::string client_cert;
  std::string client_key;
  std::string other_ca_cert;
  std::string other_server_cert;
  std::string other_server_key;
  std::string other_client_cert;
  std::string other_client_key;
  std::string expired_client_cert;
  std::string expired_client_key;
};

// Whether an executable `openssl` is on PATH.
bool HaveOpenssl();

// Creates `dir` (and parents) if needed and writes the PKI above into it.
// Takes well under a second on an idle machine.
absl::StatusOr<TestPki> MakeTestPki(const std::string& dir);

// Runs `openssl args...` with stdout/stderr captured; INTERNAL (with the
// output) when it does not exit 0. On success returns stdout+stderr.
absl::StatusOr<std::string> RunOpenssl(const std::vector<std::string>& args);

}  // namespace mesh::testing
