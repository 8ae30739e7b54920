#include "common/security.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include <grpc/grpc_security_constants.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mesh::security {
namespace {

// PEM files and tokens are small; a bound keeps a mistaken path (a log, a
// device) from being read whole.
constexpr size_t kMaxFileBytes = 16 << 20;

constexpr char kCertificateMarker[] = "-----BEGIN CERTIFICATE-----";
// Matches "BEGIN PRIVATE KEY", "BEGIN EC PRIVATE KEY", "BEGIN RSA PRIVATE
// KEY" and "BEGIN ENCRYPTED PRIVATE KEY" alike.
constexpr char kPrivateKeyMarker[] = "PRIVATE KEY-----";

// The content of `path`, or NOT_FOUND / PERMISSION_DENIED / INVALID_ARGUMENT
// naming `what` and the path.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string message =
        absl::StrCat("cannot open ", what, " '", path, "': ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(message);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
    return absl::InvalidArgumentError(message);
  }
  std::string content;
  char buffer[8192];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      content.append(buffer, static_cast<size_t>(n));
      if (content.size() > kMaxFileBytes) {
        ::close(fd);
        return absl::InvalidArgumentError(
            absl::StrCat(what, " '", path, "' is larger than ", kMaxFileBytes, " bytes"));
      }
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      const int err = errno;
      ::close(fd);
      // EISDIR lands here: open(2) accepts a directory, read(2) does not.
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read ", what, " '", path, "': ", std::strerror(err)));
    }
  }
  ::close(fd);
  return content;
}

// The content of `path` when it is readable and holds a PEM block with
// `marker`.
absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what,
                                        absl::string_view marker) {
  absl::StatusOr<std::string> content = ReadSmallFile(path, what);
  if (!content.ok()) return content.status();
  if (!absl::StrContains(*content, marker)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' holds no PEM block with \"", marker, "\""));
  }
  return content;
}

// Checks that `path` is readable PEM and that its first certificate parses.
absl::Status CheckCertificateFile(const std::string& path, const std::string& what) {
  absl::StatusOr<std::string> pem = ReadPemFile(path, what, kCertificateMarker);
  if (!pem.ok()) return pem.status();
  BIO* bio = BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size()));
  X509* cert = bio == nullptr ? nullptr : PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  const bool parsed = cert != nullptr;
  X509_free(cert);
  BIO_free(bio);
  ERR_clear_error();  // see CheckKeyPair
  if (!parsed) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", path, "' cannot be parsed as X.509"));
  }
  return absl::OkStatus();
}

// Refuses a pass phrase: PEM_read_bio_PrivateKey would otherwise prompt on
// the terminal for an encrypted key.
int NoPassphrase(char*, int, int, void*) { return 0; }

// Checks that `cert_file` and `key_file` are readable PEM, that both parse,
// and that the key belongs to the first certificate. gRPC accepts a
// mismatched pair silently and then fails every handshake ("Socket closed"
// on the client); this turns that into a start-up error.
absl::Status CheckKeyPair(const std::string& cert_file, const std::string& key_file,
                          const std::string& who) {
  absl::StatusOr<std::string> cert_pem =
      ReadPemFile(cert_file, who + " certificate", kCertificateMarker);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadPemFile(key_file, who + " key", kPrivateKeyMarker);
  if (!key_pem.ok()) return key_pem.status();

  absl::Status status = absl::OkStatus();
  BIO* cert_bio = BIO_new_mem_buf(cert_pem->data(), static_cast<int>(cert_pem->size()));
  BIO* key_bio = BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size()));
  X509* cert =
      cert_bio == nullptr ? nullptr : PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  EVP_PKEY* key = key_bio == nullptr
                      ? nullptr
                      : PEM_read_bio_PrivateKey(key_bio, nullptr, NoPassphrase, nullptr);
  if (cert == nullptr) {
    status = absl::InvalidArgumentError(
        absl::StrCat(who, " certificate '", cert_file, "' cannot be parsed as X.509"));
  } else if (key == nullptr) {
    status = absl::InvalidArgumentError(absl::StrCat(
        who, " key '", key_file, "' cannot be parsed (encrypted keys are not supported)"));
  } else if (X509_check_private_key(cert, key) != 1) {
    status = absl::InvalidArgumentError(absl::StrCat(
        who, " key '", key_file, "' does not belong to the certificate '", cert_file, "'"));
  }
  EVP_PKEY_free(key);
  X509_free(cert);
  BIO_free(key_bio);
  BIO_free(cert_bio);
  // gRPC's TLS code reads this thread's OpenSSL error queue after its own
  // calls; leave nothing of ours there.
  ERR_clear_error();
  return status;
}

