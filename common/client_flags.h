// The client-side security flags shared by meshctl and mesh-agent:
//
//   --tls-ca FILE          MESH_TLS_CA           CA that verifies the coordinator
//   --tls-cert FILE        MESH_TLS_CERT         client certificate (mTLS)
//   --tls-key FILE         MESH_TLS_KEY          its private key
//   --tls-server-name NAME MESH_TLS_SERVER_NAME  name expected in the server cert
//   --token-file FILE      MESH_TOKEN_FILE       bearer token, one line
//   (env only)             MESH_TOKEN            bearer token; wins over the file
//
// There is deliberately no --token flag: a token on a command line is
// visible to every user of the machine through /proc.
//
// Errors (Resolve): the errors of security::ReadTokenFile and
// security::ValidateClientSecurity.
// Thread safety: none needed; used from main.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "common/security.h"

namespace mesh {

struct ClientSecurityFlags {
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  std::string token_file;

  // Registers the flags above on `app` (with their env names), in the
  // option group "Security".
  void AddTo(CLI::App& app);

  // The settings: flags, the token from MESH_TOKEN or the token file,
  // validated.
  absl::StatusOr<security::ClientSecurity> Resolve() const;
};

}  // namespace mesh
