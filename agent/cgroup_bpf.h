// Device rules on cgroup v2: an eBPF program of type
// BPF_PROG_TYPE_CGROUP_DEVICE attached to a cgroup, which the kernel runs on
// every open (and mknod) of a device node by a process of that cgroup or
// below. The program is assembled here from the deny list (no libbpf): it
// answers 0 (EPERM) for a character device in the list and 1 otherwise.
//
// Errors: FAILED_PRECONDITION when the kernel refuses to load or attach it
// (no BPF, not privileged), with the errno and the verifier's log.
// Thread safety: a DeviceProgram is immutable; Supported is thread-safe.
// Ownership: the attachment lives as long as the cgroup (the kernel holds
// the program while it is attached); the object only keeps its fd.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/cgroup.h"

namespace mesh::agent {

class DeviceProgram {
 public:
  // Loads a program denying `deny` and attaches it (BPF_F_ALLOW_MULTI) to
  // the cgroup directory `cgroup_dir`.
  static absl::StatusOr<std::unique_ptr<DeviceProgram>> Attach(const std::string& cgroup_dir,
                                                               const std::vector<CharDevice>& deny);
  // Whether this process may load and attach device programs: tried on the
  // cgroup directory `scratch_cgroup` (made, then removed); `why` says why
  // not.
  static bool Supported(const std::string& scratch_cgroup, std::string* why);

  ~DeviceProgram();
  DeviceProgram(const DeviceProgram&) = delete;
  DeviceProgram& operator=(const DeviceProgram&) = delete;

 private:
  explicit DeviceProgram(int fd) : fd_(fd) {}
  const int fd_;
};

}  // namespace mesh::agent
