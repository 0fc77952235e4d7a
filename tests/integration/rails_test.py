#!/usr/bin/env python3
"""Several devices per node (rails), asserted from meshctl's JSON and from the devices' own counters.

Three meshd, each with one address per rail (nodes.addr, nodes.rails): every link keeps
qps_per_link QPs on every rail; meshctl node lists a device per rail with its address. A channel
asked onto rail r (MESH_OPT_RAIL) is shown on rail r and its device on both ends, carries its bytes
intact, and those bytes cross rail r's device: the kernel's counters of that device grow by the
payload, the other rails' do not (tcp: bytes acked on the rail's sockets, `ss`; rdma: the device's
sent_pkts in sysfs). Without a rail, the device on the NUMA hint's node is chosen, else the one on
the connecting thread's node (libmesh asks getcpu: meshbench pinned with taskset), else rail 0;
the rings follow the device's node (move_pages). A rail the cluster lacks is refused with -EINVAL.

  rails_test.py --build DIR [--transport tcp|rdma] --rails "ADDR0 ADDR1 ..." [--want-nodes N]

--want-nodes fails the test unless the machine has N NUMA nodes and the rails' devices sit on
different ones (the VM harness puts each rail's NIC on its own node). Exit 0 when every check passed.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import meshring  # noqa: E402
from fixtures import Cluster, check, wait_until  # noqa: E402
from numa_test import cpus, node_cpus, machine_nodes, find_channel, thread_status  # noqa: E402

PORT = 5600


def pump(a, b, data, timeout):
    """Sends data from raw channel a to raw channel b in 64 KiB pieces; returns what b read."""
    got, sent, end = [], 0, time.monotonic() + timeout
    n = 0
    while n < len(data) and time.monotonic() < end:
        if sent < len(data):
            sent += a.send(data[sent:sent + 65536])
        chunk = b.recv(len(data) - n)
        got.append(chunk)
        n += len(chunk)
        if not chunk:
            broken = [(side, ch.state()) for side, ch in (("sender", a), ("receiver", b))
                      if ch.state()[0] & meshring.STATE_ERROR]
            if broken:  # meshd broke the channel: waiting on would only hide why
                print(f"# channel broken after {n} bytes: " +
                      ", ".join(f"{side} ring error {st[1]}" for side, st in broken))
                break
            time.sleep(0.002)
    return b"".join(got)


def tcp_bytes(addr, ports):
    """Bytes acked on the TCP sockets bound to addr from or to one of ports (the meshd's: both ends of
    loopback connections count). Only those: other programs' loopback traffic on the machine (another
    test's stream) once counted on rail 0 while rail 1 carried the channel."""
    sel = " or ".join(f"sport = :{p} or dport = :{p}" for p in ports)
    r = subprocess.run(["ss", "-tinH", "src", addr, f"( {sel} )"], capture_output=True, text=True, timeout=10)
    return sum(int(m) for m in re.findall(r"bytes_acked:(\d+)", r.stdout))


def rdma_pkts(dev):
    try:
        with open(f"/sys/class/infiniband/{dev}/ports/1/hw_counters/sent_pkts") as f:
            return int(f.read())
    except OSError:
        return None


def thread_work(c, i):
    """Node i's data-path threads by rail: (events taken under the rail's lock alone, events left to
    the usual way, times the thread took every lock)."""
    j = c.ctl(i, "node") or {}
    return {t.get("rail", 0): (t.get("fast_events", 0), t.get("deferred_events", 0), t.get("slow_sections", 0))
            for t in j.get("threads", [])}


def thread_kicks(c, i):
    """Node i's data-path threads by rail: the kicks each took."""
    j = c.ctl(i, "node") or {}
    return {t.get("rail", 0): t.get("kicks", 0) for t in j.get("threads", [])}


