#include <net/if.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <utility>

#include <gloo/transport/tcp/device.h>

#include "absl/strings/str_cat.h"
#include "backends/gloo/gloo_context.h"
#include "backends/gloo/gloo_device_thread.h"
#include "backends/gloo/gloo_errors.h"
#include "backends/gloo/gloo_group_state.h"
#include "backends/gloo/gloo_store.h"
#include "common/duration_format.h"
#include "mesh/prefix_store.h"
#include "mesh/process_group_gloo.h"

namespace mesh {

// gloo's TCP device: one epoll thread serving every group of the factory.
class GlooProcessGroupFactory::Device {
 public:
  Device(std::shared_ptr<::gloo::transport::Device> device, std::string address)
      : device(std::move(device)), address(std::move(address)) {}
  const std::shared_ptr<::gloo::transport::Device> device;
  const std::string address;
};

namespace {

// gloo 0.5's tcp::CreateDevice checks getaddrinfo's result against -1, but
// getaddrinfo reports failure with EAI_* codes, so an unresolvable name
// makes gloo walk an uninitialized list and crash. Resolve first.
absl::Status CheckResolves(const std::string& hostname) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* result = nullptr;
  const int rv = getaddrinfo(hostname.c_str(), nullptr, &hints, &result);
  if (rv != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: cannot resolve hostname '", hostname, "': ", gai_strerror(rv)));
  }
  freeaddrinfo(result);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<::gloo::transport::Device>> CreateTcpDevice(
    const ::gloo::transport::tcp::attr& attr, const std::string& what) {
  if (!attr.hostname.empty()) {
    if (absl::Status s = CheckResolves(attr.hostname); !s.ok()) return s;
  }
  try {
    return ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("gloo: cannot bind to ", what, ": ", e.what()));
  }
}

// See GlooOptions::hostname for the order of preference.
absl::StatusOr<std::unique_ptr<GlooProcessGroupFactory::Device>> MakeDevice(
    const GlooOptions& options) {
  ::gloo::transport::tcp::attr attr;
  if (!options.hostname.empty()) {
    attr.hostname = options.hostname;
    auto device = CreateTcpDevice(attr, absl::StrCat("hostname '", options.hostname, "'"));
    if (!device.ok()) return device.status();
    return std::make_unique<GlooProcessGroupFactory::Device>(*std::move(device), options.hostname);
  }
  if (!options.iface.empty()) {
    // gloo throws for an unknown interface too, but leaks getifaddrs' list
    // on the way out; ask the kernel first.
    if (if_nametoindex(options.iface.c_str()) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("gloo: no network interface '", options.iface, "' on this host"));
    }
    attr.iface = options.iface;
    auto device = CreateTcpDevice(attr, absl::StrCat("interface '", options.iface, "'"));
    if (!device.ok()) return device.status();
    return std::make_unique<GlooProcessGroupFactory::Device>(*std::move(device),
                                                             absl::StrCat("iface:", options.iface));
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') {
    attr.hostname = name;
    auto device = CreateTcpDevice(attr, absl::StrCat("hostname '", name, "'"));
    if (device.ok()) {
      return std::make_unique<GlooProcessGroupFactory::Device>(*std::move(device), name);
    }
  }
  // As c10d does: a host whose name does not resolve can still run jobs
  // that stay on it.
  ::gloo::transport::tcp::attr loopback;
  loopback.hostname = "127.0.0.1";
  auto device = CreateTcpDevice(loopback, "127.0.0.1");
  if (!device.ok()) return device.status();
  return std::make_unique<GlooProcessGroupFactory::Device>(*std::move(device), "127.0.0.1");
}

}  // namespace

namespace {

// gloo's TCP transport writes to its sockets without MSG_NOSIGNAL, so a write
// to a peer that has just died raises SIGPIPE, whose default action kills
// this process: a peer's death would take every survivor down with it
// instead of failing their ops with UNAVAILABLE. Ignore SIGPIPE, unless the
// application installed its own handler (or already ignores it); writes
// then fail with EPIPE, which gloo reports as an I/O error.
void IgnoreSigpipeUnlessHandled() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
        (current.sa_flags & SA_SIGINFO) == 0) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooProcessGroupFactory>> GlooProcessGroupFactory::Create(
    std::shared_ptr<Store> store, int world_rank, int world_size, GlooOptions options) {
  IgnoreSigpipeUnlessHandled();
  if (store == nullptr) return absl::InvalidArgumentError("gloo: store is null");
  if (world_size <= 0 || world_rank < 0 || world_rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: rank ", world_rank, " is not in a world of size ", world_size));
  }
  if (options.group.timeout <= absl::ZeroDuration() ||
      options.group.timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: timeout must be positive and finite, got ",
                     FormatDurationShort(options.group.timeout)));
  }
  auto device = MakeDevice(options);
  if (!device.ok()) return device.status();
  if (options.batch_device_thread) {
    // Best effort (GlooOptions::batch_device_thread): a refusal only costs
    // small-message latency on a busy machine.
    static_cast<void>(gloo_backend::SetDeviceThreadBatchPolicy((*device)->device));
  }
  return std::unique_ptr<GlooProcessGroupFactory>(new GlooProcessGroupFactory(
      std::move(store), world_rank, world_size, std::move(options), *std::move(device)));
}

