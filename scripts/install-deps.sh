#!/usr/bin/env bash
# Installs the Debian packages Mesh builds and tests with, and only the ones
# that are missing. Safe to run any number of times; downloads nothing except
# Debian packages through apt.
#
#   scripts/install-deps.sh            core build + test dependencies
#   scripts/install-deps.sh --bench    also the benchmark peers (OpenMPI, torch)
#   scripts/install-deps.sh --packaging  also lintian, for make package
#   scripts/install-deps.sh --list     print the package list and exit
#
# Debian's `prometheus` (the server and promtool, for tests/metrics) and
# `etcd-server` (for the etcd store's tests, which start their own members)
# are installed with their services held down: they must never start or bind
# a port on a build machine. They are optional: when the archive lacks one or
# it fails to install, this script warns and goes on, and the tests that
# need it skip saying so.
set -euo pipefail

core_packages=(
  # Toolchain and build.
  build-essential cmake ninja-build pkg-config
  # gRPC and Protocol Buffers.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # Abseil, metrics, CPU collectives, persistence.
  libabsl-dev prometheus-cpp-dev libgloo-dev libsqlite3-dev
  # Security: libcrypto for token hashes, the openssl CLI for test certificates.
  libssl-dev openssl
  # Tests and benchmarks.
  libgtest-dev libgmock-dev libbenchmark-dev
  # Parsing and output.
  libyaml-cpp-dev libcli11-dev libspdlog-dev nlohmann-json3-dev
  # Tensor interchange.
  libdlpack-dev
  # The etcd store backend: etcdctl (and the server, below, for the tests).
  # etcd's .proto files come from golang-etcd-server-dev, extracted below.
  etcd-client
  # The Python package (python/): pybind11 and the headers, torch for its tests.
  pybind11-dev python3-dev python3-torch
  # systemd readiness and watchdog (sd_notify).
  libsystemd-dev
  # make gpu-bundle: RUNPATHs of the bundled binaries and libraries.
  patchelf
  # Deployment file checks (scripts/check_deploy.py).
  python3-yaml
  # Format and lint.
  clang-format clang-tidy
  # Fuzzing (make fuzz): clang with libFuzzer and the sanitizer runtimes;
  # libclang-rt-14-dev also gives tests/fuzz FuzzedDataProvider.h, which the
  # corpus tests of `make test` include under gcc too.
  clang libclang-rt-14-dev
)
# Installed like the core packages, but with services forbidden to start, and
# a failure only warns.
service_packages=(prometheus etcd-server)
# With --packaging (make package): lintian, which checks the packages.
# Installed when the archive has it; a failure only warns, and the package
# test (tests/install) says so and checks the rest.
optional_packages=()
packaging_packages=(lintian)
bench_packages=(openmpi-bin libopenmpi-dev python3-torch)

want=("${core_packages[@]}" "${service_packages[@]}")
case "${1:-}" in
  "") ;;
  --bench) want+=("${bench_packages[@]}") ;;
  --packaging)
    optional_packages+=("${packaging_packages[@]}")
    want+=("${packaging_packages[@]}")
    ;;
  --list) printf '%s\n' "${core_packages[@]}" "${service_packages[@]}"; exit 0 ;;
  -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
  *) echo "install-deps.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac

if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-deps.sh: this machine has no apt-get/dpkg." >&2
  echo "Mesh's dependencies come from Debian packages; install these by other means:" >&2
  printf '  %s\n' "${want[@]}" >&2
  exit 1
fi

missing=()
for pkg in "${want[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
  [[ "$status" == ii* ]] || missing+=("$pkg")
done

# etcd's .proto files, from which the build makes its etcd client stubs
# (protos/CMakeLists.txt), as Debian ships them in golang-etcd-server-dev.
# That package depends on the Go sources of all of etcd's libraries (135
# packages, 141 MB to download), none of which the build reads, so only its
# .proto files are taken: the package is downloaded and they are extracted
# under $etcd_protos. An installed package serves as well.
etcd_protos=/usr/local/share/mesh/etcd-protos
etcd_rpc_proto=go.etcd.io/etcd/etcdserver/etcdserverpb/rpc.proto
need_etcd_protos=false
if [[ ! -f /usr/share/gocode/src/$etcd_rpc_proto && ! -f $etcd_protos/$etcd_rpc_proto ]]; then
  need_etcd_protos=true
fi

