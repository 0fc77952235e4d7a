#!/usr/bin/env python3
"""Integration test of stream channels: several meshd, applications on libmesh (chan_test) and a raw
client (meshring.py) that misbehaves on purpose. Over tcp anywhere, over rdma in the Soft-RoCE VM.

  1. all-to-all: every node opens a channel to every other (N*(N-1) channels at once), each
     carrying --bytes of a pseudo-random stream checked byte by byte at the receiver, ring sizes
     from 4 KiB to 16 MiB and 1 to qps_per_link QPs per channel, half of them zero-copy;
  2. a reader that stops for seconds loses nothing (the sender stalls on credit, meshctl shows it);
  3. errors at connect: unknown node, nobody listening, link DOWN;
  4. hostile shared memory: nonsense indices break only that channel (-EPROTO), meshd keeps serving;
  5. applications that die with open channels: meshd frees everything, the peer sees the channel
     closed, and meshd's memory and descriptors do not grow over --deaths deaths;
  6. a link that goes DOWN under an open channel: the application gets an error, never a hang.
Prints one line per check and 'N passed, M failed'.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import meshring  # noqa: E402
import fixtures  # noqa: E402
from fixtures import Cluster, check, wait_until  # noqa: E402



def proc_stats(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--addrs", default="127.0.0.1")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--qps", type=int, default=8)
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--base-port", type=int, default=7570)
    ap.add_argument("--bytes", type=int, default=64 << 20)
    ap.add_argument("--rings", default="4096,65536,1048576,16777216")
    ap.add_argument("--deaths", type=int, default=1000)
    ap.add_argument("--ka-interval", type=int, default=300)
    # Generous: 16 processes stream at once, under emulation and sanitizers; keepalives are
    # mesh_test's subject, and the link loss below is seen by the disconnect, not the timeout.
    ap.add_argument("--ka-timeout", type=int, default=15000)
    ap.add_argument("--up-timeout", type=float, default=90)
    ap.add_argument("--tcp-only-addrs", default="")
    ap.add_argument("--polling", choices=["adaptive", "busy", "event"], default=None,
                    help="cluster.polling of every meshd (default: meshd's own, adaptive)")
    ap.add_argument("--app-send", choices=["on", "off"], default=None,
                    help="cluster.app_send of every meshd (default: meshd's own, on); over rdma, on: "
                         "applications post their own writes (checked on the ping-pongs)")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    args.cluster_extra = ""
    if args.polling:
        args.cluster_extra += f'  polling = "{args.polling}";\n'
        print(f"# meshd polling: {args.polling}")
    line, args.app_send = fixtures.app_send(args.app_send, args.transport)
    args.cluster_extra += line
    print("# cluster.app_send: " + ("applications post their own writes" if args.app_send else "meshd posts every write"))
    chan_test = os.path.join(args.build, "tests", "integration", "chan_test")
    rings = [int(r) for r in args.rings.split(",")]
    workdir = tempfile.mkdtemp(prefix="mesh-chtest-")
    c = Cluster(args, workdir)
    n = args.nodes
    procs = []

    def run(node, *a):
        p = subprocess.Popen([chan_test, "-s", c.nodes[node]["sock"], *map(str, a)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        procs.append(p)
        return p

    def channels(node):
        j = c.ctl(node, "channels")
        return j["channels"] if j else []

    print(f"# {n} meshd, {args.qps} QPs per link, transport {args.transport}, {args.bytes} bytes per channel")
    try:
        for i in c.nodes:
            c.start(i)
        if not check(wait_until(c.all_up, args.up_timeout, 0.2), "full mesh UP"):
            raise RuntimeError("no mesh")

        # 1. all-to-all
        port = 7000
        receivers = {}
        for j in c.nodes:
            receivers[j] = run(j, "recv", port, n - 1, *(["-z"] if j % 2 else []))
            line = receivers[j].stdout.readline()
            check("listening" in line, f"node {j} listens on port {port}", line.strip())
        senders, k, combos = [], 0, []
        t0 = time.monotonic()
        for i in c.nodes:
            for j in c.nodes:
                if i == j:
                    continue
                ring, qps = rings[k % len(rings)], 1 + k % args.qps
                combos.append((i, j, ring, qps))
                senders.append(run(i, "send", j, port, args.bytes, "-r", ring, "-q", qps, "-S", 1000 + k,
                                   *(["-z"] if k % 2 else [])))
                k += 1
        # Each of node 1's channels shows up while it runs; a small one may finish before the last
        # opens (slow machines, sanitizers), so what counts is every channel seen, not all at once.
        seen = {}

        def all_seen():
            seen.update((ch["id"], ch) for ch in channels(1))
            return len(seen) >= 2 * (n - 1)
        wait_until(all_seen, 10, 0.05)
        check(len(seen) == 2 * (n - 1) and all("tx_bytes" in ch and "credit_stalls" in ch for ch in seen.values()),
              f"meshctl -j channels on node 1 shows its {2 * (n - 1)} channels", json.dumps(list(seen.values()))[:300])
        out = subprocess.run([c.bin("meshctl"), "-s", c.nodes[1]["sock"], "channels"], capture_output=True,
                             text=True).stdout
        print("# meshctl channels on node 1 during the transfer:")
        print("".join("#   " + line + "\n" for line in out.splitlines()), end="")
        budget = 120 + args.bytes * len(senders) / (5 << 20)
        ok_s = all(p.wait(timeout=budget) == 0 for p in senders)
        ok_r = all(p.wait(timeout=60) == 0 for p in receivers.values())
        secs = time.monotonic() - t0
        outs = [p.stdout.read() for p in senders + list(receivers.values())]
        total = args.bytes * len(senders)
        check(ok_s and ok_r, f"{len(senders)} channels all-to-all, {args.bytes} bytes each, every byte checked "
              f"(rings {min(rings)}..{max(rings)}, 1..{args.qps} QPs, copy and zero-copy): "
              f"{total / secs / 1e6:.1f} MB/s in total", " | ".join(o.strip().replace("\n", "; ") for o in outs)[:2000])
        print(f"# all-to-all: {total} bytes in {secs:.1f} s")
        check(wait_until(lambda: all(not channels(i) for i in c.nodes), 15),
              "every channel is gone from every meshd after close")

        # 2. a reader that stops for 3 s
        port += 1
        r = run(2, "recv", port, 1, "-p", 3000, "-a", 1 << 20)
        r.stdout.readline()
        s = run(1, "send", 2, port, 8 << 20, "-r", 65536, "-q", 2)
        stalled = wait_until(lambda: any(ch["credit_stalls"] > 0 for ch in channels(1)), 10)
        check(stalled, "a paused reader stalls the sender on credit (meshctl credit_stalls > 0)")
        check(s.wait(timeout=120) == 0 and r.wait(timeout=60) == 0,
              "after the pause the reader resumes and gets every byte", r.stdout.read() + s.stdout.read())

        # 2b. ping-pong of small messages: the bytes arrive by direct receive (the sender's meshd
        # writes the pair after the data, meshctl counts it) and the exchange is driven by events,
        # not by meshd's timer: with polling = event over rdma every CQ was left unarmed after the
        # first tick and each message waited for the next one (75 ms here).
        bench = os.path.join(args.build, "meshlib", "meshbench")

        def ping_pong(port, secs, watch, env=None):
            """meshbench's 64 B ping-pong from node 1 to node 2's port for secs, watch() asked
            meanwhile until it says True: the round trips (every byte checked), or 0 on failure."""
            srv = subprocess.Popen([bench, "-s", c.nodes[2]["sock"], "-l", str(port)], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, env=env)
            procs.append(srv)
            srv.stdout.readline()
            cl = subprocess.Popen([bench, "-s", c.nodes[1]["sock"], "-j", "-t", "lat", "-m", "64", "-D", str(secs),
                                   "-c", "2", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=env)
            procs.append(cl)
            # The ping-pong runs whole seconds: meshctl sees its channel whatever the machine's speed.
            wait_until(lambda: watch() or cl.poll() is not None, 30, 0.01)
            try:
                rc = cl.wait(timeout=120)
            except subprocess.TimeoutExpired:
                cl.kill()
                rc = "hung"
            out = cl.stdout.read() if rc != "hung" else ""
            srv.kill()
            srv.wait()
            trips = 0
            for line in out.splitlines():
                if line.startswith("{"):
                    trips = json.loads(line).get("iters", 0)
            if rc != 0 or not trips:
                print(f"#   meshbench: {rc} {out.strip()}"[-500:])
            return trips if rc == 0 else 0

        tick_ms, secs_want = max(5, min(100, args.ka_interval // 4)), 1
        direct = {}

        def direct_seen():
            for ch in channels(1):
                if ch["peer_port"] in (7050, 7051):
                    # With app_send the application writes the pairs itself: meshctl says who writes.
                    direct[ch["id"]] = ch.get("writer") == "app" if args.app_send else ch.get("direct_writes", 0)
            return any(direct.values())
        trips = ping_pong(7050, secs_want, direct_seen)
        check(trips > 0, f"{trips} round trips of 64 B in {secs_want} s, every byte checked")
        # Not a speed test: paced by the timer a round trip took two ticks; 5 per tick is far below
        # anything seen since (tens to hundreds per tick, VM and sanitizers included).
        check(trips >= 5 * secs_want * 1000 / tick_ms,
              f"the exchange is not paced by meshd's {tick_ms} ms timer: {trips} round trips in {secs_want} s")
        if args.app_send and not any(direct.values()):
            # The application takes the grant once its own QP is connected to the peer's: under ASan in
            # the VM on a loaded machine that took longer than the second's exchange (issue 42). The
            # property, not the speed: a longer exchange, watched until its writer is the application.
            print("# the application's own QP did not come within the 1 s exchange: a 20 s one, watched")
            ping_pong(7051, 20, direct_seen)
        if args.app_send:
            check(any(direct.values()), f"the sender's application posted its own writes and pairs (meshctl writer "
                  f"app: {direct})")
        else:
            check(any(direct.values()), f"the sender's meshd wrote direct pairs (meshctl direct_writes {direct})")

        # 2c. pairs on demand: the same ping-pong with both applications asleep in the kernel until
        # their meshd wakes them (MESH_SPIN_US=0). No byte is ever read through a pair, so each
        # receiving meshd asks its peer for none (a hint: meshctl pair_hints), and the peer's
        # channel shows it writes none (direct_paused); every round trip is still checked.
        paused, hints = set(), {}

        def pairs_paused():
            for i in (1, 2):
                for ch in channels(i):
                    if 7051 in (ch["peer_port"], ch["local_port"]):
                        hints[(i, ch["id"])] = ch.get("pair_hints", 0)
                        if ch.get("direct_paused"):
                            paused.add(i)
            return paused == {1, 2}
        apps = set()

        def apps_write():
            # With app_send both applications post their own writes, and a reader asleep is woken by
            # its own QP's completion channel (the pair's immediate): no meshd on the way at all.
            for i in (1, 2):
                for ch in channels(i):
                    if 7051 in (ch["peer_port"], ch["local_port"]) and ch.get("writer") == "app":
                        apps.add(i)
            return apps == {1, 2}
        trips = ping_pong(7051, 2, apps_write if args.app_send else pairs_paused, dict(os.environ, MESH_SPIN_US="0"))
        check(trips > 0, f"{trips} round trips of 64 B with both readers asleep, every byte checked")
        if args.app_send:
            check(apps == {1, 2}, f"readers asleep: both applications post their own writes (meshctl writer app on "
                  f"nodes {sorted(apps)}), each woken by its own QP's completions")
        else:
            check(paused == {1, 2} and sum(hints.values()) >= 2,
                  f"readers asleep: each meshd asked its peer for no direct pairs, and each writes none "
                  f"(direct_paused seen on nodes {sorted(paused)}, pair_hints {hints})")

        # 3. errors at connect
        rep = meshring.connect_reply(c.nodes[1]["sock"], 999, 7000)
        check(rep.status == -2004, f"connect to an unknown node: {rep.status} ({rep.error})")
        rep = meshring.connect_reply(c.nodes[1]["sock"], 2, 7999)
        check(rep.status == -111, f"connect to a port nobody listens on: {rep.status} ({rep.error})")
        rep = meshring.connect_reply(c.nodes[1]["sock"], 1, 7000)
        check(rep.status == -111, f"connect to a port of the local node nobody listens on: {rep.status} "
              f"({rep.error}; local channels themselves: local_channel_test.py)")

        # 4. hostile shared memory
        lst = meshring.Listener(c.nodes[2]["sock"], 7100)
        bad = meshring.connect(c.nodes[1]["sock"], 2, 7100, ring_size=4096)
        peer = lst.accept()
        bad.put64(meshring.OFF_TX_PROD, 1 << 62)
        bad.do_kick()
        st = wait_until(lambda: bad.state()[0] & meshring.STATE_ERROR, 10)
        check(st and bad.state()[1] == -71, f"a nonsense tx_prod breaks that channel with -EPROTO {bad.state()}")
        check(wait_until(lambda: peer.state()[0] & meshring.STATE_ERROR, 10),
              f"the peer application sees the channel broken {peer.state()}")
        bad2 = meshring.connect(c.nodes[1]["sock"], 2, 7100, ring_size=4096)
        peer2 = lst.accept()
        bad2.put64(meshring.OFF_RX_CONS, 12345)
        bad2.do_kick()
        check(wait_until(lambda: bad2.state()[0] & meshring.STATE_ERROR, 10) and bad2.state()[1] == -71,
              "an rx_cons beyond what arrived breaks that channel with -EPROTO")
        # The page is the application's to scribble on: meshctl shows what meshd knows, not the page.
        liar = meshring.connect(c.nodes[1]["sock"], 2, 7100, ring_size=4096)
        peer3 = lst.accept()
        cid = liar.u32(meshring.OFF_CHANNEL_ID)
        liar.put32(meshring.OFF_PEER_NODE, 999)
        shown = [ch["peer_node"] for ch in (c.ctl(1, "channels") or {}).get("channels", []) if ch["id"] == cid]
        check(shown == [2], f"an application that overwrites its page's peer node: meshctl still shows node 2 {shown}")
        for ch in (bad, peer, bad2, peer2, liar, peer3):
            ch.close()
        lst.close()
        r = run(2, "recv", 7101, 1)
        r.stdout.readline()
        s = run(1, "send", 2, 7101, 1 << 20)
        check(s.wait(timeout=60) == 0 and r.wait(timeout=60) == 0 and c.all_up(),
              "meshd keeps serving: links UP, a new channel carries its data")

        # 5. applications that die
        lst = meshring.Listener(c.nodes[2]["sock"], 7200)
        pid1, pid2 = c.nodes[1]["proc"].pid, c.nodes[2]["proc"].pid
        warm = min(50, args.deaths)
        for i in range(args.deaths + warm):
            if i == warm:
                wait_until(lambda: not channels(1) and not channels(2), 10)
                before = proc_stats(pid1), proc_stats(pid2)
            a = meshring.connect(c.nodes[1]["sock"], 2, 7200, ring_size=4096)
            b = lst.accept()
            a.send(b"x" * 100)
            if i == warm:
                a.close()  # dies: no shutdown
                seen = wait_until(lambda: b.state()[0] & meshring.STATE_ERROR, 10)
                check(seen and b.state()[1] == -104,
                      f"the peer of an application that died sees the channel reset {b.state()}")
            else:
                a.close()
            b.close()
        gone = wait_until(lambda: not channels(1) and not channels(2), 30)
        # The meshctl that just asked may still hold its control connection for a moment: growth is
        # what stays, so give transient descriptors a few seconds to go.
        wait_until(lambda: all(proc_stats(p)[1] <= before[k][1] for k, p in enumerate((pid1, pid2))), 5)
        after = proc_stats(pid1), proc_stats(pid2)
        lst.close()
        check(gone, f"after {args.deaths} application deaths no channel is left")
        grow_rss = max(after[k][0] - before[k][0] for k in range(2))
        grow_fd = max(after[k][1] - before[k][1] for k in range(2))
        # Under AddressSanitizer freed memory sits in its quarantine (and LeakSanitizer checks leaks
        # at exit): RSS then may grow by the quarantine, not by leaks.
        with open(f"/proc/{pid1}/maps") as f:
            asan = "libasan" in f.read()
        rss_limit = (64 << 10) if asan else 4096
        check(grow_rss < rss_limit and grow_fd <= 0,
              f"meshd memory and descriptors do not grow over {args.deaths} deaths "
              f"(RSS {before[0][0]}->{after[0][0]} kB and {before[1][0]}->{after[1][0]} kB, "
              f"fds {before[0][1]}->{after[0][1]} and {before[1][1]}->{after[1][1]}"
              f"{'; ASan build: RSS limit 64 MiB for the quarantine' if asan else ''})")
        r = run(2, "recv", 7201, 1)
        r.stdout.readline()
        s = run(1, "send", 2, 7201, 1 << 40)
        time.sleep(1)
        s.send_signal(signal.SIGKILL)
        s.wait()
        rc = r.wait(timeout=30)
        out = r.stdout.read()
        check(rc != 0 and "Connection reset" in out,
              "a sender killed mid-stream: the receiver gets a reset, not a hang", out.strip())

        # 6. the peer's meshd dies under an open channel (SIGKILL): the channel waits for the link
        # (RESUMING), and when the node comes back as another process it fails at once with its own
        # error (the state of the channel died with that process), never hangs.
        r = run(2, "recv", 7300, 1)
        r.stdout.readline()
        s = run(1, "send", 2, 7300, 1 << 40)
        time.sleep(1)
        c.nodes[2]["proc"].send_signal(signal.SIGKILL)
        c.nodes[2]["proc"].wait()
        r.kill()
        wait_until(lambda: c.links(1)[2]["state"] == "DOWN", 15)
        states = [ch["state"] for ch in (c.ctl(1, "channels") or {}).get("channels", []) if ch["peer_node"] == 2]
        check(states == ["RESUMING"], f"the link went DOWN under an open channel: it waits (meshctl: {states})")
        check(s.poll() is None, "the sender is paused, not failed, while the channel waits")
        rep = meshring.connect_reply(c.nodes[1]["sock"], 2, 7000)
        check(rep.status == -101, f"connect while the link is DOWN: {rep.status} ({rep.error})")
        c.start(2)
        t1 = time.monotonic()
        try:
            rc = s.wait(timeout=args.up_timeout + 20)
        except subprocess.TimeoutExpired:
            rc = "hung"
        out = s.stdout.read() if rc != "hung" else ""
        check(rc not in (0, "hung") and "restarted" in out,
              f"the node came back as another meshd: the sender got its error {time.monotonic() - t1:.1f} s after "
              f"the restart", f"{rc} {out.strip()}")
        check(wait_until(c.all_up, args.up_timeout, 0.2), "the restarted node rejoins")

        for nd in c.nodes.values():
            nd["proc"].send_signal(signal.SIGTERM)
        codes = [nd["proc"].wait(timeout=15) for nd in c.nodes.values()]
        check(codes == [0] * n, "SIGTERM: every meshd exits 0", str(codes))
    except Exception as e:
        check(False, "test aborted", repr(e))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for nd in c.nodes.values():
            if nd["proc"] and nd["proc"].poll() is None:
                nd["proc"].kill()
                nd["proc"].wait()
        if fixtures.failed:
            c.dump_logs()
        bad = []
        for i, nd in c.nodes.items():
            if os.path.exists(nd["log"]):
                with open(nd["log"]) as f:
                    bad += [f"meshd {i}: {line.rstrip()}" for line in f if "AddressSanitizer" in line
                            or "runtime error" in line or " error: " in line]
        # The lines themselves: the logs live in a temporary directory that is gone after the run.
        check(not bad, "no errors or sanitizer reports in the meshd logs",
              f"{len(bad)} lines:\n  " + "\n  ".join(bad[:20]))
    print(f"{fixtures.passed} passed, {fixtures.failed} failed")
    return 1 if fixtures.failed else 0


if __name__ == "__main__":
    sys.exit(main())
