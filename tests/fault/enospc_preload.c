// An LD_PRELOAD library for tests only (issue 10, scenario 10, where a
// tmpfs cannot be mounted): it makes writes under one directory fail with
// ENOSPC while a trigger file exists, as a full filesystem would, and
// passes everything else through untouched.
//
// Environment (read once, when the library is loaded):
//   MESH_TEST_ENOSPC_DIR      absolute, canonical directory (no symlinks:
//                             it is compared with readlink(/proc/self/fd/N)).
//   MESH_TEST_ENOSPC_TRIGGER  a path; while it exists, a write to a file at
//                             or under MESH_TEST_ENOSPC_DIR fails with
//                             ENOSPC. Create it to fill the "disk", remove
//                             it to free space; no restart needed.
// With either unset (or too long) the library only passes calls through.
//
// Wrapped: write, pwrite, pwrite64, writev, pwritev, pwritev64, pwritev2,
// pwritev64v2, fallocate, fallocate64, posix_fallocate, posix_fallocate64
// (which return the error instead of setting errno) and ftruncate,
// ftruncate64 when they would grow the file (shrinking frees space, so it
// never fails on a full disk). Reads are not touched.
//
// Nothing is cached per fd: every wrapped call with the trigger present
// looks the fd's path up again, so reused fds are never misjudged. The
// wrappers call only system-call wrappers that do not write (access,
// readlink, fstat) and no stdio or malloc, so they are safe to reach from
// a signal handler that writes to stderr and cannot recurse. Cost when the
// trigger is absent: one access(2) per write.
//
// The real functions come from dlsym(RTLD_NEXT, ...), resolved in a
// constructor and again lazily; should that ever fail (or be re-entered
// while resolving), the call goes straight to the kernel with syscall(2),
// so a write is never lost to the bootstrap.
// The wrappers define both the plain and the 64-bit names themselves.
#undef _FILE_OFFSET_BITS
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MESH_ENOSPC_VISIBLE __attribute__((visibility("default")))

static char g_dir[4096];
static size_t g_dir_len;
static char g_trigger[4096];
static int g_enabled;

// Copies `value` to `out` (capacity `cap`) without a trailing '/'; 0 when
// it is unset, empty, or does not fit.
static int CopyEnv(const char* value, char* out, size_t cap, size_t* len) {
  if (value == NULL || value[0] == '\0') return 0;
  size_t n = strlen(value);
  if (n >= cap) return 0;
  while (n > 1 && value[n - 1] == '/') --n;
  memcpy(out, value, n);
  out[n] = '\0';
  if (len != NULL) *len = n;
  return 1;
}

// Whether a write to `fd` should fail now: the trigger exists and fd's path
// is the directory or below it.
static int ShouldFail(int fd) {
  if (!g_enabled || fd < 0) return 0;
  const int saved = errno;
  int fail = 0;
  if (access(g_trigger, F_OK) == 0) {
    char link[64];
    char path[4096];
    // Build "/proc/self/fd/<fd>" by hand: no snprintf (stdio) here.
    static const char kPrefix[] = "/proc/self/fd/";
    memcpy(link, kPrefix, sizeof(kPrefix) - 1);
    char digits[16];
    int nd = 0;
    unsigned value = (unsigned)fd;
    do {
      digits[nd++] = (char)('0' + value % 10);
      value /= 10;
    } while (value != 0);
    size_t at = sizeof(kPrefix) - 1;
    while (nd > 0) link[at++] = digits[--nd];
    link[at] = '\0';
    const ssize_t n = readlink(link, path, sizeof(path) - 1);
    if (n > 0) {
      path[n] = '\0';
      fail = (size_t)n >= g_dir_len && memcmp(path, g_dir, g_dir_len) == 0 &&
             (path[g_dir_len] == '\0' || path[g_dir_len] == '/' || g_dir_len == 1);
    }
  }
  errno = saved;
  return fail;
}

// Whether ftruncate(fd, length) would grow the file.
static int Grows(int fd, off64_t length) {
  struct stat64 st;
  const int saved = errno;
  const int grows = fstat64(fd, &st) == 0 && length > st.st_size;
  errno = saved;
  return grows;
}

