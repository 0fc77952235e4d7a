#!/usr/bin/env bash
# `cmake --install` into a scratch prefix: every file the README's "Install" section promises is
# there (programs, libmesh with its soname and no RPATH, header, mesh.pc, the CMake package, the unit
# with the configured meshd path, the sysusers.d entry, the example config, the man pages), then two
# consumers built against the prefix run against its live meshd (consumers.sh).
#   tests/install/install_test.sh BUILD_DIR
set -u
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/mesh-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail=0
bad() { echo "FAIL $*"; fail=1; }
ok() { echo "ok   $*"; }

cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
	{ cat "$work/install.log"; echo "FAIL cmake --install $build --prefix $prefix"; exit 1; }
ok "cmake --install --prefix $prefix"
cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
libdir=$prefix/$(cache CMAKE_INSTALL_LIBDIR)
version=$(cache CMAKE_PROJECT_VERSION)

for f in bin/meshd bin/meshctl bin/meshcat bin/meshecho bin/meshbench; do
	[ -x "$prefix/$f" ] && ok "$f" || bad "$f missing"
done
for f in "$libdir/libmesh.so.$version" "$prefix/include/mesh/mesh.h" "$libdir/pkgconfig/mesh.pc" \
	"$libdir/cmake/rdmamesh/rdmamesh-config.cmake" "$libdir/cmake/rdmamesh/rdmamesh-config-version.cmake" \
	"$libdir/cmake/rdmamesh/rdmamesh-targets.cmake" "$prefix/lib/sysusers.d/rdmamesh.conf" \
	"$prefix/share/doc/rdmamesh/examples/mesh.conf"; do
	[ -f "$f" ] && ok "${f#"$prefix"/}" || bad "${f#"$prefix"/} missing"
done
soname=$(readelf -d "$libdir/libmesh.so.$version" 2>/dev/null | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = libmesh.so.0 ] && ok "soname libmesh.so.0" || bad "soname '$soname', expected libmesh.so.0"
[ "$(readlink "$libdir/libmesh.so.0")" = libmesh.so.$version ] && [ "$(readlink "$libdir/libmesh.so")" = libmesh.so.0 ] &&
	ok "libmesh.so -> libmesh.so.0 -> libmesh.so.$version" || bad "libmesh.so links wrong"
rpath=()
for f in "$prefix"/bin/* "$libdir/libmesh.so.$version"; do
	readelf -d "$f" | grep -qE 'RPATH|RUNPATH' && rpath+=("${f#"$prefix"/}")
done
[ ${#rpath[@]} -eq 0 ] && ok "no RPATH in the installed programs and library" || bad "RPATH in ${rpath[*]}"
grep -qx 'g rdmamesh -' "$prefix/lib/sysusers.d/rdmamesh.conf" && ok "sysusers.d: group rdmamesh" ||
	bad "sysusers.d entry lacks 'g rdmamesh -'"
unit=$prefix/lib/systemd/system/meshd@.service
want="ExecStart=$(cache CMAKE_INSTALL_PREFIX)/$(cache CMAKE_INSTALL_BINDIR)/meshd "
grep -q "^$want" "$unit" 2>/dev/null && ok "meshd@.service: ${want% }" ||
	bad "meshd@.service: no line '$want...' ($(grep ExecStart= "$unit" 2>&1))"
if [ -f "$build/docs/man/meshd.8" ]; then
	for p in man8/meshd.8 man8/meshctl.8 man5/mesh.conf.5 man3/libmesh.3 man1/meshcat.1 man1/meshecho.1 man1/meshbench.1; do
		gzip -t "$prefix/share/man/$p.gz" 2>/dev/null && ok "share/man/$p.gz" || bad "share/man/$p.gz missing or bad"
	done
else
	echo "skip the man pages: not built (no scdoc)"
fi
v=$(LD_LIBRARY_PATH=$libdir "$prefix/bin/meshd" --version) && ok "installed meshd --version: $v" || bad "meshd --version"

bash "$here/consumers.sh" "$prefix" "$work/consumers" 17940 || fail=1
[ "$fail" = 0 ] && echo "install: all checks passed" || echo "install: FAILED"
exit $fail
