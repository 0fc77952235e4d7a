#!/usr/bin/env python3
"""Channels to the local node: mesh_connect to this node's own id.

Node 1's meshd runs alone (node 2 is configured and never started: its link stays DOWN), so every
byte below moves ring to ring inside node 1's meshd, through no link.
  1. Three verified streams at once to a local listener (chan_test: every byte checked, the length
     at EOF): 64 MiB over 2 QPs, 16 MiB zero-copy, 4 MiB through a 64 KiB ring (credits).
  2. While a paced stream runs: meshctl channels shows both ends (opener and acceptor, peer node 1,
     OPEN, no device) with their bytes; meshctl links still has one row, node 2's, DOWN.
  3. A port nobody listens on: the connect is refused (ECONNREFUSED), as to a peer.
  4. The receiving application killed (SIGKILL) mid-stream: the sender fails with an error instead
     of waiting, and no channel is left.
  5. SIGTERM: meshd exits 0 (under the sanitizer build: nothing leaked).
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402
from fixtures import check, wait_until  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--addr", default="127.0.0.1")
    ap.add_argument("--base-port", type=int, default=17970)
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    a.nodes, a.addrs, a.qps, a.ka_interval, a.ka_timeout = 2, a.addr, 2, 300, 3000
    work = tempfile.mkdtemp(prefix="mesh-local-")
    c = fixtures.Cluster(a, work)
    chan = os.path.join(a.build, "tests", "integration", "chan_test")
    sock = c.nodes[1]["sock"]

    def run_chan(*args):
        return subprocess.Popen([chan, "-s", sock, *map(str, args)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def receiver(port, count):
        r = run_chan("recv", port, count)
        line = r.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"chan_test recv on port {port}: {line.strip()}")
        return r

    def finish(p, timeout):
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            return None, out
        return p.returncode, out

    def channels(port=None):
        j = c.ctl(1, "channels") or {}
        return [ch for ch in j.get("channels", []) if port is None or port in (ch["local_port"], ch["peer_port"])]

    try:
        c.start(1)
        check(wait_until(lambda: os.path.exists(sock) and c.ctl(1, "node") is not None, 10),
              "node 1's meshd answers (node 2 never runs)")

        # 1. three verified streams at once
        rx = receiver(7000, 3)
        senders = [run_chan("send", 1, 7000, 64 << 20, "-q", 2),
                   run_chan("send", 1, 7000, 16 << 20, "-z"),
                   run_chan("send", 1, 7000, 4 << 20, "-r", 65536)]
        res = [finish(s, 120) for s in senders]
        rc_rx, out_rx = finish(rx, 60)
        check(all(r[0] == 0 for r in res) and rc_rx == 0 and out_rx.count("ok") == 3,
              "3 streams to the local node at once (64 MiB over 2 QPs, 16 MiB zero-copy, 4 MiB through a "
              "64 KiB ring): every byte checked, complete at EOF",
              f"senders {[r[0] for r in res]} {[r[1].strip()[-200:] for r in res]}; receiver {rc_rx} {out_rx[-400:]}")

        # 2. meshctl rows while a paced stream runs
        rx = receiver(7001, 1)
        tx = run_chan("send", 1, 7001, 6 << 20, "-R", 2 << 20)
        both = wait_until(lambda: len(channels(7001)) == 2 and all(ch["tx_bytes"] or ch["rx_bytes"]
                                                                   for ch in channels(7001)), 10)
        rows = channels(7001)
        op = [ch for ch in rows if ch["opener"]]
        ac = [ch for ch in rows if not ch["opener"]]
        check(both and len(op) == 1 and len(ac) == 1
              and all(ch["peer_node"] == 1 and ch["local_node"] == 1 and ch["state"] == "OPEN"
                      and ch.get("device", "") == "" for ch in rows)
              and op[0]["peer_port"] == 7001 and ac[0]["local_port"] == 7001
              and op[0]["local_port"] == ac[0]["peer_port"] and op[0]["tx_bytes"] > 0 and ac[0]["rx_bytes"] > 0,
              "meshctl channels shows both ends of the local channel (opener and acceptor, peer node 1, OPEN, "
              "no device) with their bytes", str(rows))
        links = (c.ctl(1, "links") or {}).get("links", [])
        check(len(links) == 1 and links[0]["peer"] == 2 and links[0]["state"] != "UP",
              "meshctl links: one row, node 2's, not UP (the local channel uses no link)", str(links))
        rc_tx, out_tx = finish(tx, 30)
        rc_rx, out_rx = finish(rx, 30)
        check(rc_tx == 0 and rc_rx == 0 and "ok" in out_rx, "the paced stream completes intact",
              f"{rc_tx} {out_tx[-200:]}; {rc_rx} {out_rx[-200:]}")

        # 3. refused
        rc, out = finish(run_chan("send", 1, 7999, 1024), 30)
        check(rc not in (0, None) and "refused" in out.lower(),
              "a local port nobody listens on: the connect is refused", f"exit {rc}: {out.strip()[-200:]}")

        # 4. the receiver killed mid-stream
        rx = receiver(7002, 1)
        tx = run_chan("send", 1, 7002, 1 << 40, "-R", 4 << 20)
        wait_until(lambda: any(ch["rx_bytes"] for ch in channels(7002) if not ch["opener"]), 10)
        rx.send_signal(signal.SIGKILL)
        rx.wait()
        t0 = time.monotonic()
        rc_tx, out_tx = finish(tx, 15)
        dt = time.monotonic() - t0
        check(rc_tx not in (0, None), f"the receiving application killed: the sender fails ({dt:.2f} s) "
              "instead of waiting", f"exit {rc_tx}: {out_tx.strip()[-200:]}")
        check(wait_until(lambda: not channels(), 10), "no channel is left at meshd", str(channels()))
    finally:
        ok = c.stop_all()
        if fixtures.failed or not ok:
            c.dump_logs()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{fixtures.passed} passed, {fixtures.failed} failed")
    return 1 if fixtures.failed else 0


if __name__ == "__main__":
    sys.exit(main())