typedef ssize_t (*WriteFn)(int, const void*, size_t);
typedef ssize_t (*PwriteFn)(int, const void*, size_t, off_t);
typedef ssize_t (*Pwrite64Fn)(int, const void*, size_t, off64_t);
typedef ssize_t (*WritevFn)(int, const struct iovec*, int);
typedef ssize_t (*PwritevFn)(int, const struct iovec*, int, off_t);
typedef ssize_t (*Pwritev64Fn)(int, const struct iovec*, int, off64_t);
typedef ssize_t (*Pwritev2Fn)(int, const struct iovec*, int, off_t, int);
typedef ssize_t (*Pwritev64v2Fn)(int, const struct iovec*, int, off64_t, int);
typedef int (*FallocateFn)(int, int, off_t, off_t);
typedef int (*Fallocate64Fn)(int, int, off64_t, off64_t);
typedef int (*PosixFallocateFn)(int, off_t, off_t);
typedef int (*PosixFallocate64Fn)(int, off64_t, off64_t);
typedef int (*FtruncateFn)(int, off_t);
typedef int (*Ftruncate64Fn)(int, off64_t);

static WriteFn real_write;
static PwriteFn real_pwrite;
static Pwrite64Fn real_pwrite64;
static WritevFn real_writev;
static PwritevFn real_pwritev;
static Pwritev64Fn real_pwritev64;
static Pwritev2Fn real_pwritev2;
static Pwritev64v2Fn real_pwritev64v2;
static FallocateFn real_fallocate;
static Fallocate64Fn real_fallocate64;
static PosixFallocateFn real_posix_fallocate;
static PosixFallocate64Fn real_posix_fallocate64;
static FtruncateFn real_ftruncate;
static Ftruncate64Fn real_ftruncate64;

// Re-entry guard: dlsym may, in principle, write (it does not in glibc);
// while resolving, wrappers use syscall(2) instead of recursing.
static __thread int t_resolving;

