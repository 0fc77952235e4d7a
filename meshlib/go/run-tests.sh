#!/usr/bin/env bash
# The Go binding's tests against a build of this tree: `go vet`, then `go test -race` (which starts
# its own two-node tcp mesh from BUILD's meshd), or with --bench the Go benchmarks beside meshbench's
# figures (compare_test.go; ratios printed, never asserted).
#   meshlib/go/run-tests.sh [-b BUILD] [--bench] [-- GO_TEST_ARGS...]
# Exit 77 (skipped, with the reason) when go is missing or BUILD is a sanitizer build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$here/../../build
bench=0
while [ $# -gt 0 ]; do
	case $1 in
	-b) build=$2; shift 2 ;;
	--bench) bench=1; shift ;;
	--) shift; break ;;
	*) echo "usage: $0 [-b BUILD] [--bench] [-- GO_TEST_ARGS...]" >&2; exit 1 ;;
	esac
done
build=$(cd "$build" && pwd)

if ! command -v go >/dev/null; then
	echo "SKIPPED: go not found (Debian: apt-get install golang-go; deploy/install-deps.sh does)"
	exit 77
fi
# A Go program cannot load an ASan-instrumented libmesh (the ASan runtime must come first).
if grep -q '^MESH_SANITIZE:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
	echo "SKIPPED: $build is a sanitizer build; the Go tests run against the release build"
	exit 77
fi
for f in meshlib/mesh-uninstalled.pc meshlib/libmesh.so node/meshd node/meshctl meshlib/meshbench; do
	[ -e "$build/$f" ] || { echo "$build/$f is missing: build the tree first" >&2; exit 1; }
done

# libmesh from this build (pkg-config picks mesh-uninstalled.pc), found again at run time by rpath.
export PKG_CONFIG_PATH=$build/meshlib
export CGO_ENABLED=1 CGO_LDFLAGS="-Wl,-rpath,$build/meshlib"
# Offline and self-contained: the standard library only, caches in the build tree.
export GOPROXY=off GOFLAGS= GOTOOLCHAIN=local GO111MODULE=on GOTELEMETRY=off
export GOCACHE=$build/go/cache GOPATH=$build/go/path GOMODCACHE=$build/go/path/pkg/mod
export MESH_BUILD=$build
cd "$here"
go version
go vet ./...
if [ "$bench" = 1 ]; then
	MESH_GO_COMPARE=1 exec go test -count=1 -run '^TestCompareMeshbench$' -v -timeout 10m "$@" .
fi
exec go test -race -count=1 -timeout 8m "$@" ./...