GlooProcessGroupFactory::GlooProcessGroupFactory(std::shared_ptr<Store> store, int world_rank,
                                                 int world_size, GlooOptions options,
                                                 std::unique_ptr<Device> device)
    : store_(std::move(store)),
      world_rank_(world_rank),
      world_size_(world_size),
      options_(std::move(options)),
      device_(std::move(device)) {}

GlooProcessGroupFactory::~GlooProcessGroupFactory() = default;

const std::string& GlooProcessGroupFactory::address() const { return device_->address; }

absl::StatusOr<std::shared_ptr<ProcessGroupGloo>> GlooProcessGroupFactory::MakeGroup(
    const std::string& name, const std::vector<int>& global_ranks) {
  const int size = static_cast<int>(global_ranks.size());
  const int rank = static_cast<int>(
      std::find(global_ranks.begin(), global_ranks.end(), world_rank_) - global_ranks.begin());
  int generation = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!abort_status_.ok()) return abort_status_;
    generation = generations_[name]++;
  }
  std::shared_ptr<gloo_backend::GlooContext> context;
  std::shared_ptr<::gloo::rendezvous::Store> rendezvous_store;
  std::unique_ptr<gloo_backend::ShmGroup> shm;
  if (size > 1) {
    auto group_store =
        std::make_shared<PrefixStore>(absl::StrCat("gloo/", name, "/", generation), store_);
    rendezvous_store = std::make_shared<gloo_backend::GlooStore>(group_store, size);
    context = std::make_shared<gloo_backend::GlooContext>(rank, size);
    context->setTimeout(absl::ToChronoMilliseconds(options_.group.timeout));
    const absl::Status connected = gloo_backend::CatchGloo(
        absl::StrCat("gloo group '", name, "' rank ", rank, "/", size, ": rendezvous"),
        global_ranks, [&] { context->Connect(*rendezvous_store, device_->device); });
    if (!connected.ok()) return connected;
    if (options_.shared_memory) {
      auto made = gloo_backend::ShmGroup::Create(
          *group_store, rank, size, options_.shared_memory_slot_bytes, options_.group.timeout);
      if (!made.ok()) {
        return absl::Status(made.status().code(),
                            absl::StrCat("gloo group '", name, "' rank ", rank, "/", size,
                                         ": shared-memory rendezvous: ", made.status().message()));
      }
      shm = *std::move(made);
    }
  }
  auto state = std::make_shared<ProcessGroupGloo::State>(
      rank, global_ranks, name, options_, std::move(context), std::move(rendezvous_store),
      std::move(shm));
  state->Start();
  std::shared_ptr<ProcessGroupGloo> group(
      new ProcessGroupGloo(rank, global_ranks, name, options_, std::move(state)));
  absl::Status aborted;
  {
    absl::MutexLock lock(&mu_);
    aborted = abort_status_;
    // Forget groups their users dropped, so rebuilding families in a loop
    // does not grow the list.
    groups_.erase(
        std::remove_if(groups_.begin(), groups_.end(),
                       [](const std::weak_ptr<ProcessGroupGloo>& g) { return g.expired(); }),
        groups_.end());
    groups_.push_back(group);
  }
  if (!aborted.ok()) group->Abort(aborted);
  return group;
}

absl::StatusOr<std::shared_ptr<ProcessGroup>> GlooProcessGroupFactory::World() {
  absl::MutexLock create_lock(&create_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (world_ != nullptr) return std::shared_ptr<ProcessGroup>(world_);
  }
  std::vector<int> ranks(world_size_);
  for (int i = 0; i < world_size_; ++i) ranks[i] = i;
  auto world = MakeGroup("world", ranks);
  if (!world.ok()) return world.status();
  absl::MutexLock lock(&mu_);
  world_ = *world;
  return std::shared_ptr<ProcessGroup>(world_);
}

absl::StatusOr<std::vector<std::shared_ptr<ProcessGroup>>> GlooProcessGroupFactory::NewGroups(
    const std::vector<GroupSpec>& specs) {
  for (const GroupSpec& spec : specs) {
    const std::string what =
        absl::StrCat("gloo: group spec '", spec.family, "' color ", spec.color);
    if (spec.family.empty())
      return absl::InvalidArgumentError(absl::StrCat(what, ": empty family"));
    if (spec.color < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative color"));
    std::set<int> seen;
    for (int r : spec.global_ranks) {
      if (r < 0 || r >= world_size_) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": rank ", r, " is outside the world of ", world_size_));
      }
      if (!seen.insert(r).second) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": rank ", r, " appears twice"));
      }
    }
    if (seen.count(world_rank_) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": does not contain this process's rank ", world_rank_));
    }
  }
  absl::MutexLock create_lock(&create_mu_);
  std::vector<std::shared_ptr<ProcessGroup>> groups;
  groups.reserve(specs.size());
  for (const GroupSpec& spec : specs) {
    auto group = MakeGroup(absl::StrCat(spec.family, "/", spec.color), spec.global_ranks);
    if (!group.ok()) return group.status();
    groups.push_back(*std::move(group));
  }
  return groups;
}

void GlooProcessGroupFactory::AbortAll(absl::Status reason) {
  if (reason.ok()) reason = absl::AbortedError("gloo: AbortAll");
  std::vector<std::shared_ptr<ProcessGroupGloo>> live;
  {
    absl::MutexLock lock(&mu_);
    if (abort_status_.ok()) abort_status_ = reason;
    for (const auto& weak : groups_) {
      if (auto group = weak.lock()) live.push_back(std::move(group));
    }
  }
  for (const auto& group : live) group->Abort(reason);
}

}  // namespace mesh
