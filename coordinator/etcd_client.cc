#include "coordinator/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace mesh::coordinator {
namespace {

namespace pb = ::etcdserverpb;

// etcd's own refusals travel as gRPC statuses whose message starts with
// "etcdserver: "; a status without it comes from the transport.
bool FromEtcd(const grpc::Status& status) {
  return absl::StartsWith(status.error_message(), "etcdserver: ");
}

// Server errors after which a read may simply be asked again (a write may
// still commit later, so it is not retried).
bool Transient(const grpc::Status& status) {
  const std::string& m = status.error_message();
  return absl::StrContains(m, "no leader") || absl::StrContains(m, "leader changed") ||
         absl::StrContains(m, "request timed out") || absl::StrContains(m, "not capable") ||
         absl::StrContains(m, "too many requests");
}

absl::StatusCode CodeFor(const grpc::Status& status) {
  const std::string& m = status.error_message();
  if (absl::StrContains(m, "request is too large") ||
      absl::StrContains(m, "database space exceeded") ||
      absl::StrContains(m, "message larger than max")) {
    return absl::StatusCode::kResourceExhausted;
  }
  if (FromEtcd(status) && Transient(status)) return absl::StatusCode::kUnavailable;
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::StatusCode::kUnavailable;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::StatusCode::kDeadlineExceeded;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return absl::StatusCode::kResourceExhausted;
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::StatusCode::kUnauthenticated;
    case grpc::StatusCode::PERMISSION_DENIED:
      return absl::StatusCode::kPermissionDenied;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      return absl::StatusCode::kInvalidArgument;
    case grpc::StatusCode::NOT_FOUND:
      return absl::StatusCode::kNotFound;
    case grpc::StatusCode::FAILED_PRECONDITION:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd ", what, " '", path, "' cannot be read or is empty"));
  }
  return text.str();
}

EtcdKeyValue FromProto(const ::mvccpb::KeyValue& kv) {
  return EtcdKeyValue{kv.key(),          kv.value(),   kv.create_revision(),
                      kv.mod_revision(), kv.version(), kv.lease()};
}

}  // namespace

struct EtcdClient::Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Watch::Stub> watch;
  std::unique_ptr<pb::Maintenance::Stub> maintenance;
};

// ---- EtcdTxn ----------------------------------------------------------------

EtcdTxn& EtcdTxn::IfModRevision(std::string key, int64_t revision) {
  compares_.push_back(Compare{std::move(key), Target::kModRevision, revision, ""});
  return *this;
}

EtcdTxn& EtcdTxn::IfCreateRevision(std::string key, int64_t revision) {
  compares_.push_back(Compare{std::move(key), Target::kCreateRevision, revision, ""});
  return *this;
}

EtcdTxn& EtcdTxn::IfValue(std::string key, std::string value) {
  compares_.push_back(Compare{std::move(key), Target::kValue, 0, std::move(value)});
  return *this;
}

EtcdTxn& EtcdTxn::Put(std::string key, std::string value, int64_t lease) {
  ops_.push_back(Op{std::move(key), std::move(value), lease, /*is_delete=*/false});
  return *this;
}

EtcdTxn& EtcdTxn::Delete(std::string key) {
  ops_.push_back(Op{std::move(key), "", 0, /*is_delete=*/true});
  return *this;
}

// ---- EtcdClient -------------------------------------------------------------

EtcdClient::EtcdClient(EtcdClientOptions options) : options_(std::move(options)) {}

EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::shared_ptr<EtcdClient>> EtcdClient::Connect(EtcdClientOptions options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoints");
  for (const std::string& endpoint : options.endpoints) {
    std::pair<std::string, std::string> host_port = absl::StrSplit(endpoint, ':');
    int port = 0;
    if (host_port.first.empty() || !absl::SimpleAtoi(host_port.second, &port) || port < 1 ||
        port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint '", endpoint, "' is not host:port"));
    }
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "etcd: a client certificate and its key go together (give both or neither)");
  }
  if (options.ca_file.empty() && !options.cert_file.empty()) {
    return absl::InvalidArgumentError("etcd: a client certificate needs TLS (give the CA file)");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca = ReadFile(options.ca_file, "CA file");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (!options.cert_file.empty()) {
      absl::StatusOr<std::string> cert = ReadFile(options.cert_file, "certificate");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadFile(options.key_file, "key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(ssl);
  }

  std::shared_ptr<EtcdClient> client(new EtcdClient(options));
  for (const std::string& address : options.endpoints) {
    grpc::ChannelArguments args;
    // A member that restarts is back within a second, not gRPC's default
    // backoff of up to two minutes.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // A record may be as large as etcd takes (--max-request-bytes).
    args.SetMaxReceiveMessageSize(64 << 20);
    auto endpoint = std::make_unique<Endpoint>();
    endpoint->address = address;
    endpoint->channel = grpc::CreateCustomChannel(address, credentials, args);
    endpoint->kv = pb::KV::NewStub(endpoint->channel);
    endpoint->lease = pb::Lease::NewStub(endpoint->channel);
    endpoint->watch = pb::Watch::NewStub(endpoint->channel);
    endpoint->maintenance = pb::Maintenance::NewStub(endpoint->channel);
    client->endpoints_.push_back(std::move(endpoint));
  }

  // The first member to answer Status becomes the current endpoint.
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  std::vector<std::string> errors(client->endpoints_.size());
  for (;;) {
    for (size_t i = 0; i < client->endpoints_.size(); ++i) {
      Endpoint& endpoint = *client->endpoints_[i];
      grpc::ClientContext context;
      context.set_deadline(
          absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Milliseconds(500))));
      context.set_wait_for_ready(true);
      pb::StatusRequest request;
      pb::StatusResponse response;
      const grpc::Status status = endpoint.maintenance->Status(&context, request, &response);
      if (status.ok()) {
        client->current_ = i;
        return client;
      }
      errors[i] = absl::StrCat(endpoint.address, ": ", status.error_message());
      // Refusals that waiting does not cure.
      if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
          status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
        return absl::Status(CodeFor(status), absl::StrCat("etcd ", errors[i]));
      }
    }
    if (absl::Now() >= deadline) break;
  }
  return absl::UnavailableError(absl::StrCat("etcd: no member answered within ",
                                             absl::FormatDuration(options.connect_timeout), " (",
                                             absl::StrJoin(errors, "; "), ")"));
}