if ((${#missing[@]} == 0)) && ! "$need_etcd_protos"; then
  echo "install-deps.sh: all ${#want[@]} packages already installed."
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "install-deps.sh: not root and sudo is not available; run as root to install:" >&2
    printf '  %s\n' "${missing[@]}" >&2
    exit 1
  fi
  sudo=(sudo)
fi

plain=()
held=()
optional=()
for pkg in "${missing[@]}"; do
  if [[ " ${service_packages[*]} " == *" $pkg "* ]]; then
    held+=("$pkg")
  elif [[ " ${optional_packages[*]} " == *" $pkg "* ]]; then
    optional+=("$pkg")
  else
    plain+=("$pkg")
  fi
done

echo "install-deps.sh: installing ${#missing[@]} missing package(s): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# The package lists may be absent on a fresh machine; refresh them once.
"${sudo[@]}" apt-get update -qq
if "$need_etcd_protos"; then
  echo "install-deps.sh: extracting etcd's .proto files from golang-etcd-server-dev into $etcd_protos"
  deb_dir=$(mktemp -d)
  # As root, apt hands downloads to its _apt user, which cannot write here.
  sandbox=()
  [[ $(id -u) -ne 0 ]] || sandbox=(-o APT::Sandbox::User=root)
  (cd "$deb_dir" && apt-get download -qq "${sandbox[@]}" golang-etcd-server-dev)
  "${sudo[@]}" mkdir -p "$etcd_protos"
  dpkg-deb --fsys-tarfile "$deb_dir"/golang-etcd-server-dev_*.deb |
    "${sudo[@]}" tar -x -C "$etcd_protos" --strip-components=5 --wildcards \
      './usr/share/gocode/src/*.proto'
  rm -rf "$deb_dir"
  [[ -f $etcd_protos/$etcd_rpc_proto ]] || {
    echo "install-deps.sh: golang-etcd-server-dev holds no $etcd_rpc_proto" >&2
    exit 1
  }
fi
if ((${#plain[@]} > 0)); then
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${plain[@]}"
fi
if ((${#optional[@]} > 0)); then
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${optional[@]}" ||
    echo "install-deps.sh: WARNING: could not install ${optional[*]}; the tests that use them say so and go on." >&2
fi

# policy-rc.d exiting 101 ("action forbidden") makes invoke-rc.d and
# deb-systemd-invoke skip every start a maintainer script asks for, under
# systemd, sysvinit or no init at all. A policy already in place (Docker
# images ship one) is put back exactly as it was, whatever happens.
policy=/usr/sbin/policy-rc.d
policy_backup=""
policy_ours=false
restore_policy() {
  "$policy_ours" || return 0
  policy_ours=false
  if [[ -n "$policy_backup" ]]; then
    "${sudo[@]}" mv -f "$policy_backup" "$policy"
  else
    "${sudo[@]}" rm -f "$policy"
  fi
}
warn_held() {
  echo "install-deps.sh: WARNING: could not install ${held[*]}; the tests that need" >&2
  echo "install-deps.sh: WARNING: promtool or a Prometheus server will SKIP (tests/metrics)." >&2
}
if ((${#held[@]} > 0)); then
  available=()
  for pkg in "${held[@]}"; do
    # A candidate version of "(none)" means the archive does not carry it.
    # (Read whole: grep -q in a pipeline trips pipefail with SIGPIPE.)
    candidate=$(apt-cache policy "$pkg" 2>/dev/null || true)
    if [[ "$candidate" == *"Candidate: "[0-9]* ]]; then
      available+=("$pkg")
    else
      echo "install-deps.sh: WARNING: the package archive has no '$pkg'." >&2
    fi
  done
  if ((${#available[@]} > 0)); then
    if [[ -e "$policy" ]]; then
      policy_backup=$("${sudo[@]}" mktemp /usr/sbin/policy-rc.d.install-deps.XXXXXX)
      "${sudo[@]}" cp -p "$policy" "$policy_backup"
    fi
    policy_ours=true
    trap restore_policy EXIT
    trap 'restore_policy; exit 130' INT TERM
    printf '#!/bin/sh\n# scripts/install-deps.sh: no service starts while it installs.\nexit 101\n' |
      "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 755 "$policy"
    if "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${available[@]}"; then
      # The package enables its unit for the next boot; a build machine
      # should not grow a Prometheus or etcd server on reboot either. The
      # unit is named after the package, less "-server" (etcd.service).
      if command -v systemctl >/dev/null 2>&1; then
        for pkg in "${available[@]}"; do
          "${sudo[@]}" systemctl disable --quiet "${pkg%-server}.service" >/dev/null 2>&1 || true
        done
      fi
    else
      warn_held
    fi
    restore_policy
    trap - EXIT INT TERM
  fi
  ((${#available[@]} == ${#held[@]})) || warn_held
fi
echo "install-deps.sh: done."
