#include "agent/cgroup_bpf.h"

#include <fcntl.h>
#include <linux/bpf.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/errno_text.h"

namespace mesh::agent {
namespace {

bpf_insn Insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
  bpf_insn insn;
  std::memset(&insn, 0, sizeof(insn));
  insn.code = code;
  insn.dst_reg = dst & 0xf;
  insn.src_reg = src & 0xf;
  insn.off = off;
  insn.imm = imm;
  return insn;
}

// r0 = verdict; exit.
void Return(std::vector<bpf_insn>& program, int verdict) {
  program.push_back(Insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, verdict));
  program.push_back(Insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0));
}

// The program: the device's type, major and minor from bpf_cgroup_dev_ctx
// {u32 access_type (type in the low 16 bits); u32 major; u32 minor}; for a
// character device, each deny entry is "major != M -> next; minor != m ->
// next; deny"; everything that falls through is allowed.
// `deny` must not be empty: the verifier refuses the unreachable deny exit.
std::vector<bpf_insn> Assemble(const std::vector<CharDevice>& deny) {
  std::vector<bpf_insn> program;
  program.push_back(Insn(BPF_LDX | BPF_W | BPF_MEM, BPF_REG_2, BPF_REG_1, 0, 0));
  program.push_back(Insn(BPF_ALU | BPF_AND | BPF_K, BPF_REG_2, 0, 0, 0xffff));
  program.push_back(Insn(BPF_LDX | BPF_W | BPF_MEM, BPF_REG_3, BPF_REG_1, 4, 0));
  program.push_back(Insn(BPF_LDX | BPF_W | BPF_MEM, BPF_REG_4, BPF_REG_1, 8, 0));
  const size_t type_check = program.size();
  program.push_back(Insn(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_2, 0, 0, BPF_DEVCG_DEV_CHAR));
  std::vector<size_t> to_deny;
  for (const CharDevice& device : deny) {
    if (device.minor < 0) {
      program.push_back(
          Insn(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_3, 0, 1, static_cast<int32_t>(device.major)));
    } else {
      program.push_back(
          Insn(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_3, 0, 2, static_cast<int32_t>(device.major)));
      program.push_back(
          Insn(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_4, 0, 1, static_cast<int32_t>(device.minor)));
    }
    to_deny.push_back(program.size());
    program.push_back(Insn(BPF_JMP | BPF_JA, 0, 0, 0, 0));
  }
  const size_t allow = program.size();
  Return(program, 1);
  const size_t deny_at = program.size();
  Return(program, 0);
  program[type_check].off = static_cast<int16_t>(allow - type_check - 1);
  for (size_t at : to_deny) program[at].off = static_cast<int16_t>(deny_at - at - 1);
  return program;
}

absl::StatusOr<int> Load(const std::vector<bpf_insn>& program) {
  static char license[] = "GPL";
  char log[4096] = {};
  bpf_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.prog_type = BPF_PROG_TYPE_CGROUP_DEVICE;
  attr.insns = reinterpret_cast<uint64_t>(program.data());
  attr.insn_cnt = static_cast<uint32_t>(program.size());
  attr.license = reinterpret_cast<uint64_t>(license);
  attr.log_buf = reinterpret_cast<uint64_t>(log);
  attr.log_size = sizeof(log);
  attr.log_level = 1;
  const int fd = static_cast<int>(syscall(SYS_bpf, BPF_PROG_LOAD, &attr, sizeof(attr)));
  if (fd < 0) {
    const int err = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        "loading the eBPF device program: ", ErrnoText(err), log[0] != '\0' ? ": " : "", log));
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceProgram>> DeviceProgram::Attach(
    const std::string& cgroup_dir, const std::vector<CharDevice>& deny) {
  absl::StatusOr<int> fd = Load(Assemble(deny));
  if (!fd.ok()) return fd.status();
  const int dir = open(cgroup_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    const int err = errno;
    close(*fd);
    return absl::FailedPreconditionError(
        absl::StrCat("opening ", cgroup_dir, ": ", ErrnoText(err)));
  }
  bpf_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.target_fd = static_cast<uint32_t>(dir);
  attr.attach_bpf_fd = static_cast<uint32_t>(*fd);
  attr.attach_type = BPF_CGROUP_DEVICE;
  attr.attach_flags = BPF_F_ALLOW_MULTI;
  const int rc = static_cast<int>(syscall(SYS_bpf, BPF_PROG_ATTACH, &attr, sizeof(attr)));
  const int err = errno;
  close(dir);
  if (rc != 0) {
    close(*fd);
    return absl::FailedPreconditionError(
        absl::StrCat("attaching the eBPF device program to ", cgroup_dir, ": ", ErrnoText(err)));
  }
  return std::unique_ptr<DeviceProgram>(new DeviceProgram(*fd));
}

bool DeviceProgram::Supported(const std::string& scratch_cgroup, std::string* why) {
  // One rule (0:0, no device), so that the deny branch is reachable (the
  // verifier refuses dead code). Attached to a scratch cgroup that is
  // removed after, which detaches it: loading alone does not prove that
  // this process may attach (kernels before 5.8 want CAP_NET_ADMIN).
  if (mkdir(scratch_cgroup.c_str(), 0755) != 0 && errno != EEXIST) {
    *why = absl::StrCat("creating ", scratch_cgroup, ": ", ErrnoText(errno));
    return false;
  }
  bool ok = false;
  {
    absl::StatusOr<std::unique_ptr<DeviceProgram>> attached =
        Attach(scratch_cgroup, {CharDevice{0, 0}});
    ok = attached.ok();
    if (!ok) *why = std::string(attached.status().message());
  }  // The program's fd closes here; the removal below detaches it.
  rmdir(scratch_cgroup.c_str());
  return ok;
}

DeviceProgram::~DeviceProgram() { close(fd_); }

}  // namespace mesh::agent
