#!/usr/bin/env bash
# The man pages (docs/man): each renders without a warning (man --warnings), each program's page
# names every option its --help names, mesh.conf(5) every key of `meshd --dump-config`, libmesh(3)
# every function of mesh.h. Skipped (77, with the reason) where scdoc or man is missing.
#   tests/integration/man_test.sh BUILD_DIR SOURCE_DIR
set -u
build=$1
src=$2
pages=$build/docs/man
for tool in scdoc man; do
	command -v "$tool" >/dev/null || { echo "skip: $tool is not installed (deploy/install-deps.sh installs it)"; exit 77; }
done
fail=0
bad() { echo "FAIL $*"; fail=1; }
ok() { echo "ok   $*"; }

for page in meshd.8 meshd-keeper.8 meshctl.8 mesh.conf.5 libmesh.3 meshcat.1 meshecho.1 meshbench.1; do
	if [ ! -s "$pages/$page" ]; then
		bad "$page was not built"
		continue
	fi
	warn=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$pages/$page" 2>&1 >/dev/null)
	[ -z "$warn" ] && ok "$page renders without a warning" || bad "$page: man --warnings: $warn"
done

# Every option of --help, long and short, in the page's source.
check_opts() {
	local bin=$1 page=$2 missing=()
	local help
	help=$("$bin" --help)
	for opt in $(grep -oE -- '--[a-z][a-z-]+' <<<"$help" | sort -u); do
		grep -qF -- "*$opt*" "$src/docs/man/$page.scd" || missing+=("$opt")
	done
	for opt in $(grep -oE '^ +-[A-Za-z0-9],' <<<"$help" | tr -d ' ,' | sort -u); do
		grep -qF -- "*$opt*" "$src/docs/man/$page.scd" || missing+=("$opt")
	done
	[ ${#missing[@]} -eq 0 ] && ok "$page names every option of $(basename "$bin") --help" ||
		bad "$page lacks ${missing[*]}"
}
check_opts "$build/node/meshd" meshd.8
check_opts "$build/node/meshctl" meshctl.8
check_opts "$build/node/meshd-keeper" meshd-keeper.8
check_opts "$build/meshlib/meshcat" meshcat.1
check_opts "$build/meshlib/meshecho" meshecho.1
check_opts "$build/meshlib/meshbench" meshbench.1

# Every key meshd knows, in mesh.conf(5) (its source without scdoc's escapes).
missing=()
conf=$(sed 's/\\//g' "$pages/mesh.conf.5.scd" 2>/dev/null)
for key in $("$build/node/meshd" --dump-config | grep -oE '^(cluster|nodes)\.[a-z_]+'); do
	grep -qF -- "*$key*" <<<"$conf" || missing+=("$key")
done
[ ${#missing[@]} -eq 0 ] && ok "mesh.conf.5 documents every key of meshd --dump-config" ||
	bad "mesh.conf.5 lacks ${missing[*]}"

# conf/README.md's table gives every integer key the range meshd enforces (it said 512.. for
# mailbox_size where meshd takes 520..).
dump_ranges=$("$build/node/meshd" --dump-config | awk '$1 ~ /^cluster\./ && $2 == "integer" {print $1, $6}' | sort)
readme_ranges=$(grep -oE '^\| `cluster\.[a-z_]+` \| integer \| [^|]+\| [^|]+\|' "$src/conf/README.md" |
	awk -F'|' '{gsub(/[ `]/, "", $2); gsub(/ /, "", $5); print $2, $5}' | sort)
if [ -n "$dump_ranges" ] && [ "$dump_ranges" = "$readme_ranges" ]; then
	ok "conf/README.md gives every integer key meshd's range"
else
	bad "conf/README.md and meshd --dump-config disagree on ranges: $(diff <(echo "$dump_ranges") <(echo "$readme_ranges") | grep '^[<>]' | tr '\n' ' ')"
fi

# Every function of mesh.h in libmesh(3).
missing=()
for fn in $(grep -oE 'MESH_EXPORT [^(]*\b(mesh_[a-z_]+)\(' "$src/meshlib/include/mesh/mesh.h" | grep -oE 'mesh_[a-z_]+\($' | tr -d '('); do
	grep -qF -- "$fn(" "$src/docs/man/libmesh.3.scd" || missing+=("$fn")
done
[ ${#missing[@]} -eq 0 ] && ok "libmesh.3 documents every function of mesh.h" || bad "libmesh.3 lacks ${missing[*]}"
exit $fail
