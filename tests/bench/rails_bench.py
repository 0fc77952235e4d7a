#!/usr/bin/env python3
"""Two rails against one: the same two streams, carried by one device or by two at once.

Two meshd with one address per rail (nodes.addr, nodes.rails). In each round, interleaved:
  one     one stream (meshbench bw, 64 KiB messages) on rail 0;
  same    two streams at once, both on rail 0;
  split   two streams at once, one on rail 0 and one on rail 1.
Prints each round's MB/s (the streams' sum), the medians, and split/same: what carrying the two
streams on two devices buys over one, the devices' threads moving their data each under its own
lock (docs/design.md, "Locks: rails in parallel"). Both streams and the meshd share the machine's
CPUs: where those are the limit (rxe does the NIC's work on the CPU, tcp's loopback too), two rails
cannot go twice as fast, and the ratio says how much they do.

  rails_bench.py --build DIR [--transport tcp|rdma] [--rails "ADDR0 ADDR1"] [--rounds N] [--duration S]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from fixtures import Cluster, wait_until  # noqa: E402

PORT = 5700


def streams(bench, c, rails, duration):
    """Streams from node 1 to node 2 on the given rails at once; their MB/s summed."""
    srvs = [subprocess.Popen([bench, "-s", c.nodes[2]["sock"], "-1", "-l", str(PORT + k)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for k in range(len(rails))]
    try:
        time.sleep(0.3)
        cls = [subprocess.Popen([bench, "-s", c.nodes[1]["sock"], "-R", str(r), "-j", "-D", str(duration),
                                 "-m", "64K", "2", str(PORT + k)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for k, r in enumerate(rails)]
        total = 0.0
        for cl in cls:
            out, err = cl.communicate(timeout=duration * 10 + 60)
            if cl.returncode != 0:
                raise RuntimeError(f"meshbench on rails {rails}: exit {cl.returncode}: {err.strip()[-300:]}")
            total += json.loads(out.strip().splitlines()[-1])["mb_s"]
        return total
    finally:
        for p in srvs:
            p.kill()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--rails", default="127.0.0.1 127.0.1.1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3)
    ap.add_argument("--polling", default="adaptive")
    args = ap.parse_args()
    rails = args.rails.split()
    args.addrs, args.nodes, args.qps, args.ka_interval, args.ka_timeout = rails[0], 2, 2, 1000, 10000
    args.base_port = 7700
    args.cluster_extra = f'  polling = "{args.polling}";\n'
    args.node_extra = {i: "rails = [ " + ", ".join(f'"{a}"' for a in rails[1:]) + " ]; " for i in (1, 2)}
    bench = os.path.join(args.build, "meshlib", "meshbench")
    c = Cluster(args, tempfile.mkdtemp(prefix="rails-bench-"))
    res = {"one": [], "same": [], "split": []}
    try:
        for i in c.nodes:
            c.start(i)
        if not wait_until(lambda: all((c.ctl(i, "node") or {}).get("links_up") == 1 for i in c.nodes), 60):
            raise RuntimeError("the link did not come UP")
        for rnd in range(args.rounds):
            for name, rs in (("one", [0]), ("same", [0, 0]), ("split", [0, 1])):
                res[name].append(streams(bench, c, rs, args.duration))
            print(f"round {rnd + 1}: one stream {res['one'][-1]:.0f} MB/s, two on rail 0 {res['same'][-1]:.0f} MB/s, "
                  f"two on rails 0 and 1 {res['split'][-1]:.0f} MB/s", flush=True)
    finally:
        c.stop_all()
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"rails ({args.transport}, {args.polling} polling, medians of {args.rounds} rounds): one stream "
          f"{med['one']:.0f} MB/s; two streams on one rail {med['same']:.0f} MB/s; on two rails {med['split']:.0f} MB/s; "
          f"two rails / one rail: {med['split'] / med['same']:.2f}x (per round: "
          + ", ".join(f"{b / a:.2f}" for a, b in zip(res["same"], res["split"])) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
