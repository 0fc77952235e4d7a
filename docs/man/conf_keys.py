#!/usr/bin/env python3
"""Makes mesh.conf(5) from its header (argv[1]) and `meshd --dump-config` (stdin), so that the page
lists exactly the keys meshd knows, with meshd's own defaults, ranges and words."""
import sys


def esc(s):
    # scdoc formatting characters, taken literally here
    return s.replace("\\", "\\\\").replace("*", "\\*").replace("_", "\\_")


def main():
    out = [open(sys.argv[1]).read()]
    for line in sys.stdin:
        line = line.rstrip("\n")
        if not (line.startswith("cluster.") or line.startswith("nodes.")):
            continue
        words = line.split()
        key, typ = words[0], words[1]
        assert words[2] == "default" and words[4] == "range", line
        default, rng, rest = words[3], words[5], words[6:]
        if rest and rest[0] == "addresses":
            rng += " addresses"
            rest = rest[1:]
        help_text = " ".join(rest)
        out.append(f"*{esc(key)}* ({esc(typ)}, default {esc(default)}, range {esc(rng)})\n\t{esc(help_text)}\n\n")
    sys.stdout.write("".join(out) + "# SEE ALSO\n\nmeshd(8), meshctl(8), libmesh(3)\n")


if __name__ == "__main__":
    main()