// FileWatcherCertificateProvider takes whole seconds, at least one.
unsigned int RefreshSeconds(absl::Duration interval) {
  const int64_t seconds = absl::ToInt64Seconds(absl::Ceil(interval, absl::Seconds(1)));
  if (seconds < 1) return 1;
  if (seconds > static_cast<int64_t>(UINT_MAX)) return UINT_MAX;
  return static_cast<unsigned int>(seconds);
}

// A metadata value must be printable ASCII without spaces for gRPC to send
// it; a token with a stray newline would otherwise fail every call.
absl::Status CheckToken(const std::string& token) {
  for (const char c : token) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x21 || u > 0x7e) {
      return absl::InvalidArgumentError(
          "the bearer token holds whitespace or a non-printable character");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckServerTlsFiles(const ServerTlsOptions& options) {
  if (options.cert_file.empty() && options.key_file.empty()) {
    if (!options.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "a client CA (mTLS) needs the server's own certificate and key as well");
    }
    return absl::InvalidArgumentError("TLS server credentials need a certificate and a key");
  }
  if (options.cert_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("server key '", options.key_file, "' given without a certificate"));
  }
  if (options.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("server certificate '", options.cert_file, "' given without a key"));
  }
  if (absl::Status s = CheckKeyPair(options.cert_file, options.key_file, "server"); !s.ok()) {
    return s;
  }
  if (!options.client_ca_file.empty()) {
    return CheckCertificateFile(options.client_ca_file, "client CA");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsOptions& options) {
  if (absl::Status s = CheckServerTlsFiles(options); !s.ok()) return s;
  const bool mtls = !options.client_ca_file.empty();

  // The provider reads the files now and again every refresh interval, on
  // its own thread; the credentials keep it alive.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.key_file, options.cert_file, options.client_ca_file,
      RefreshSeconds(options.refresh_interval));
  grpc::experimental::TlsServerCredentialsOptions tls_options(provider);
  tls_options.watch_identity_key_cert_pairs();
  if (mtls) {
    tls_options.watch_root_certs();
    tls_options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    tls_options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::experimental::TlsServerCredentials(tls_options);
  if (credentials == nullptr) {
    return absl::InternalError("gRPC refused the TLS server options");
  }
  return credentials;
}

