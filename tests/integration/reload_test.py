#!/usr/bin/env python3
"""Reload (issue 40): a running cluster changed by SIGHUP and `meshctl reload` while a stream runs,
checked through `meshctl -j`. Three meshd on this machine (tcp on loopback, or rdma in the Soft-RoCE
VM with --addrs); the file starts with nodes 1 and 2.

What it asserts, in order, with a paced stream from node 1 to node 2 running throughout:
  1. Nodes 1 and 2 form their link; the stream starts.
  2. A new key file and node 3 are added to the file: node 1 reloads by SIGHUP, node 2 by
     `meshctl reload`; meshd 3 starts with the new key. Every link comes UP (the new ones proved the
     new key), the link 1-2 stays UP on its first handshake (ups 1, same epoch: proven links stay).
  3. A file that does not parse, and one that changes a key only a start applies, are refused as a
     whole: meshctl exits 2 naming file:line or the key, the generation and every link are unchanged,
     the log says why.
  4. The log level is raised by a reload and lowered by the next (meshctl node: log_level).
  5. Node 3 moves to another port (meshd 3 restarted there, 1 and 2 reload): its links re-form there,
     the link 1-2 is not touched. With --rail-addrs every node has a second rail, and node 3 moves
     that rail to another address instead: its links re-form there on both rails.
  6. A channel from node 1 to node 3 is open; node 3 is removed from the file and 1 and 2 reload: the
     links to node 3 close, both ends of that channel fail with "removed from the configuration"
     (MESH_EREMOVED), node 3's link DOWN says node 1 removed it.
  7. The stream ends intact (every byte checked by the receiver), both applications exit 0; through
     all of it the link 1-2 kept its first epoch (UP once) and no channel resumed on 1 or 2.
  8. Drain: `meshctl drain` on node 2 refuses new channels from and to it ("draining"), the channel
     open before finishes intact and meshd 2 then stops by itself (exit 0); `drain --deadline 2
     --wait` on node 1 fails the channel left at the deadline with the drain's error and returns once
     meshd 1 stopped (exit 0). SIGTERM: meshd 3 exits 0.
Prints one line per check and a closing 'N passed, M failed' line; exits non-zero on failure.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402
from fixtures import check, finish, wait_until  # noqa: E402


def write_conf(c, ids, key="cluster.key", extra="", ports=None, rails=None):
    """mesh.conf with nodes ids (their Cluster address and port, or ports[i]; with --rail-addrs a
    second rail each, or rails[i]), atomically: a meshd that reloads reads a whole file, never half
    of one."""
    ports = ports or {}
    rails = rails or {}
    ra = c.a.rail_addrs.split()

    def rail(i):
        return f'rails = ["{rails.get(i, ra[i - 1])}"]; ' if ra else ""
    text = ('cluster = {\n  name = "itest";\n'
            f'  transport = "{c.a.transport}";\n  qps_per_link = {c.a.qps};\n'
            f'  keepalive_interval_ms = {c.a.ka_interval};\n  keepalive_timeout_ms = {c.a.ka_timeout};\n'
            '  connect_timeout_ms = 4000;\n  handshake_timeout_ms = 20000;\n'
            '  backoff_initial_ms = 100;\n  backoff_max_ms = 1000;\n'
            f'  key_file = "{key}";\n' + (extra or '  log_level = "info";\n') + '};\n'
            "nodes = (\n" + ",\n".join(
                f'  {{ id = {i}; addr = "{c.nodes[i]["addr"]}"; port = {ports.get(i, c.nodes[i]["port"])}; {rail(i)}}}'
                for i in ids) + "\n);\n")
    tmp = c.conf + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, c.conf)


def reload_ctl(c, i):
    """`meshctl reload` on node i: (exit status, stdout + stderr)."""
    r = subprocess.run([c.bin("meshctl"), "-s", c.nodes[i]["sock"], "reload"], capture_output=True, text=True,
                       timeout=fixtures.CTL_TIMEOUT_S)
    return r.returncode, (r.stdout + r.stderr).strip()


def node(c, i):
    return c.ctl(i, "node") or {}


def generation(c, i):
    return node(c, i).get("config_generation")


def reload_hup(c, i):
    """SIGHUP to meshd i; True once its generation moved on (the reload is applied)."""
    was = generation(c, i)
    c.nodes[i]["proc"].send_signal(signal.SIGHUP)
    return wait_until(lambda: (generation(c, i) or 0) > (was or 0), 30, 0.05)


def log_text(c, i):
    with open(c.nodes[i]["log"]) as f:
        return f.read()


def chan(c, i, *args):
    return fixtures.chan_test(c.a.build, c.nodes[i]["sock"], *args)


def receiver(c, i, port):
    return fixtures.chan_receiver(c.a.build, c.nodes[i]["sock"], port)


def link_12(c):
    """(epoch, ups) of the link 1-2 as node 1 and node 2 see it."""
    l1, l2 = (c.links(1) or {}).get(2, {}), (c.links(2) or {}).get(1, {})
    return (l1.get("epoch"), l1.get("ups")), (l2.get("epoch"), l2.get("ups"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--addrs", default="127.0.0.1", help="one address (3 ports) or 3 addresses")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--qps", type=int, default=2)
    ap.add_argument("--base-port", type=int, default=17870)
    ap.add_argument("--ka-interval", type=int, default=300)
    ap.add_argument("--ka-timeout", type=int, default=3000)
    ap.add_argument("--bytes", type=int, default=60 << 20, help="the stream from node 1 to node 2")
    ap.add_argument("--rate", type=int, default=3 << 20, help="its bytes per second")
    ap.add_argument("--up-timeout", type=float, default=60)
    ap.add_argument("--rail-addrs", default="", help="a second rail: nodes 1, 2 and 3's addresses on it, and "
                    "a fourth that node 3 moves to in step 5 (instead of its port)")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    args.nodes = 3

    workdir = tempfile.mkdtemp(prefix="mesh-reload-")
    c = fixtures.Cluster(args, workdir)  # writes a file of 3 nodes and a key: replaced below
    shutil.copy(os.path.join(workdir, "cluster.key"), os.path.join(workdir, "old.key"))
    os.chmod(os.path.join(workdir, "old.key"), 0o600)
    fixtures.cluster_key(args.build, workdir, "new.key")
    write_conf(c, [1, 2], key="old.key")
    print(f"# meshd 1 and 2, then 3; transport {args.transport}, addresses {args.addrs}; "
          f"a stream of {args.bytes} bytes at {args.rate} B/s", flush=True)
    tx = rx = tx3 = rx3 = None
    try:
        # 1. two nodes and the stream
        c.start(1)
        c.start(2)
        up = wait_until(lambda: (c.links(1) or {}).get(2, {}).get("state") == "UP"
                        and (c.links(2) or {}).get(1, {}).get("state") == "UP", args.up_timeout, 0.1)
        if not check(up, "nodes 1 and 2 form their link from a file of two nodes"):
            raise RuntimeError("no link")
        check(sorted((c.links(1) or {}).keys()) == [2], "node 1 knows one peer")
        first = link_12(c)
        resumes0 = {i: node(c, i).get("channel_resumes") for i in (1, 2)}
        rx = receiver(c, 2, 7001)
        tx = chan(c, 1, "send", 2, 7001, args.bytes, "-R", args.rate)

        # 2. a new key and node 3: SIGHUP on node 1, meshctl reload on node 2
        write_conf(c, [1, 2, 3], key="new.key")
        check(reload_hup(c, 1), "node 1 reloads on SIGHUP (its generation moves on)")
        rc, out = reload_ctl(c, 2)
        check(rc == 0 and "generation 2" in out, "node 2 reloads by `meshctl reload` (exit 0, generation 2)",
              f"exit {rc}: {out}")
        c.start(3)
        up = wait_until(lambda: all((c.links(i) or {}).get(p, {}).get("state") == "UP"
                                    for i in (1, 2, 3) for p in (1, 2, 3) if p != i), args.up_timeout, 0.1)
        check(up, "node 3, added to the file, forms its links with both (with the new key)",
              str({i: {p: l["state"] for p, l in (c.links(i) or {}).items()} for i in (1, 2, 3)}))
        check(link_12(c) == first, "the link 1-2 was not touched by the reloads: same epoch, UP once",
              f"{first} -> {link_12(c)}")
        check(all("node 3 added to the configuration" in log_text(c, i) for i in (1, 2)),
              "both logs say node 3 was added")

        # 3. broken files are refused as a whole
        gen = {i: generation(c, i) for i in (1, 2)}
        shutil.copy(c.conf, c.conf + ".good")
        with open(c.conf, "w") as f:
            f.write('cluster = { name = "itest"; transport = tcp; };\n')
        rc, out = reload_ctl(c, 1)
        check(rc == 2 and f"{c.conf}:1:" in out and "nothing was changed" in out,
              "a file that does not parse: meshctl reload exits 2 naming file:line, nothing changed", f"exit {rc}: {out}")
        write_conf(c, [1, 2, 3], key="new.key", extra='  log_level = "info";\n  mailbox_size = 8192;\n')
        rc, out = reload_ctl(c, 1)
        check(rc == 2 and "cluster.mailbox_size changed (4096 -> 8192)" in out and "restart" in out,
              "a file changing a key only a start applies: refused naming the key", f"exit {rc}: {out}")
        n1 = node(c, 1)
        check(n1.get("config_generation") == gen[1] and n1.get("config_refused") == 2
              and "mailbox_size" in n1.get("config_error", ""),
              "meshctl node: generation unchanged, 2 refused, config_error says why", str(n1))
        check("reload refused, nothing was changed" in log_text(c, 1), "node 1's log says why the reload was refused")
        text = subprocess.run([c.bin("meshctl"), "-s", c.nodes[1]["sock"], "metrics"], capture_output=True,
                              text=True, timeout=fixtures.CTL_TIMEOUT_S).stdout
        check("rdmamesh_config_last_reload_successful 0" in text
              and 'rdmamesh_config_reloads_total{result="refused"} 2' in text
              and f"rdmamesh_config_generation {gen[1]}" in text,
              "the metrics say so too (last reload not successful, 2 refused, generation unchanged)",
              "\n".join(l for l in text.splitlines() if "config" in l))
        shutil.copy(c.conf + ".good", c.conf)

        # 4. the log level
        write_conf(c, [1, 2, 3], key="new.key", extra='  log_level = "debug";\n')
        rc, out = reload_ctl(c, 2)
        check(rc == 0 and node(c, 2).get("log_level") == "debug", "log_level = \"debug\" applies at a reload "
              "(meshctl node: log_level debug)", f"exit {rc}: {out}; log_level {node(c, 2).get('log_level')}")
        write_conf(c, [1, 2, 3], key="new.key")
        rc, out = reload_ctl(c, 2)
        check(rc == 0 and node(c, 2).get("log_level") == "info", "and back to info by the next")

        # 5. node 3 moves to another port (with --rail-addrs: its second rail to another address):
        # its links re-form there, 1-2 untouched
        ra = args.rail_addrs.split()
        ports = {3: c.nodes[3]["port"] + (0 if ra else 10)}
        rails = {3: ra[3]} if ra else {}
        c.nodes[3]["proc"].terminate()
        c.nodes[3]["proc"].wait(timeout=10)
        write_conf(c, [1, 2, 3], key="new.key", ports=ports, rails=rails)
        c.start(3)
        reload_hup(c, 1)
        reload_ctl(c, 2)
        up = wait_until(lambda: all((c.links(i) or {}).get(3, {}).get("state") == "UP"
                                    and (c.links(i) or {}).get(3, {}).get("port") == ports[3]
                                    and (c.links(i) or {}).get(3, {}).get("rails_up", 1) == (2 if ra else 1)
                                    for i in (1, 2)),
                        args.up_timeout, 0.1)
        where = f"its second rail to {ra[3]}" if ra else f"port {ports[3]}"
        check(up, f"node 3 moved {where}: nodes 1 and 2 reach it there after a reload"
              + (" on both rails" if ra else ""), str({i: (c.links(i) or {}).get(3) for i in (1, 2)}))
        check(all("node 3 moved in the configuration" in log_text(c, i) for i in (1, 2)), "both logs say node 3 moved")

        # 6. node 3 removed while a channel to it is open
        rx3 = receiver(c, 3, 7003)
        tx3 = chan(c, 1, "send", 3, 7003, 1 << 40, "-R", 1 << 20)
        opened = wait_until(lambda: any(ch.get("peer_node") == 3 for ch in (c.ctl(1, "channels") or {}).get(
            "channels", [])), 20, 0.1)
        check(opened, "a channel from node 1 to node 3 is open")
        write_conf(c, [1, 2], key="new.key")
        check(reload_hup(c, 1), "node 1 reloads the file without node 3")
        rc, out = reload_ctl(c, 2)
        gone = wait_until(lambda: 3 not in (c.links(1) or {3: 0}) and 3 not in (c.links(2) or {3: 0}), 10, 0.1)
        check(rc == 0 and gone, "nodes 1 and 2 no longer have a link to node 3")
        check(tx.poll() is None, "the stream from node 1 to node 2 was still running through every reload",
              "it ended first: give it more bytes or a lower --rate")
        rc3, out3 = finish(tx3, 30)
        check(rc3 != 0 and "removed from the cluster's configuration" in out3,
              "the sender's channel to node 3 fails naming the removal (MESH_EREMOVED)", f"exit {rc3}: {out3}")
        rc3, out3 = finish(rx3, 30)
        check(rc3 != 0 and "removed from the cluster's configuration" in out3,
              "node 3's end of it fails naming the removal too (node 1's Goodbye said why)", f"exit {rc3}: {out3}")
        l31 = (c.links(3) or {}).get(1, {})
        check(l31.get("state") != "UP" and "removed this node" in l31.get("down_error", ""),
              "node 3's link to node 1 went DOWN saying node 1 removed it", str(l31))

        # 7. the stream
        rc, out = finish(tx, args.bytes / args.rate + 120)
        check(rc == 0, "the stream's sender finished (every byte acknowledged)", f"exit {rc}: {out}")
        rc, out = finish(rx, 30)
        check(rc == 0, "the receiver got every byte intact", f"exit {rc}: {out}")
        tx = rx = None
        check(link_12(c) == first, "through every reload the link 1-2 kept its first epoch, UP once",
              f"{first} -> {link_12(c)}")
        check({i: node(c, i).get("channel_resumes") for i in (1, 2)} == resumes0,
              "no channel resumed on nodes 1 and 2 (only the links to node 3 went DOWN: its restart, its move)",
              f"resumes {resumes0} -> {[node(c, i).get('channel_resumes') for i in (1, 2)]}")
        gens = [generation(c, i) for i in (1, 2)]
        print(f"# config generations at the end: node 1 {gens[0]}, node 2 {gens[1]}")

        # 8. drain: node 2 refuses new channels, lets its open one finish, then stops by itself
        rx = receiver(c, 1, 7005)
        tx = chan(c, 2, "send", 1, 7005, 4 << 20, "-R", 1 << 20)
        opened = wait_until(lambda: (node(c, 2).get("channels") or 0) >= 1, 20, 0.05)
        r = subprocess.run([c.bin("meshctl"), "-s", c.nodes[2]["sock"], "--deadline", "60", "drain"],
                           capture_output=True, text=True, timeout=fixtures.CTL_TIMEOUT_S)
        check(opened and r.returncode == 0 and "draining" in r.stdout and "1 channel open" in r.stdout,
              "meshctl drain on node 2: exit 0, one channel open", f"exit {r.returncode}: {r.stdout}{r.stderr}")
        rc, out = finish(chan(c, 2, "send", 1, 7005, 1000), 30)
        check(rc != 0 and "draining" in out, "a new channel from node 2's application is refused: draining",
              f"exit {rc}: {out}")
        rc, out = finish(chan(c, 1, "send", 2, 7006, 1000), 30)
        check(rc != 0 and "draining" in out, "a new channel from node 1 to node 2 is refused by node 2: draining",
              f"exit {rc}: {out}")
        rc, out = finish(tx, 60)
        rc2, out2 = finish(rx, 30)
        tx = rx = None
        check(rc == 0 and rc2 == 0, "the channel open before the drain finishes intact", f"{rc}: {out} / {rc2}: {out2}")
        try:
            rc = c.nodes[2]["proc"].wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = "still running"
        check(rc == 0 and "drained: no channel left, stopping" in log_text(c, 2),
              "meshd 2 stops by itself once no channel is left (exit 0)", f"exit {rc}")
        # ... and at the deadline a channel still open fails with the drain's error (a channel to the
        # node itself, ring to ring in meshd 1)
        rx = receiver(c, 1, 7007)
        tx = chan(c, 1, "send", 1, 7007, 1 << 40, "-R", 1 << 20)
        wait_until(lambda: (node(c, 1).get("channels") or 0) >= 2, 20, 0.05)
        t0 = time.monotonic()
        r = subprocess.run([c.bin("meshctl"), "-s", c.nodes[1]["sock"], "--deadline", "2", "--wait", "drain"],
                           capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        check(r.returncode == 0 and "meshd stopped" in r.stdout and c.nodes[1]["proc"].wait(timeout=30) == 0,
              f"meshctl drain --deadline 2 --wait on node 1 returns once meshd stopped ({took:.1f} s), meshd exits 0",
              f"exit {r.returncode}: {r.stdout}{r.stderr}")
        rc, out = finish(tx, 30)
        check(rc != 0 and "draining" in out, "the channel still open at the deadline failed with the drain's error",
              f"exit {rc}: {out}")
        finish(rx, 30)
        tx = rx = None
        c.stop_all()
    except Exception as e:  # pylint: disable=broad-except
        check(False, "test aborted", repr(e))
    finally:
        for p in (tx, rx, tx3, rx3):
            if p and p.poll() is None:
                p.kill()
                p.wait()
        for nd in c.nodes.values():
            if nd["proc"] and nd["proc"].poll() is None:
                nd["proc"].kill()
                nd["proc"].wait()
        if fixtures.failed:
            c.dump_logs()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{fixtures.passed} passed, {fixtures.failed} failed")
    return 1 if fixtures.failed else 0


if __name__ == "__main__":
    sys.exit(main())