def kicks_on_own_rail(c, li, r, nr, want=10, most=2000):
    """A channel on rail r whose application writes a message, waits 3 ms (meshd goes to sleep
    after poll_budget_us) and writes again: such a write kicks when meshd slept, and each kick is
    taken by rail r's thread at both ends, none by another rail's (admin_channel.c,
    channel_ops.watch; main.c, run). How many of the writes find meshd asleep depends on the
    machine's speed and load (a fresh machine's 100 made 22 kicks): messages go on until rail r's
    thread at both ends took `want` kicks (or `most` messages, or 60 s), and the check is whose they
    were."""
    ok = True
    a = meshring.connect(c.nodes[1]["sock"], 2, PORT, ring_size=1 << 16, rail=r)
    b = li.accept()
    before = {i: thread_kicks(c, i) for i in (1, 2)}
    data, got, msgs = random.randbytes(64 * most), [], 0
    end = time.monotonic() + 60
    while msgs < most and time.monotonic() < end:
        sent, piece = 0, data[64 * msgs:64 * (msgs + 1)]
        while sent < len(piece):
            sent += a.send(piece[sent:])
        msgs += 1
        time.sleep(0.003)
        got.append(b.recv(1 << 16))
        if msgs % 25 == 0:
            now = {i: thread_kicks(c, i) for i in (1, 2)}
            if all(now[i].get(r, 0) - before[i].get(r, 0) >= want for i in (1, 2)):
                break
    data = data[:64 * msgs]
    end = time.monotonic() + 30
    while sum(map(len, got)) < len(data) and time.monotonic() < end:
        time.sleep(0.005)
        got.append(b.recv(1 << 16))
    ok &= check(b"".join(got) == data, f"rail {r}: {msgs} messages with pauses between, intact")
    after = {i: thread_kicks(c, i) for i in (1, 2)}
    for i in (1, 2):
        grew = [after[i].get(k, 0) - before[i].get(k, 0) for k in range(nr)]
        ok &= check(grew[r] >= want and all(g == 0 for k, g in enumerate(grew) if k != r),
                    f"node {i}: the channel's kicks were taken by rail {r}'s thread alone ({msgs} messages with "
                    f"pauses; kicks per rail's thread: {grew}, at least {want} wanted on rail {r})")
    a.close()
    b.close()
    wait_until(lambda: not find_channel(c, 1, PORT), 10)
    return ok