absl::Status ValidateClientSecurity(const ClientSecurity& security) {
  if (!security.tls()) {
    if (!security.token.empty()) {
      return absl::InvalidArgumentError(
          "a bearer token needs a CA (--tls-ca, MESH_TLS_CA): tokens are never sent over "
          "plaintext");
    }
    if (!security.cert_file.empty() || !security.key_file.empty()) {
      return absl::InvalidArgumentError(
          "a client certificate/key (mTLS) needs a CA to verify the server (--tls-ca, "
          "MESH_TLS_CA)");
    }
    if (!security.server_name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TLS server name '", security.server_name,
          "' given without a CA (--tls-ca, MESH_TLS_CA): the channel would be plaintext and the "
          "name never checked"));
    }
    return absl::OkStatus();
  }
  if (security.cert_file.empty() != security.key_file.empty()) {
    return absl::InvalidArgumentError(
        security.cert_file.empty()
            ? absl::StrCat("client key '", security.key_file,
                           "' given without a certificate (--tls-cert, MESH_TLS_CERT)")
            : absl::StrCat("client certificate '", security.cert_file,
                           "' given without a key (--tls-key, MESH_TLS_KEY)"));
  }
  if (absl::Status s = CheckCertificateFile(security.ca_file, "CA"); !s.ok()) return s;
  if (!security.cert_file.empty()) {
    if (absl::Status s = CheckKeyPair(security.cert_file, security.key_file, "client"); !s.ok()) {
      return s;
    }
  }
  return CheckToken(security.token);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientSecurity& security) {
  if (absl::Status s = ValidateClientSecurity(security); !s.ok()) return s;
  if (!security.tls()) return grpc::InsecureChannelCredentials();

  const unsigned int refresh = RefreshSeconds(security.refresh_interval);
  const bool mtls = !security.cert_file.empty();
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider =
      mtls ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                 security.key_file, security.cert_file, security.ca_file, refresh)
           : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(security.ca_file,
                                                                                  refresh);
  grpc::experimental::TlsChannelCredentialsOptions tls_options;
  tls_options.set_certificate_provider(provider);
  tls_options.watch_root_certs();
  if (mtls) tls_options.watch_identity_key_cert_pairs();
  // Verify the chain (the default) and, explicitly, that the certificate
  // names the target (or server_name): without a verifier set, whether the
  // host name is checked is an implementation detail of the gRPC version.
  tls_options.set_verify_server_certs(true);
  tls_options.set_certificate_verifier(
      std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::experimental::TlsCredentials(tls_options);
  if (credentials == nullptr) {
    return absl::InternalError("gRPC refused the TLS channel options");
  }
  if (!security.token.empty()) {
    credentials = grpc::CompositeChannelCredentials(credentials,
                                                    grpc::AccessTokenCredentials(security.token));
    if (credentials == nullptr) {
      return absl::InternalError("gRPC refused to compose TLS and token credentials");
    }
  }
  return credentials;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ClientSecurity& security,
                                                           grpc::ChannelArguments args) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(security);
  if (!credentials.ok()) return credentials.status();
  if (security.tls() && !security.server_name.empty()) {
    args.SetSslTargetNameOverride(security.server_name);
  }
  return grpc::CreateCustomChannel(target, *credentials, args);
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> content = ReadSmallFile(path, "token file");
  if (!content.ok()) return content.status();
  const std::string token(absl::StripAsciiWhitespace(*content));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file '", path, "' is empty"));
  }
  if (token.find_first_of("\r\n") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file '", path, "' holds more than one line; expected one token"));
  }
  return token;
}

absl::StatusOr<ClientSecurity> ClientSecurityFromEnv() {
  auto get = [](const char* name) {
    const char* value = std::getenv(name);
    return value == nullptr ? std::string() : std::string(value);
  };
  ClientSecurity security;
  security.ca_file = get(kEnvTlsCa);
  security.cert_file = get(kEnvTlsCert);
  security.key_file = get(kEnvTlsKey);
  security.server_name = get(kEnvTlsServerName);
  if (std::getenv(kEnvToken) != nullptr) {
    security.token = get(kEnvToken);
  } else if (const std::string token_file = get(kEnvTokenFile); !token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(token_file);
    if (!token.ok()) return token.status();
    security.token = *std::move(token);
  }
  return security;
}

std::map<std::string, std::string> ClientSecurityEnv(const ClientSecurity& security) {
  std::map<std::string, std::string> env;
  auto put = [&env](const char* name, const std::string& value) {
    if (!value.empty()) env[name] = value;
  };
  // Not std::filesystem::absolute: it would throw when the working
  // directory is gone; then the path is passed as it is.
  auto absolute = [](const std::string& path) -> std::string {
    if (path.empty() || path[0] == '/') return path;
    char cwd[PATH_MAX];
    if (::getcwd(cwd, sizeof(cwd)) == nullptr) return path;
    return absl::StrCat(cwd, "/", path);
  };
  put(kEnvTlsCa, absolute(security.ca_file));
  put(kEnvTlsCert, absolute(security.cert_file));
  put(kEnvTlsKey, absolute(security.key_file));
  put(kEnvTlsServerName, security.server_name);
  put(kEnvToken, security.token);
  return env;
}

}  // namespace mesh::security
