#include "common/client_flags.h"

#include <cstdlib>

namespace mesh {

void ClientSecurityFlags::AddTo(CLI::App& app) {
  constexpr char kGroup[] = "Security";
  app.add_option("--tls-ca", tls_ca, "PEM CA that verifies the coordinator (enables TLS)")
      ->envname(security::kEnvTlsCa)
      ->group(kGroup);
  app.add_option("--tls-cert", tls_cert, "PEM client certificate chain, for mTLS")
      ->envname(security::kEnvTlsCert)
      ->group(kGroup);
  app.add_option("--tls-key", tls_key, "PEM private key of --tls-cert")
      ->envname(security::kEnvTlsKey)
      ->group(kGroup);
  app.add_option("--tls-server-name", tls_server_name,
                 "Name to expect in the coordinator's certificate (default: the host of the "
                 "address)")
      ->envname(security::kEnvTlsServerName)
      ->group(kGroup);
  app.add_option("--token-file", token_file,
                 "File holding the bearer token (MESH_TOKEN, if set, wins)")
      ->envname(security::kEnvTokenFile)
      ->group(kGroup);
}

absl::StatusOr<security::ClientSecurity> ClientSecurityFlags::Resolve() const {
  security::ClientSecurity resolved;
  resolved.ca_file = tls_ca;
  resolved.cert_file = tls_cert;
  resolved.key_file = tls_key;
  resolved.server_name = tls_server_name;
  if (const char* token = std::getenv(security::kEnvToken); token != nullptr && *token != '\0') {
    resolved.token = token;
  } else if (!token_file.empty()) {
    absl::StatusOr<std::string> token = security::ReadTokenFile(token_file);
    if (!token.ok()) return token.status();
    resolved.token = *std::move(token);
  }
  if (absl::Status valid = security::ValidateClientSecurity(resolved); !valid.ok()) return valid;
  return resolved;
}

}  // namespace mesh