def rails_at_once(args, c, bench, nr):
    """A checked stream on every rail at the same time (meshbench -c, one server per rail): each
    rail's data-path thread moves its stream under its rail's lock alone (mesh.h, struct
    mesh_locks): its fast events grow (by hundreds at least), and it took every lock (the control
    plane's, a tick's, an event it left to it) and left events to the usual way far less often.

    The ticks and the rails' keepalives take every lock so many times a second whatever the stream,
    and how many events a stream makes depends on the machine's speed (the sanitizer build under the
    VM's emulation made 338-424 in 4 s on one rail, the host 100,000). So the idle rate is measured
    first, in the same run, and only what the stream added beyond it (with half as much again and a
    few for noise) is weighed against the stream's own events."""
    ok = True
    idle0, t_idle0 = {i: thread_work(c, i) for i in (1, 2)}, time.monotonic()
    time.sleep(3)
    idle1, t_idle1 = {i: thread_work(c, i) for i in (1, 2)}, time.monotonic()
    srvs = [subprocess.Popen([bench, "-s", c.nodes[2]["sock"], "-1", "-l", str(PORT + 10 + r)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in range(nr)]
    try:
        time.sleep(0.5)
        before, t_before = {i: thread_work(c, i) for i in (1, 2)}, time.monotonic()
        # Rings of 256 KiB: chunks of 64 KiB (a quarter). The check is about which lock took the
        # stream's events, against the rail's keepalive messages the usual way takes (so many a
        # second, whatever the stream): with the default ring's 256 KiB chunks, a slow machine's
        # stream, its writer ahead of meshd, makes as few as a quarter of the events in the 4 s.
        cls = [subprocess.Popen([bench, "-s", c.nodes[1]["sock"], "-r", "256K", "-R", str(r), "-c", "-D", "4", "-m", "16K",
                                 "2", str(PORT + 10 + r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for r in range(nr)]
        outs = [cl.communicate(timeout=120) for cl in cls]
        for r, (cl, (out, err)) in enumerate(zip(cls, outs)):
            ok &= check(cl.returncode == 0, f"rails at once: the stream on rail {r} arrived, every byte checked",
                        f"exit {cl.returncode}: {err.strip()[-300:]}")
            print(f"# rail {r}: {(out.strip().splitlines() or [''])[-1][:200]}")
        after, t_after = {i: thread_work(c, i) for i in (1, 2)}, time.monotonic()
        scale = (t_after - t_before) / (t_idle1 - t_idle0)
        for i in (1, 2):
            for r in range(nr):
                b, a = before[i].get(r, (0, 0, 0)), after[i].get(r, (0, 0, 0))
                fast, deferred, slow = (y - x for x, y in zip(b, a))
                _, idle_deferred, idle_slow = (y - x for x, y in zip(idle0[i].get(r, (0, 0, 0)),
                                                                     idle1[i].get(r, (0, 0, 0))))
                # What the stream added beyond the idle rate over as long.
                more_slow = max(0.0, slow - 1.5 * idle_slow * scale - 5)
                more_deferred = max(0.0, deferred - 1.5 * idle_deferred * scale - 5)
                ok &= check(fast > 0 and more_slow * 4 <= fast and more_deferred * 4 <= fast,
                            f"rails at once: node {i}'s rail {r} thread moved its stream under its rail's lock "
                            f"alone ({fast} events so, {deferred} left to the usual way, every lock taken "
                            f"{slow} times; idle, over as long: {idle_deferred * scale:.0f} left, every lock "
                            f"{idle_slow * scale:.0f} times)")
    finally:
        for p in srvs:
            p.kill()
            p.wait()
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--rails", default="127.0.0.1 127.0.1.1")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--base-port", type=int, default=7690)
    ap.add_argument("--want-nodes", type=int, default=0)
    args = ap.parse_args()
    rails = args.rails.split()
    nr = len(rails)
    args.addrs = rails[0]
    # Keepalives are the other rails' traffic while one carries a channel: keep them rare.
    args.nodes, args.qps, args.ka_interval, args.ka_timeout = 3, 2, 2000, 15000
    payload = (8 << 20) if args.transport == "tcp" else (1 << 20)  # Python under TCG is slow
    nodes = machine_nodes(args.want_nodes, f"; rails {rails}")
    if nodes is None:
        return 1
    rails_list = ", ".join(f'"{a}"' for a in rails[1:])
    args.node_extra = {i: f"rails = [ {rails_list} ]; " for i in range(1, args.nodes + 1)}
    # The subject is meshd's rail threads moving channels' data: with cluster.app_send (on by
    # default) the applications would post their own writes and those threads would see none.
    args.cluster_extra = '  app_send = "off";\n'
    workdir = tempfile.mkdtemp(prefix="rails-test-")
    c = Cluster(args, workdir)
    ok = True
    li = None
    try:
        for i in c.nodes:
            c.start(i)

        def up():
            for i in c.nodes:
                ls = c.links(i)
                if not ls or len(ls) != args.nodes - 1 or \
                        any(l["state"] != "UP" or l["qps"] != args.qps * nr for l in ls.values()):
                    return False
            return True
        ok &= check(wait_until(up, 90), f"3 meshd, every link UP with {args.qps} QPs on each of {nr} rails")
        bad = [(i, p, l.get("rails"), l.get("rails_up")) for i in c.nodes for p, l in (c.links(i) or {}).items()
               if l.get("rails") != nr or l.get("rails_up") != nr]
        ok &= check(not bad, f"meshctl links: every link has {nr} rails, {nr} of them up", str(bad))
        # meshctl ping: a round trip on each rail's own QPs, and on the one rail -r names
        for extra, want in (([], list(range(nr))), (["-r", str(nr - 1)], [nr - 1])):
            r = subprocess.run([c.bin("meshctl"), "-j", "-s", c.nodes[1]["sock"], "ping", "2", "-c", "3", "-i", "0.2",
                                "-W", "20", *extra], capture_output=True, text=True, timeout=120)
            try:
                j = json.loads(r.stdout)
            except ValueError:
                j = {}
            got = sorted(x["rail"] for x in j.get("rails", []))
            ok &= check(r.returncode == 0 and got == want and len(j.get("replies", [])) == 3 * len(want) and
                        all(x["sent"] == 3 and x["received"] == 3 for x in j["rails"]),
                        f"meshctl ping 2 {' '.join(extra)}: three answers on each of rails {want}",
                        r.stdout[-500:] + r.stderr[-300:])

        # ---- a device per rail ----
        devs = {}
        for i in c.nodes:
            j = c.ctl(i, "node") or {}
            mine = [d for d in j.get("devices", []) if d["provider"] == args.transport]
            ok &= check(sorted(d["rail"] for d in mine) == list(range(nr)) and
                        all(d["address"] == rails[d["rail"]] for d in mine),
                        f"node {i}: meshctl node lists a {args.transport} device per rail, with its address",
                        str(mine))
            devs[i] = {d["rail"]: d for d in mine}
            # a data-path thread per rail, named after its device, where meshctl says (and the kernel)
            ths = {t["rail"]: t for t in j.get("threads", [])}
            for r in range(nr):
                t = ths.get(r, {})
                try:
                    comm, allowed = thread_status(c.nodes[i]["proc"].pid, t.get("tid", 0))
                except (OSError, StopIteration):
                    comm, allowed = None, None
                dev = devs[i].get(r, {})
                ok &= check(t and comm == t["name"] == "dp-" + dev.get("name", "?")[:12] and
                            allowed == cpus(t["cpus"]) and dev.get("name", "?") in t["devices"],
                            f"node {i}: rail {r}'s data-path thread {t.get('name')} serves {t.get('devices')}, "
                            f"runs on CPUs {t.get('cpus')} (/proc: {comm}, {allowed and sorted(allowed)})")
                if len(nodes) > 1 and dev.get("numa_node", -1) >= 0:
                    k = dev["numa_node"]
                    ok &= check(t["numa_node"] == k and allowed == node_cpus(k),
                                f"node {i}: rail {r}'s thread is pinned to its device's node {k}, CPUs "
                                f"{sorted(node_cpus(k))}")
        dev_names = [devs[1].get(r, {}).get("name", "?") for r in range(nr)]
        dev_nodes = [devs[1].get(r, {}).get("numa_node", -1) for r in range(nr)]
        print(f"# rails' devices {dev_names} on NUMA nodes {dev_nodes}")
        spread = len(set(dev_nodes)) == nr and min(dev_nodes) >= 0
        if args.want_nodes:
            ok &= check(spread and len(set(dev_names)) == nr,
                        f"each rail has its own device on its own NUMA node ({dev_names}, {dev_nodes})")

        def counters():
            if args.transport == "tcp":
                return [tcp_bytes(a, [nd["port"] for nd in c.nodes.values()]) for a in rails]
            return [rdma_pkts(d) for d in dev_names]

        # ---- a channel on each rail, asked for ----
        li = meshring.Listener(c.nodes[2]["sock"], PORT)
        for r in range(nr):
            before = counters()
            a = meshring.connect(c.nodes[1]["sock"], 2, PORT, ring_size=1 << 20, rail=r)
            b = li.accept()
            data = random.randbytes(payload)
            t0 = time.monotonic()
            got = pump(a, b, data, timeout=120)
            ok &= check(got == data, f"rail {r}: {payload >> 20} MiB through the channel, intact "
                        f"({time.monotonic() - t0:.1f} s)", f"{len(got)} bytes arrived; sender ring tx_prod "
                        f"{a.tx_prod} tx_cons {a.u64(meshring.OFF_TX_CONS)}; channels "
                        f"{find_channel(c, 1, PORT)} / {find_channel(c, 2, PORT)}")
            ch1, ch2 = find_channel(c, 1, PORT), find_channel(c, 2, PORT)
            ok &= check(ch1 and ch2 and ch1.get("rail", 0) == r and ch2.get("rail", 0) == r and
                        ch1["device"] == dev_names[r] and ch2["device"] == devs[2][r]["name"],
                        f"rail {r}: meshctl channels shows rail {r} and device {dev_names[r]} on both ends",
                        f"{ch1} / {ch2}")
            after = counters()
            if None in before or None in after:
                why = "a device has no hw_counters/sent_pkts in sysfs"
                if os.environ.get("MESH_REQUIRE_RDMA") == "1":  # the VM, and CI: no silent skip
                    ok &= check(False, f"rail {r}: the devices' counters are readable", why)
                else:
                    print(f"skip rail {r}: which device carried the bytes is not checked: {why}")
            else:
                grew = [y - x for x, y in zip(before, after)]
                # tcp: bytes; rdma: packets of at most one MTU (>= 1024 bytes)
                need = payload if args.transport == "tcp" else payload // 4096
                ok &= check(grew[r] >= need and all(g < grew[r] // 4 for k, g in enumerate(grew) if k != r),
                            f"rail {r}: the bytes crossed rail {r}'s device, not the others (counters grew {grew})")
            a.close()
            b.close()
            wait_until(lambda: not find_channel(c, 1, PORT), 10)

        r = meshring.connect_reply(c.nodes[1]["sock"], 2, PORT, has_rail=1, rail=nr)
        ok &= check(r.status == -22 and "rail" in r.error, f"rail {nr} of {nr}: -EINVAL ({r.status} {r.error})")

        # ---- the default: the device nearest the hint, else nearest the connecting thread ----
        for k in nodes:
            want = dev_nodes.index(k) if spread and k in dev_nodes else 0
            a = meshring.connect(c.nodes[1]["sock"], 2, PORT, caller_node=k)
            b = li.accept()
            ch = find_channel(c, 1, PORT)
            ok &= check(ch and ch.get("rail", 0) == want,
                        f"caller on node {k}, no hint: rail {want} ({ch and ch.get('device')})")
            if spread:
                pages = a.page_nodes([0, a.tx_off, a.rx_off])
                ok &= check(ch and ch["numa_want"] == k and pages == [k] * 3,
                            f"caller on node {k}: rings on node {k}, asked of the kernel ({pages})")
            a.close()
            b.close()
            wait_until(lambda: not find_channel(c, 1, PORT), 10)
            if len(nodes) > 1:
                other = [n for n in nodes if n != k][0]
                a = meshring.connect(c.nodes[1]["sock"], 2, PORT, caller_node=other, numa=k)
                b = li.accept()
                ch = find_channel(c, 1, PORT)
                ok &= check(ch and ch.get("rail", 0) == want and ch["numa_want"] == k,
                            f"caller on node {other}, hint {k}: the hint wins, rail {want}, rings on {k}")
                a.close()
                b.close()
                wait_until(lambda: not find_channel(c, 1, PORT), 10)
        for r in range(nr):
            ok &= kicks_on_own_rail(c, li, r, nr)
        li.close()
        li = None

        # ---- through libmesh: meshbench's thread pinned to a node picks that node's device ----
        bench = os.path.join(args.build, "meshlib", "meshbench")
        srv = subprocess.Popen([bench, "-s", c.nodes[2]["sock"], "-l", str(PORT + 1)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(0.5)
            for k in nodes:
                want = dev_nodes.index(k) if spread and k in dev_nodes else 0
                cl = subprocess.Popen(["taskset", "-c", ",".join(map(str, sorted(node_cpus(k)))), bench,
                                       "-s", c.nodes[1]["sock"], "-t", "lat", "-D", "3", "-c", "2", str(PORT + 1)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                seen = wait_until(lambda: find_channel(c, 1, PORT + 1), 20)
                out, err = cl.communicate(timeout=120)
                ok &= check(cl.returncode == 0 and seen and seen.get("rail", 0) == want,
                            f"meshbench on node {k}'s CPUs: rail {want}, every byte checked",
                            f"exit {cl.returncode}, channel {seen}, {err.strip()[-300:]}")
            cl = subprocess.run([bench, "-s", c.nodes[1]["sock"], "-R", str(nr - 1), "-c", "-n", "200",
                                 "-m", "64K", "2", str(PORT + 1)], capture_output=True, text=True, timeout=120)
            ok &= check(cl.returncode == 0, f"meshbench -R {nr - 1} -c: every byte checked",
                        cl.stderr.strip()[-300:])
            cl = subprocess.run([bench, "-s", c.nodes[1]["sock"], "-R", str(nr), "-n", "10", "2", str(PORT + 1)],
                                capture_output=True, text=True, timeout=60)
            ok &= check(cl.returncode != 0 and "rail" in cl.stderr,
                        f"meshbench -R {nr}: refused and says why ({cl.stderr.strip()[-200:]})")
        finally:
            srv.kill()
            srv.wait()
        ok &= rails_at_once(args, c, bench, nr)

        for i in c.nodes:
            with open(c.nodes[i]["log"]) as f:
                errs = [ln for ln in f if " ERROR " in ln or "error:" in ln.lower()]
            ok &= check(not errs, f"node {i}: no error in the meshd log", "".join(errs[:5]))
    except Exception as e:  # a crash is a failure with its reason, not a traceback in CI's log only
        import traceback
        traceback.print_exc()
        ok = check(False, f"the test ran to its end ({e!r})")
    finally:
        if li:
            li.close()
        ok &= c.stop_all()
        if not ok:
            c.dump_logs()
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
