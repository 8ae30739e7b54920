#!/usr/bin/env bash
# `make package`'s Debian packages, made with CPack from the build's
# configuration into a temporary directory, unpacked with `dpkg -x` into a
# throwaway root and checked for what each must and must not hold; then
# `lintian` over them (when installed) must report no errors.
#
#   package_test.sh BUILD_DIR
#
# Exit status 77 (ctest: skipped) when dpkg-deb or cpack is missing.
set -euo pipefail

build=$(realpath "$1")
for tool in cpack dpkg-deb dpkg-shlibdeps; do
  command -v "$tool" >/dev/null || { echo "package_test: SKIPPED: no $tool" >&2; exit 77; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/mesh-package-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() {
  echo "package_test: FAILED: $*" >&2
  exit 1
}

echo "== cpack (DEB) into $work/packages"
cpack --config "$build/CPackConfig.cmake" -B "$work/packages" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log" >&2; fail "cpack failed"; }
mapfile -t debs < <(ls "$work/packages"/*.deb)
printf '  %s\n' "${debs[@]##*/}"

major=$(sed -n 's/^#define MESH_VERSION_MAJOR \([0-9]*\)$/\1/p' "$build/generated/mesh/config.h")
version=$(sed -n 's/^#define MESH_VERSION_STRING "\(.*\)"$/\1/p' "$build/generated/mesh/config.h")
deb_of() {
  local deb
  for deb in "${debs[@]}"; do
    [[ "$(dpkg-deb -f "$deb" Package)" == "$1" ]] && { echo "$deb"; return; }
  done
  fail "no package named $1"
}
# has PACKAGE PATH...: each path (relative to /, globs allowed) is in PACKAGE.
has() {
  local package=$1 path
  shift
  for path in "$@"; do
    compgen -G "$work/root/$package/$path" >/dev/null || fail "$package lacks /$path"
  done
}

multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
for package in mesh-coordinator mesh-agent meshctl "libmeshrt$major" libmesh-dev python3-meshrt; do
  deb=$(deb_of "$package")
  [[ "$(dpkg-deb -f "$deb" Version)" == "$version" ]] || fail "$package's version is not $version"
  mkdir -p "$work/root/$package"
  dpkg -x "$deb" "$work/root/$package"
  has "$package" "usr/share/doc/$package/copyright" "usr/share/doc/$package/changelog.Debian.gz"
  # Debian's finite-element library owns libmesh.so.
  [[ -z "$(find "$work/root/$package" -name 'libmesh.so*')" ]] || fail "$package installs libmesh.so"
done

has mesh-coordinator usr/bin/mesh-coordinator "usr/lib/systemd/system/mesh-coordinator.service" \
  usr/share/mesh-coordinator/prometheus/alerts.yml
has mesh-agent usr/bin/mesh-agent "usr/lib/systemd/system/mesh-agent.service"
has meshctl usr/bin/meshctl
has "libmeshrt$major" "usr/lib/$multiarch/libmeshrt.so.$major" "usr/lib/$multiarch/libmeshrt.so.$version"
has libmesh-dev "usr/lib/$multiarch/libmeshrt.so" "usr/lib/$multiarch/libmeshrt.a" \
  usr/include/mesh/mesh.h usr/include/mesh/config.h "usr/lib/$multiarch/cmake/Mesh/MeshConfig.cmake" \
  "usr/lib/$multiarch/pkgconfig/meshrt.pc"
has python3-meshrt usr/lib/python3/dist-packages/meshrt/__init__.py \
  "usr/lib/python3/dist-packages/meshrt/_meshrt*.so" usr/lib/python3/dist-packages/meshrt/torch.py \
  usr/lib/python3/dist-packages/meshrt/py.typed
[[ -z "$(find "$work/root/libmeshrt$major" -name 'libmeshrt.so')" ]] ||
  fail "libmeshrt$major holds the link-time name libmeshrt.so (libmesh-dev's)"
for package in mesh-coordinator mesh-agent meshctl libmesh-dev; do
  [[ -z "$(find "$work/root/$package" -name 'libmeshrt.so.*')" ]] ||
    fail "$package holds the shared library (libmeshrt$major's)"
done

# Units start the packaged binaries; daemons come stripped; the dev package
# pins the runtime of its version; the daemons' packages create their users.
grep -q '^ExecStart=/usr/bin/mesh-coordinator' \
  "$work/root/mesh-coordinator/usr/lib/systemd/system/mesh-coordinator.service" ||
  fail "mesh-coordinator.service does not start /usr/bin/mesh-coordinator"
for bin in mesh-coordinator/usr/bin/mesh-coordinator mesh-agent/usr/bin/mesh-agent meshctl/usr/bin/meshctl; do
  readelf -S "$work/root/$bin" | grep -q '\.symtab' && fail "${bin##*/} is not stripped"
done
dpkg-deb -f "$(deb_of libmesh-dev)" Depends | grep -q "libmeshrt$major (= $version)" ||
  fail "libmesh-dev does not depend on libmeshrt$major (= $version)"
for package in mesh-coordinator mesh-agent; do
  dpkg-deb -e "$(deb_of "$package")" "$work/control-$package"
  grep -q "useradd --system --gid mesh" "$work/control-$package/postinst" &&
    grep -q "nologin $package$" "$work/control-$package/postinst" ||
    fail "$package's postinst does not create the $package system user"
  dpkg-deb -f "$(deb_of "$package")" Depends | grep -q 'libgrpc++' ||
    fail "$package's Depends lack the gRPC library (dpkg-shlibdeps)"
done
"$work/root/meshctl/usr/bin/meshctl" --version >/dev/null || fail "the packaged meshctl does not run"
# The packaged Python package imports with Debian's interpreter.
if [[ -x /usr/bin/python3 ]]; then
  PYTHONPATH="$work/root/python3-meshrt/usr/lib/python3/dist-packages" /usr/bin/python3 -c \
    'import meshrt; meshrt.Shard(0)' || fail "the packaged meshrt does not import"
fi

if command -v lintian >/dev/null; then
  echo "== lintian"
  lintian --fail-on error --suppress-tags-from-file /dev/null "${debs[@]}" | tee "$work/lintian.log" ||
    fail "lintian reports errors (above)"
else
  echo "package_test: lintian is not installed (scripts/install-deps.sh installs it); not run" >&2
fi
echo "package_test: OK"