std::string EtcdClient::endpoints() const { return absl::StrJoin(options_.endpoints, ","); }

bool EtcdClient::tls() const { return !options_.ca_file.empty(); }

std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  // Every key from `prefix` on.
  return std::string(1, '\0');
}

template <typename Call>
absl::Status EtcdClient::Run(const char* what, bool idempotent, Call call) const {
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  const size_t n = endpoints_.size();
  size_t index = current_.load();
  absl::Duration backoff = absl::Milliseconds(20);
  grpc::Status last;
  std::string last_address;
  // The share of the deadline one endpoint gets to connect, so that a dead
  // one leaves time for the others.
  const absl::Duration connect_share =
      std::max(absl::Milliseconds(200), options_.call_timeout / static_cast<int>(n + 1));
  for (size_t attempt = 0;; ++attempt) {
    Endpoint& endpoint = *endpoints_[index % n];
    last_address = endpoint.address;
    // Connect first, and wait for it here: the waiting thread drives the
    // handshake (a call that fails fast leaves a reconnect to gRPC's backup
    // poller, seconds later), and a request that was never sent can go to
    // another member whatever it is.
    bool sent = false;
    if (endpoint.channel->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_READY &&
        !endpoint.channel->WaitForConnected(
            absl::ToChronoTime(std::min(deadline, absl::Now() + connect_share)))) {
      last = grpc::Status(grpc::StatusCode::UNAVAILABLE, "cannot connect");
    } else {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(deadline));
      last = call(endpoint, &context);
      sent = true;
    }
    if (last.ok()) {
      current_ = index % n;
      return absl::OkStatus();
    }
    const bool unreachable = last.error_code() == grpc::StatusCode::UNAVAILABLE && !FromEtcd(last);
    const bool retry =
        unreachable ? (idempotent || !sent) : (idempotent && FromEtcd(last) && Transient(last));
    if (!retry || absl::Now() >= deadline) break;
    ++index;
    // Once round every member, then back off before the next round.
    if ((attempt + 1) % n == 0) {
      absl::SleepFor(std::min(backoff, deadline - absl::Now()));
      backoff = std::min(backoff * 2, absl::Milliseconds(500));
    }
  }
  if (last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    // etcd holds a request it cannot serve (no leader, no quorum) until the
    // caller gives up: to the caller, etcd is unavailable.
    return absl::UnavailableError(
        absl::StrCat("etcd ", last_address, ": ", what, ": no answer within ",
                     absl::FormatDuration(options_.call_timeout), " (is a quorum of members up?)",
                     idempotent ? "" : "; whether the write took effect is unknown"));
  }
  return absl::Status(CodeFor(last),
                      absl::StrCat("etcd ", last_address, ": ", what, ": ", last.error_message()));
}

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::Get(const std::string& key) const {
  absl::StatusOr<EtcdRangeResult> range = Range(key, "", 1);
  if (!range.ok()) return range.status();
  if (range->kvs.empty()) return std::nullopt;
  return std::move(range->kvs.front());
}

absl::StatusOr<EtcdRangeResult> EtcdClient::Range(const std::string& key,
                                                  const std::string& range_end,
                                                  int64_t limit) const {
  pb::RangeRequest request;
  request.set_key(key);
  request.set_range_end(range_end);
  request.set_limit(limit);
  pb::RangeResponse response;
  absl::Status status =
      Run("range", /*idempotent=*/true, [&](Endpoint& endpoint, grpc::ClientContext* context) {
        response.Clear();
        return endpoint.kv->Range(context, request, &response);
      });
  if (!status.ok()) return status;
  EtcdRangeResult result;
  result.kvs.reserve(response.kvs_size());
  for (const ::mvccpb::KeyValue& kv : response.kvs()) result.kvs.push_back(FromProto(kv));
  result.more = response.more();
  result.revision = response.header().revision();
  return result;
}