#define RESOLVE(name)                                                              \
  do {                                                                             \
    if (__atomic_load_n(&real_##name, __ATOMIC_ACQUIRE) == NULL && !t_resolving) { \
      t_resolving = 1;                                                             \
      void* sym = dlsym(RTLD_NEXT, #name);                                         \
      t_resolving = 0;                                                             \
      __atomic_store_n((void**)&real_##name, sym, __ATOMIC_RELEASE);               \
    }                                                                              \
  } while (0)

__attribute__((constructor)) static void Init(void) {
  g_enabled = CopyEnv(getenv("MESH_TEST_ENOSPC_DIR"), g_dir, sizeof(g_dir), &g_dir_len) &&
              g_dir[0] == '/' &&
              CopyEnv(getenv("MESH_TEST_ENOSPC_TRIGGER"), g_trigger, sizeof(g_trigger), NULL);
  RESOLVE(write);
  RESOLVE(pwrite);
  RESOLVE(pwrite64);
  RESOLVE(writev);
  RESOLVE(pwritev);
  RESOLVE(pwritev64);
  RESOLVE(pwritev2);
  RESOLVE(pwritev64v2);
  RESOLVE(fallocate);
  RESOLVE(fallocate64);
  RESOLVE(posix_fallocate);
  RESOLVE(posix_fallocate64);
  RESOLVE(ftruncate);
  RESOLVE(ftruncate64);
}

MESH_ENOSPC_VISIBLE ssize_t write(int fd, const void* buf, size_t count) {
  if (ShouldFail(fd)) {
    errno = ENOSPC;
    return -1;
  }
  RESOLVE(write);
  if (real_write == NULL) return syscall(SYS_write, fd, buf, count);
  return real_write(fd, buf, count);
}

MESH_ENOSPC_VISIBLE ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  if (ShouldFail(fd)) {
    errno = ENOSPC;
    return -1;
  }
  RESOLVE(pwrite);
  if (real_pwrite == NULL) return syscall(SYS_pwrite64, fd, buf, count, offset);
  return real_pwrite(fd, buf, count, offset);
}

MESH_ENOSPC_VISIBLE ssize_t pwrite64(int fd, const void* buf, size_t count, off64_t offset) {
  if (ShouldFail(fd)) {
    errno = ENOSPC;
    return -1;
  }
  RESOLVE(pwrite64);
  if (real_pwrite64 == NULL) return syscall(SYS_pwrite64, fd, buf, count, offset);
  return real_pwrite64(fd, buf, count, offset);
}

MESH_ENOSPC_VISIBLE ssize_t writev(int fd, const struct iovec* iov, int iovcnt) {
  if (ShouldFail(fd)) {
    errno = ENOSPC;
    return -1;
  }
  RESOLVE(writev);
  if (real_writev == NULL) return syscall(SYS_writev, fd, iov, iovcnt);
  return real_writev(fd, iov, iovcnt);
}

// The vectored positional writes have no plain fallback (their syscall
// splits the offset by ABI); glibc always exports them, so dlsym finds them.
MESH_ENOSPC_VISIBLE ssize_t pwritev(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  if (ShouldFail(fd)) {
    errno = ENOSPC;
    return -1;
  }
  RESOLVE(pwritev);
  if (real_pwritev == NULL) {
    errno = ENOSYS;
    return -1;
  }
  return real_pwritev(fd, iov, iovcnt, offset);
}

MESH_ENOSPC_VISIBLE ssize_t pwritev64(int fd, const struct iovec* iov, int iovcnt, off64_t offset) {
  if (ShouldFail(fd)) {
    errno = ENOSPC;
    return -1;
  }
  RESOLVE(pwritev64);
  if (real_pwritev64 == NULL) {
    errno = ENOSYS;
    return -1;
  }
  return real_pwritev64(fd, iov, iovcnt, offset);
}

MESH_ENOSPC_VISIBLE ssize_t pwritev2(int fd, const struct iovec* iov, int iovcnt, off_t offset,
                                     int flags) {
  if (ShouldFail(fd)) {
    errno = ENOSPC;
    return -1;
  }
  RESOLVE(pwritev2);
  if (real_pwritev2 == NULL) {
    errno = ENOSYS;
    return -1;
  }
  return real_pwritev2(fd, iov, iovcnt, offset, flags);
}

MESH_ENOSPC_VISIBLE ssize_t pwritev64v2(int fd, const struct iovec* iov, int iovcnt, off64_t offset,
                                        int flags) {
  if (ShouldFail(fd)) {
    errno = ENOSPC;
    return -1;
  }
  RESOLVE(pwritev64v2);
  if (real_pwritev64v2 == NULL) {
    errno = ENOSYS;
    return -1;
  }
  return real_pwritev64v2(fd, iov, iovcnt, offset, flags);
}

MESH_ENOSPC_VISIBLE int fallocate(int fd, int mode, off_t offset, off_t len) {
  if (ShouldFail(fd)) {
    errno = ENOSPC;
    return -1;
  }
  RESOLVE(fallocate);
  if (real_fallocate == NULL) return (int)syscall(SYS_fallocate, fd, mode, offset, len);
  return real_fallocate(fd, mode, offset, len);
}

MESH_ENOSPC_VISIBLE int fallocate64(int fd, int mode, off64_t offset, off64_t len) {
  if (ShouldFail(fd)) {
    errno = ENOSPC;
    return -1;
  }
  RESOLVE(fallocate64);
  if (real_fallocate64 == NULL) return (int)syscall(SYS_fallocate, fd, mode, offset, len);
  return real_fallocate64(fd, mode, offset, len);
}

// posix_fallocate reports its error as the return value, not in errno.
MESH_ENOSPC_VISIBLE int posix_fallocate(int fd, off_t offset, off_t len) {
  if (ShouldFail(fd)) return ENOSPC;
  RESOLVE(posix_fallocate);
  if (real_posix_fallocate == NULL) return ENOSYS;
  return real_posix_fallocate(fd, offset, len);
}

MESH_ENOSPC_VISIBLE int posix_fallocate64(int fd, off64_t offset, off64_t len) {
  if (ShouldFail(fd)) return ENOSPC;
  RESOLVE(posix_fallocate64);
  if (real_posix_fallocate64 == NULL) return ENOSYS;
  return real_posix_fallocate64(fd, offset, len);
}

MESH_ENOSPC_VISIBLE int ftruncate(int fd, off_t length) {
  if (ShouldFail(fd) && Grows(fd, length)) {
    errno = ENOSPC;
    return -1;
  }
  RESOLVE(ftruncate);
  if (real_ftruncate == NULL) return (int)syscall(SYS_ftruncate, fd, length);
  return real_ftruncate(fd, length);
}

MESH_ENOSPC_VISIBLE int ftruncate64(int fd, off64_t length) {
  if (ShouldFail(fd) && Grows(fd, length)) {
    errno = ENOSPC;
    return -1;
  }
  RESOLVE(ftruncate64);
  if (real_ftruncate64 == NULL) return (int)syscall(SYS_ftruncate, fd, length);
  return real_ftruncate64(fd, length);
}
