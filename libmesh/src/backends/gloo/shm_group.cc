#include "backends/gloo/shm_group.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backends/gloo/gloo_context.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MESH_CPU_RELAX() _mm_pause()
#else
#define MESH_CPU_RELAX() \
  do {                   \
  } while (false)
#endif

namespace mesh::gloo_backend {

struct alignas(64) ShmGroup::Header {
  uint64_t magic;
  uint64_t size;
  uint64_t slot_bytes;
  // 0, or 1 + the member that aborted the group.
  std::atomic<int32_t> aborted_by;
};

struct alignas(64) ShmGroup::Control {
  // The member's last barrier number; the futex word its peers wait on.
  std::atomic<uint32_t> seq;
  std::atomic<int32_t> pid;
  // Per-member values the members agree on (all-to-all round counts),
  // alternating by parity: member r rewrites word k % 2 in its all-to-all
  // number k only after everyone passed all-to-all k-1's first barrier,
  // i.e. after everyone read word k % 2 of all-to-all k-2.
  std::atomic<uint64_t> agree[2];
};

namespace {

constexpr uint64_t kMagic = 0x6d6573682d73686dULL;  // "mesh-shm"
// Tens of microseconds of spinning (pause instructions) before sleeping on
// the futex. Measured with 2 processes (docs/collectives.md): a 64 KiB
// all-reduce takes ~21 us with this spin and ~72 us with a tenth of it,
// because a peer that is a few microseconds behind no longer costs a futex
// sleep and wake-up. Short enough that a waiter gives its core back soon
// when the peer really is late.
constexpr int kSpinIterations = 4000;
constexpr auto kSlice = std::chrono::milliseconds(20);

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

uint32_t* FutexWord(std::atomic<uint32_t>* a) { return reinterpret_cast<uint32_t*>(a); }

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  syscall(SYS_futex, FutexWord(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, FutexWord(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

std::string ReadFirstLine(const char* path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

std::string ReadLink(const char* path) {
  char buf[256];
  const ssize_t n = readlink(path, buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Members share memory, and can check each other's liveness by PID, only
// within one kernel boot, one mount namespace (/dev/shm) and one PID
// namespace. Anything unreadable makes the identity unique, i.e. no sharing.
std::string HostIdentity() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string boot = ReadFirstLine("/proc/sys/kernel/random/boot_id");
  const std::string mnt = ReadLink("/proc/self/ns/mnt");
  const std::string pid = ReadLink("/proc/self/ns/pid");
  if (boot.empty() || mnt.empty() || pid.empty()) {
    return absl::StrCat("unshareable-", std::random_device{}(), "-", getpid());
  }
  return absl::StrCat(host, "|", boot, "|", mnt, "|", pid);
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t ControlOffset() { return RoundUp(sizeof(ShmGroup::Header), 64); }
size_t DataOffset(int size) {
  return RoundUp(ControlOffset() + size * sizeof(ShmGroup::Control), 4096);
}
size_t SegmentBytes(int size, size_t slot_bytes) {
  return DataOffset(size) + (static_cast<size_t>(size) + 1) * slot_bytes;
}

std::chrono::steady_clock::time_point Deadline(std::chrono::milliseconds timeout) {
  return std::chrono::steady_clock::now() + timeout;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmGroup>> ShmGroup::Create(Store& store, int rank, int size,
                                                           size_t slot_bytes,
                                                           absl::Duration timeout) {
  slot_bytes = RoundUp(std::max<size_t>(slot_bytes, 64 * 1024), 4096);
  std::vector<std::string> host_keys, ok_keys;
  for (int r = 0; r < size; ++r) {
    host_keys.push_back(absl::StrCat("shm/host/", r));
    ok_keys.push_back(absl::StrCat("shm/ok/", r));
  }
  if (absl::Status s = store.Set(host_keys[rank], HostIdentity()); !s.ok()) return s;
  auto hosts = store.MultiGet(host_keys, timeout);
  if (!hosts.ok()) return hosts.status();
  if (std::any_of(hosts->begin(), hosts->end(),
                  [&](const std::string& h) { return h != (*hosts)[0]; })) {
    return nullptr;
  }

  const size_t total = SegmentBytes(size, slot_bytes);
  std::string name;
  int fd = -1;
  if (rank == 0) {
    std::random_device random;
    name = absl::StrFormat("/mesh-gloo-%08x%08x-%d", random(), random(), getpid());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    // posix_fallocate reserves the pages now: on a full tmpfs (a small
    // container /dev/shm) writing to an unreserved page would be SIGBUS.
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(total)) != 0 ||
        posix_fallocate(fd, 0, static_cast<off_t>(total)) != 0) {
      if (fd >= 0) {
        close(fd);
        shm_unlink(name.c_str());
        fd = -1;
      }
      name.clear();
    }
    if (absl::Status s = store.Set("shm/name", name); !s.ok()) {
      if (fd >= 0) {
        close(fd);
        shm_unlink(name.c_str());
      }
      return s;
    }
  } else {
    auto got = store.Get("shm/name", timeout);
    if (!got.ok()) return got.status();
    name = *std::move(got);
    if (!name.empty()) fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  }

  void* base = MAP_FAILED;
  if (fd >= 0) {
    struct stat st;
    if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == total) {
      base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
  }
  if (base != MAP_FAILED && rank == 0) {
    auto* header = new (base) Header();
    header->magic = kMagic;
    header->size = static_cast<uint64_t>(size);
    header->slot_bytes = slot_bytes;
    for (int r = 0; r < size; ++r) {
      new (static_cast<uint8_t*>(base) + ControlOffset() + r * sizeof(Control)) Control();
    }
  }
  absl::Status published = store.Set(ok_keys[rank], base != MAP_FAILED ? "1" : "0");
  auto oks = published.ok() ? store.MultiGet(ok_keys, timeout)
                            : absl::StatusOr<std::vector<std::string>>(published);
  // Everyone has mapped it (or given up) once all answers are in: the name
  // can go, and the memory lives as long as the mappings.
  if (rank == 0 && !name.empty()) shm_unlink(name.c_str());
  const bool all_ok = oks.ok() && std::all_of(oks->begin(), oks->end(),
                                              [](const std::string& v) { return v == "1"; });
  if (!all_ok) {
    if (base != MAP_FAILED) munmap(base, total);
    if (!oks.ok()) return oks.status();
    return nullptr;
  }
  // Rank 0 initialized the header before anyone could read "shm/ok/0".
  auto* header = static_cast<Header*>(base);
  if (header->magic != kMagic || header->size != static_cast<uint64_t>(size) ||
      header->slot_bytes != slot_bytes) {
    munmap(base, total);
    return absl::InternalError("shared-memory segment header mismatch");
  }
  auto group = std::unique_ptr<ShmGroup>(new ShmGroup(rank, size, slot_bytes, base, total));
  group->control_[rank].pid.store(getpid(), std::memory_order_release);
  return group;
}

ShmGroup::ShmGroup(int rank, int size, size_t slot_bytes, void* base, size_t mapped_bytes)
    : rank_(rank),
      size_(size),
      slot_bytes_(slot_bytes),
      base_(base),
      mapped_bytes_(mapped_bytes),
      header_(static_cast<Header*>(base)),
      control_(reinterpret_cast<Control*>(static_cast<uint8_t*>(base) + ControlOffset())) {
  epoch_ = control_[rank].seq.load(std::memory_order_acquire);
}

ShmGroup::~ShmGroup() { munmap(base_, mapped_bytes_); }

uint8_t* ShmGroup::in_slot(int member) const {
  return static_cast<uint8_t*>(base_) + DataOffset(size_) + member * slot_bytes_;
}

uint8_t* ShmGroup::result_slot() const { return in_slot(size_); }

void ShmGroup::Abort() {
  if (aborted_.exchange(true)) return;
  int32_t none = 0;
  header_->aborted_by.compare_exchange_strong(none, rank_ + 1);
  for (int r = 0; r < size_; ++r) FutexWakeAll(&control_[r].seq);
}

void ShmGroup::Sync(std::chrono::steady_clock::time_point deadline) {
  const uint32_t target = ++epoch_;
  control_[rank_].seq.store(target, std::memory_order_release);
  FutexWakeAll(&control_[rank_].seq);
  for (int j = 0; j < size_; ++j) {
    if (j != rank_) WaitFor(j, target, deadline);
  }
}

void ShmGroup::WaitFor(int peer, uint32_t target, std::chrono::steady_clock::time_point deadline) {
  for (int spin = 0;; ++spin) {
    const uint32_t seen = control_[peer].seq.load(std::memory_order_acquire);
    // A peer that arrived counts even if it aborted right after.
    if (static_cast<int32_t>(seen - target) >= 0) return;
    if (aborted_.load(std::memory_order_acquire)) throw AbortedError();
    if (const int32_t by = header_->aborted_by.load(std::memory_order_acquire); by != 0) {
      throw PeerIoError(absl::StrCat("shared-memory group aborted by group rank ", by - 1,
                                     " (failed or destroyed)"),
                        {by - 1});
    }
    if (spin < kSpinIterations) {
      MESH_CPU_RELAX();
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      throw PeerIoError(
          absl::StrCat("Timed out waiting for shared-memory peer at barrier ", target), {peer});
    }
    if (const int32_t pid = control_[peer].pid.load(std::memory_order_acquire);
        pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      throw PeerIoError(absl::StrCat("shared-memory peer process ", pid, " exited"), {peer});
    }
    FutexWait(&control_[peer].seq, seen,
              std::min<std::chrono::nanoseconds>(kSlice, deadline - now));
  }
}

void ShmGroup::AllReduce(void* data, size_t count, size_t elem, const ReduceFn& reduce,
                         std::chrono::milliseconds timeout) {
  uint8_t* bytes = static_cast<uint8_t*>(data);
  const size_t slot_elems = slot_bytes_ / elem;
  for (size_t off = 0; off < count; off += slot_elems) {
    const size_t m = std::min(slot_elems, count - off);
    // Member j reduces elements [lo(j), hi(j)) of the round. It reads its
    // own share from its own tensor, so members publish only the shares
    // others reduce: (n-1)/n of the round instead of all of it.
    const size_t per = (m + size_ - 1) / size_;
    auto lo = [&](int j) { return std::min(m, per * j); };
    auto hi = [&](int j) { return std::min(m, per * (j + 1)); };
    uint8_t* round = bytes + off * elem;
    for (int j = 0; j < size_; ++j) {
      if (j != rank_ && hi(j) > lo(j)) {
        std::memcpy(in_slot(rank_) + lo(j) * elem, round + lo(j) * elem, (hi(j) - lo(j)) * elem);
      }
    }
    Sync(Deadline(timeout));
    if (const size_t mine = lo(rank_), n = hi(rank_) - mine; n > 0) {
      // In place in this member's tensor, then published for the others.
      uint8_t* acc = round + mine * elem;
      for (int j = 0; j < size_; ++j) {
        if (j != rank_) reduce(acc, acc, in_slot(j) + mine * elem, n);
      }
      std::memcpy(result_slot() + mine * elem, acc, n * elem);
    }
    Sync(Deadline(timeout));
    for (int j = 0; j < size_; ++j) {
      if (j != rank_ && hi(j) > lo(j)) {
        std::memcpy(round + lo(j) * elem, result_slot() + lo(j) * elem, (hi(j) - lo(j)) * elem);
      }
    }
  }
}

void ShmGroup::Broadcast(void* data, size_t bytes, int root, std::chrono::milliseconds timeout) {
  uint8_t* p = static_cast<uint8_t*>(data);
  for (size_t off = 0; off < bytes; off += slot_bytes_) {
    const size_t m = std::min(slot_bytes_, bytes - off);
    // The root's own input slot, not the result slot: members may still be
    // copying the previous op's result out, and only input slots are free
    // before the first barrier of an op.
    if (rank_ == root) std::memcpy(in_slot(root), p + off, m);
    Sync(Deadline(timeout));
    if (rank_ != root) std::memcpy(p + off, in_slot(root), m);
    Sync(Deadline(timeout));
  }
}

void ShmGroup::AllGather(const void* input, void* output, size_t bytes,
                         std::chrono::milliseconds timeout) {
  const uint8_t* in = static_cast<const uint8_t*>(input);
  uint8_t* out = static_cast<uint8_t*>(output);
  for (size_t off = 0; off < bytes; off += slot_bytes_) {
    const size_t m = std::min(slot_bytes_, bytes - off);
    std::memcpy(in_slot(rank_), in + off, m);
    Sync(Deadline(timeout));
    for (int j = 0; j < size_; ++j) std::memcpy(out + j * bytes + off, in_slot(j), m);
    Sync(Deadline(timeout));
  }
}

void ShmGroup::ReduceScatter(const void* input, void* output, size_t count, size_t elem,
                             const ReduceFn& reduce, std::chrono::milliseconds timeout) {
  const uint8_t* in = static_cast<const uint8_t*>(input);
  uint8_t* out = static_cast<uint8_t*>(output);
  // Each slot holds one piece per member: piece j of member r's slot is
  // member r's contribution to member j's chunk. A member's contribution to
  // its own chunk stays in its input.
  const size_t piece = slot_bytes_ / elem / size_;
  for (size_t off = 0; off < count; off += piece) {
    const size_t m = std::min(piece, count - off);
    for (int j = 0; j < size_; ++j) {
      if (j != rank_) {
        std::memcpy(in_slot(rank_) + j * piece * elem, in + (j * count + off) * elem, m * elem);
      }
    }
    Sync(Deadline(timeout));
    uint8_t* dest = out + off * elem;
    const uint8_t* own = in + (rank_ * count + off) * elem;  // May be `dest` (in place).
    const size_t mine = rank_ * piece * elem;
    bool first = true;
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      reduce(dest, first ? own : dest, in_slot(j) + mine, m);
      first = false;
    }
    Sync(Deadline(timeout));
  }
}

void ShmGroup::AllToAll(const void* input, const std::vector<size_t>& in_offsets,
                        const std::vector<size_t>& in_bytes, void* output,
                        const std::vector<size_t>& out_offsets,
                        const std::vector<size_t>& out_bytes, std::chrono::milliseconds timeout) {
  const uint8_t* in = static_cast<const uint8_t*>(input);
  uint8_t* out = static_cast<uint8_t*>(output);
  // Each slot holds one piece per member: piece j of member r's slot is
  // the next part of the block r sends to j.
  const size_t piece = slot_bytes_ / size_;
  uint64_t local_rounds = 0;
  for (int j = 0; j < size_; ++j) {
    const size_t longest = std::max(in_bytes[j], out_bytes[j]);
    local_rounds = std::max<uint64_t>(local_rounds, (longest + piece - 1) / piece);
  }
  const int word = static_cast<int>(all_to_alls_++ % 2);
  control_[rank_].agree[word].store(local_rounds, std::memory_order_relaxed);
  Sync(Deadline(timeout));
  uint64_t rounds = 0;
  for (int j = 0; j < size_; ++j) {
    rounds = std::max(rounds, control_[j].agree[word].load(std::memory_order_relaxed));
  }
  auto part = [&](size_t total, uint64_t round) {
    const size_t start = std::min<size_t>(total, round * piece);
    return std::make_pair(start, std::min(piece, total - start));
  };
  for (uint64_t t = 0; t < rounds; ++t) {
    for (int j = 0; j < size_; ++j) {
      const auto [start, len] = part(in_bytes[j], t);
      if (len > 0) std::memcpy(in_slot(rank_) + j * piece, in + in_offsets[j] + start, len);
    }
    Sync(Deadline(timeout));
    for (int j = 0; j < size_; ++j) {
      const auto [start, len] = part(out_bytes[j], t);
      if (len > 0) std::memcpy(out + out_offsets[j] + start, in_slot(j) + rank_ * piece, len);
    }
    Sync(Deadline(timeout));
  }
}

void ShmGroup::Barrier(std::chrono::milliseconds timeout) { Sync(Deadline(timeout)); }

}  // namespace mesh::gloo_backend