absl::StatusOr<EtcdTxnResult> EtcdClient::Txn(const EtcdTxn& txn) const {
  pb::TxnRequest request;
  for (const EtcdTxn::Compare& c : txn.compares()) {
    pb::Compare* compare = request.add_compare();
    compare->set_key(c.key);
    compare->set_result(pb::Compare::EQUAL);
    switch (c.target) {
      case EtcdTxn::Target::kModRevision:
        compare->set_target(pb::Compare::MOD);
        compare->set_mod_revision(c.revision);
        break;
      case EtcdTxn::Target::kCreateRevision:
        compare->set_target(pb::Compare::CREATE);
        compare->set_create_revision(c.revision);
        break;
      case EtcdTxn::Target::kValue:
        compare->set_target(pb::Compare::VALUE);
        compare->set_value(c.value);
        break;
    }
  }
  for (const EtcdTxn::Op& op : txn.ops()) {
    pb::RequestOp* request_op = request.add_success();
    if (op.is_delete) {
      request_op->mutable_request_delete_range()->set_key(op.key);
    } else {
      pb::PutRequest* put = request_op->mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
    }
  }
  pb::TxnResponse response;
  absl::Status status =
      Run("txn", /*idempotent=*/false, [&](Endpoint& endpoint, grpc::ClientContext* context) {
        response.Clear();
        return endpoint.kv->Txn(context, request, &response);
      });
  if (!status.ok()) return status;
  return EtcdTxnResult{response.succeeded(), response.header().revision()};
}

absl::StatusOr<bool> EtcdClient::WaitForChange(const std::string& key, int64_t revision,
                                               absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  Endpoint& endpoint = *endpoints_[current_.load() % endpoints_.size()];
  if (endpoint.channel->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_READY &&
      !endpoint.channel->WaitForConnected(absl::ToChronoTime(deadline))) {
    return absl::UnavailableError(
        absl::StrCat("etcd ", endpoint.address, ": watch: cannot connect"));
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  auto stream = endpoint.watch->Watch(&context);
  pb::WatchRequest request;
  pb::WatchCreateRequest* create = request.mutable_create_request();
  create->set_key(key);
  create->set_start_revision(revision + 1);
  bool changed = false;
  if (stream->Write(request)) {
    pb::WatchResponse response;
    while (stream->Read(&response)) {
      // The first answer confirms the watch ("created"); a cancelled one
      // means the start revision was compacted away (or etcd refused the
      // watch): either way the caller reads the key again.
      if (response.events_size() > 0 || response.canceled()) {
        changed = true;
        break;
      }
    }
  }
  if (changed) {
    context.TryCancel();
    (void)stream->Finish();
    return true;
  }
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  if (status.ok() || status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return false;
  // etcd may notice the deadline first and end the stream itself, with its
  // own code ("context deadline exceeded"): the timeout passed all the same.
  if (absl::Now() >= deadline) return false;
  return absl::Status(CodeFor(status),
                      absl::StrCat("etcd ", endpoint.address, ": watch: ", status.error_message()));
}

absl::StatusOr<int64_t> EtcdClient::LeaseGrant(absl::Duration ttl) const {
  pb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, absl::ToInt64Seconds(ttl)));
  pb::LeaseGrantResponse response;
  // Not idempotent: a lost answer leaves a lease nobody renews, which
  // expires by itself.
  absl::Status status = Run("lease grant", /*idempotent=*/false,
                            [&](Endpoint& endpoint, grpc::ClientContext* context) {
                              response.Clear();
                              return endpoint.lease->LeaseGrant(context, request, &response);
                            });
  if (!status.ok()) return status;
  if (!response.error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd: lease grant: ", response.error()));
  }
  return response.id();
}

absl::StatusOr<absl::Duration> EtcdClient::LeaseKeepAlive(int64_t lease) const {
  pb::LeaseKeepAliveResponse response;
  absl::Status status = Run("lease keep-alive", /*idempotent=*/true,
                            [&](Endpoint& endpoint, grpc::ClientContext* context) {
                              response.Clear();
                              auto stream = endpoint.lease->LeaseKeepAlive(context);
                              pb::LeaseKeepAliveRequest request;
                              request.set_id(lease);
                              if (stream->Write(request)) stream->Read(&response);
                              stream->WritesDone();
                              // The server ends the stream only when the client does; Finish
                              // after WritesDone returns its status.
                              return stream->Finish();
                            });
  if (!status.ok()) return status;
  if (response.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd: lease ", lease, " has expired"));
  }
  return absl::Seconds(response.ttl());
}

absl::Status EtcdClient::LeaseRevoke(int64_t lease) const {
  pb::LeaseRevokeRequest request;
  request.set_id(lease);
  pb::LeaseRevokeResponse response;
  return Run("lease revoke", /*idempotent=*/true,
             [&](Endpoint& endpoint, grpc::ClientContext* context) {
               return endpoint.lease->LeaseRevoke(context, request, &response);
             });
}

}  // namespace mesh::coordinator
