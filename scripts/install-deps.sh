#!/usr/bin/env bash
# Installs the Debian packages Mesh builds and tests with, and only the ones
# that are missing. Safe to run any number of times; downloads nothing except
# Debian packages through apt.
#
#   scripts/install-deps.sh            core build + test dependencies
#   scripts/install-deps.sh --bench    also the benchmark peers (OpenMPI, torch)
#   scripts/install-deps.sh --list     print the package list and exit
set -euo pipefail

core_packages=(
  # Toolchain and build.
  build-essential cmake ninja-build pkg-config
  # gRPC and Protocol Buffers.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # Abseil, metrics, CPU collectives, persistence.
  libabsl-dev prometheus-cpp-dev libgloo-dev libsqlite3-dev
  # Tests and benchmarks.
  libgtest-dev libgmock-dev libbenchmark-dev
  # Parsing and output.
  libyaml-cpp-dev libcli11-dev libspdlog-dev nlohmann-json3-dev
  # Tensor interchange.
  libdlpack-dev
  # Format and lint.
  clang-format clang-tidy
)
bench_packages=(openmpi-bin libopenmpi-dev python3-torch)

want=("${core_packages[@]}")
case "${1:-}" in
  "") ;;
  --bench) want+=("${bench_packages[@]}") ;;
  --list) printf '%s\n' "${core_packages[@]}"; exit 0 ;;
  -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
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

if ((${#missing[@]} == 0)); then
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

echo "install-deps.sh: installing ${#missing[@]} missing package(s): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# The package lists may be absent on a fresh machine; refresh them once.
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps.sh: done."
