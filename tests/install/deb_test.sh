#!/usr/bin/env bash
# The Debian packages (cmake/Packaging.cmake) on this machine, which CI starts as a clean Debian 12:
# build them (a Release build with prefix /usr, cpack -G DEB), check their dependencies, install them
# with dpkg, run the installed meshd --version and the two consumers (pkg-config and CMake, against a
# live mesh of the installed meshd: consumers.sh), purge them, and run lintian: no error allowed
# (its warnings are printed). The machine is left as found, also on failure or interruption (trap):
# the packages purged, the rdmamesh group removed if the test's install made it.
# Skipped (77, with the reason) when not root, without dpkg, or when a package of that name is
# already installed (it would be replaced and then purged).
#   tests/install/deb_test.sh SOURCE_DIR WORK_DIR
set -u
src=$(cd "$1" && pwd)
work=$2
here=$(cd "$(dirname "$0")" && pwd)
pkgs=(rdmamesh libmesh-dev libmesh0)

[ "$(id -u)" = 0 ] || { echo "skip: installing packages needs root"; exit 77; }
for t in dpkg dpkg-deb dpkg-shlibdeps cpack; do
	command -v "$t" >/dev/null || { echo "skip: $t is not installed (no dpkg tool chain here)"; exit 77; }
done
for p in "${pkgs[@]}"; do
	if dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^[a-z][a-zA-Z]'; then
		echo "skip: package $p is already on this machine; the test would replace and purge it"
		exit 77
	fi
done
had_group=0
getent group rdmamesh >/dev/null && had_group=1
fail=0
bad() { echo "FAIL $*"; fail=1; }
ok() { echo "ok   $*"; }
restore() {
	for p in "${pkgs[@]}"; do
		dpkg-query -W "$p" >/dev/null 2>&1 && dpkg --purge "$p" >/dev/null 2>&1
	done
	[ "$had_group" = 0 ] && getent group rdmamesh >/dev/null && groupdel rdmamesh
	rm -rf "$work"
}
trap restore EXIT
trap 'exit 130' INT TERM
rm -rf "$work"
mkdir -p "$work"

b=$work/build
if cmake -S "$src" -B "$b" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr -DMESH_PACKAGE_DEB=ON \
	-DMESH_TESTS=OFF >"$work/build.log" 2>&1 && cmake --build "$b" -j 2 >>"$work/build.log" 2>&1 &&
	(cd "$b" && cpack -G DEB) >>"$work/build.log" 2>&1; then
	ok "built $(cd "$b" && echo *.deb)"
else
	tail -30 "$work/build.log"; echo "FAIL building the packages"; exit 1
fi
deb() { echo "$b/$1_"*.deb; }
deps=$(dpkg-deb -f "$(deb rdmamesh)" Depends)
for d in 'libmesh0 (= ' libibverbs1 librdmacm1 libconfig9 libnuma1 libprotobuf-c1 libnettle8 libsystemd0 libmicrohttpd12 libc6; do
	[[ "$deps" == *"$d"* ]] || bad "rdmamesh's Depends lacks $d: $deps"
done
ok "rdmamesh Depends: $deps"
[[ "$(dpkg-deb -f "$(deb libmesh0)" Depends)" == *libprotobuf-c1* ]] && ok "libmesh0 Depends: $(dpkg-deb -f "$(deb libmesh0)" Depends)" ||
	bad "libmesh0's Depends lacks libprotobuf-c1"
[[ "$(dpkg-deb -f "$(deb libmesh-dev)" Depends)" == "libmesh0 (= "* ]] && ok "libmesh-dev Depends: $(dpkg-deb -f "$(deb libmesh-dev)" Depends)" ||
	bad "libmesh-dev does not depend on its libmesh0"

# dpkg, not apt: nothing else may come onto the machine (a missing dependency fails the install).
if dpkg -i "$(deb libmesh0)" "$(deb libmesh-dev)" "$(deb rdmamesh)" >"$work/dpkg.log" 2>&1; then
	ok "dpkg -i: $(dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}; ' "${pkgs[@]}")"
else
	cat "$work/dpkg.log"; bad "dpkg -i failed"
fi
v=$(/usr/bin/meshd --version 2>&1) && ok "/usr/bin/meshd --version: $v" || bad "/usr/bin/meshd --version: $v"
getent group rdmamesh >/dev/null && ok "postinst: group rdmamesh exists" || bad "no group rdmamesh after install"
grep -q '^ExecStart=/usr/bin/meshd ' /usr/lib/systemd/system/meshd@.service 2>/dev/null &&
	ok "/usr/lib/systemd/system/meshd@.service runs /usr/bin/meshd" || bad "the installed unit's ExecStart"
man -w meshd >/dev/null 2>&1 && man -w 3 libmesh >/dev/null 2>&1 && ok "man meshd, man 3 libmesh found" ||
	bad "the installed man pages are not found by man"
bash "$here/consumers.sh" /usr "$work/consumers" 17950 || fail=1

for p in "${pkgs[@]}"; do dpkg --purge "$p" >>"$work/dpkg.log" 2>&1 || bad "dpkg --purge $p"; done
left=$(dpkg-query -W "${pkgs[@]}" 2>/dev/null)
[ -z "$left" ] && [ ! -e /usr/bin/meshd ] && [ ! -e /usr/include/mesh/mesh.h ] && ok "purged: no package, no file left" ||
	bad "after purge: '$left'"

if command -v lintian >/dev/null; then
	lintian --tag-display-limit 0 "$b"/*.deb >"$work/lintian.log" 2>&1
	grep -v 'running with root privileges' "$work/lintian.log" | sed 's/^/     lintian: /'
	grep -q '^E:' "$work/lintian.log" && bad "lintian found errors" || ok "lintian: no error ($(grep -c '^W:' "$work/lintian.log") warnings)"
else
	bad "lintian is not installed (deploy/install-deps.sh installs it)"
fi
[ "$fail" = 0 ] && echo "deb: all checks passed" || echo "deb: FAILED"
exit $fail
