#!/usr/bin/env python3
"""Link formation with and without the cluster key: what the proof costs.

Starts N meshd (default 16) on one address and N ports, all at once, and measures
  * full mesh: from the start of the processes until the last link came UP (once meshctl shows
    every link UP, each link's time in its state dates its UP to the millisecond);
  * per link: the attempt's own time from its first dial to UP, as each meshd logs it ("link to
    node X UP: ..., N ms"), over all N*(N-1) link ends;
in interleaved rounds (keyed and unkeyed alternate, the order swapped each round) so that a slow
spell of a shared machine hits both alike. Prints medians, ranges and the keyed/unkeyed ratios.
Figures are reported, never asserted; exits 1 only when a mesh does not form or a meshd fails.

With --raw-cm (rdma only) each round also forms the same mesh without meshd: N cm_mesh processes
(tests/bench/cm_mesh.c: rdma_cm and verbs alone, the higher id dialling the lower with the same QPs
per link, the same retry backoff, no Hello, no key, no admission limit), and the ratios of meshd's
full mesh to it are printed (the latency issue's goal: at most 2x for 64 nodes).

  tests/bench/formation.py --build build [--nodes 16] [--rounds 3] [--transport tcp|rdma]
                           [--max-handshakes N] [--progress SEC] [--only keyed|unkeyed] [--hold SEC]
                           [--raw-cm] [--polling adaptive|busy|event] [--storm-probe]
The timed rounds run unobserved (only the logs are read); --storm-probe forms the mesh once more
with the control socket asked ten times a second throughout, from a normal and a real-time client
(the issue's goal: an answer within 100 ms whatever the handshake load), and with --hold every
formed mesh is held that long, its control socket timed. A mesh that does not form is diagnosed:
the link ends not UP with their last errors, the attempt failures the logs name, the meshd's CPU
time.
"""
import argparse
import concurrent.futures
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

WATCH_S = 0.25  # how often an unprobed round reads the logs (see run_once)
UP_RE = re.compile(r"link to node \d+ UP: .*, (\d+) ms$")


FAIL_RE = re.compile(r"link to node (\d+): attempt epoch \d+ failed \(\d+ before it\): (.*)$")
REJECT_RE = re.compile(r"(refused|rejected) .*?: (.*)$")


class LogWatch:
    """Link ends UP over all meshd, as their logs say it (UP and DOWN lines), read as they grow."""
    LINE_RE = re.compile(r"link to node (\d+) (UP|DOWN):")

    def __init__(self, logs):
        self.files = {i: open(path) for i, path in logs.items()}
        self.up = {i: set() for i in logs}
        self.rest = {i: "" for i in logs}

    def poll(self):
        for i, f in self.files.items():
            data = self.rest[i] + f.read()
            lines = data.split("\n")
            self.rest[i] = lines.pop()
            for line in lines:
                m = self.LINE_RE.search(line)
                if m:
                    (self.up[i].add if m.group(2) == "UP" else self.up[i].discard)(int(m.group(1)))
        return sum(len(u) for u in self.up.values())


class CtlProbe(threading.Thread):
    """Asks a few meshd for their node (the request meshctl node sends: CtlRequest version 1, object
    NODE) over their control sockets, one after the other, every 100 ms, and keeps how long each
    answer took (connect, request, reply; no process start): the control socket must answer within
    100 ms whatever the handshake load."""
    REQ = bytes([0x08, 0x01, 0x10, 0x02])

    def __init__(self, socks, fifo=False):
        super().__init__(daemon=True)
        self.socks, self.lat, self.errors, self.stop = socks, [], 0, threading.Event()
        # fifo: this thread at SCHED_FIFO 1, as meshd's control thread (cluster.control_priority):
        # a client that is itself never kept from a CPU times the socket alone; the other probe,
        # at normal priority, times what an ordinary meshctl also waits for.
        self.fifo, self.fifo_err = fifo, None
        self.snapshots = 0
        self.slow, self.t0 = [], time.monotonic()
        self.pids, self.states = None, {}
        # The real-time probe also counts the page faults the answering control thread took
        # during each request (a fault waits for the process's mmap lock, which QP creation holds).
        self.ctl_tids, self.faulted, self.faults = {}, 0, 0

    def run(self):
        if self.fifo:
            try:
                os.sched_setscheduler(threading.get_native_id(), os.SCHED_FIFO, os.sched_param(1))
            except OSError as e:
                self.fifo_err = e.strerror
        i = 0
        while not self.stop.is_set():
            path = self.socks[i % len(self.socks)]
            i += 1
            t = time.monotonic()
            f0 = self.ctl_faults(path)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as c:
                    c.settimeout(30)
                    c.connect(path)
                    c.send(self.REQ)
                    # The real-time probe looks sooner: its answers are short, a wait is rare.
                    c.settimeout(0.05 if self.fifo else 0.2)
                    got = None
                    while got is None and time.monotonic() - t < 30:
                        try:
                            got = c.recv(65536)
                        except socket.timeout:
                            self.sample(path)
                    if got:
                        self.lat.append(time.monotonic() - t)
                        f1 = self.ctl_faults(path)
                        df = f1 - f0 if f0 is not None and f1 is not None else None
                        if df:
                            self.faulted += 1
                            self.faults += df
                        # NodeInfo.from_snapshot (field 30, true): the data path was busy, the
                        # control thread answered from its snapshot (a byte match, for the record).
                        self.snapshots += b"\xf0\x01\x01" in got
                        if self.lat[-1] > 0.1:
                            self.slow.append((t - self.t0, self.lat[-1], path, t, df))
            except OSError:
                self.errors += 1  # not listening yet at the start, or gone at the end
            self.stop.wait(0.1)

    def ctl_faults(self, path):
        """Page faults (minor + major) the control thread of the meshd behind path has taken, or
        None (no pids, not started yet, gone)."""
        pid = self.pids.get(path) if self.fifo and self.pids else None
        if not pid:
            return None
        try:
            tid = self.ctl_tids.get(pid)
            if tid is None:
                for t in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{t}/comm") as f:
                        if f.read().strip() == "ctl":
                            tid = self.ctl_tids[pid] = t
                            break
            if tid is None:
                return None
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            return int(rest[7]) + int(rest[9])
        except (OSError, IndexError, ValueError):
            return None

    def sample(self, path):
        """What the meshd behind path is doing while it keeps a request waiting: each thread's
        state (R runnable, S sleeping, D in the kernel) and where it waits (its kernel stack). The
        real-time probe looks at the control thread alone (meshd names it ctl), more deeply."""
        pid = self.pids.get(path) if self.pids else None
        if not pid:
            return
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    name, rest = f.read().split("(", 1)[1].rsplit(")", 1)
                    st = rest.split()[0]
                if self.fifo and name != "ctl":
                    continue
                depth = 8 if self.fifo else 4
                try:
                    with open(f"/proc/{pid}/task/{tid}/stack") as f:
                        stack = [l.split()[1].split("+")[0] for l in f.read().splitlines()[:depth]]
                except OSError:
                    stack = []
                key = (name + " " if self.fifo else "") + st + " " + " < ".join(stack)
                self.states[key] = self.states.get(key, 0) + 1
        except OSError:
            pass

    def summary(self):
        self.stop.set()
        self.join(timeout=35)
        return self.report()

    def report(self):
        who = ("" if not self.fifo else "probe at SCHED_FIFO 1, " if not self.fifo_err
               else f"probe at normal priority (SCHED_FIFO refused: {self.fifo_err}), ")
        if not self.lat:
            return f"control socket ({who}node request): no answer ({self.errors} failed)"
        v = sorted(self.lat)
        over = sum(1 for x in v if x > 0.1)
        return (f"control socket ({who}node request, {len(v)} answers, {self.snapshots} from the snapshot): "
                f"median {statistics.median(v) * 1000:.0f} ms, "
                f"p90 {v[int(0.9 * (len(v) - 1))] * 1000:.0f} ms, max {v[-1] * 1000:.0f} ms, {over} over 100 ms"
                + ("" if not self.slow else " (asked at " + ", ".join(
                    f"{t:.1f} s: {l * 1000:.0f} ms" + (f", {df} page faults" if df else "")
                    for t, l, _, _, df in self.slow[:12]) + ")")
                + ("" if not self.fifo or not self.pids else
                   f"; the control thread took page faults in {self.faulted} answers ({self.faults} in all)")
                + ("" if not self.states else "\n      meshd threads while a request waited (state, kernel stack): "
                   + "; ".join(f"{v}x {k}" for k, v in sorted(self.states.items(), key=lambda kv: -kv[1])[:8])))


class ProcProbe:
    """A CtlProbe at SCHED_FIFO 1 in a process of its own: a thread of this script would share
    Python's lock with the threads that read logs and run meshctl, and wait for whichever of them
    the kernel preempted while holding it. With pids, it samples the control thread of a meshd
    that keeps it waiting."""

    def __init__(self, socks, pids=None):
        self.socks, self.stop, self.pids = socks, multiprocessing.Event(), pids
        self.rx, tx = multiprocessing.Pipe(duplex=False)
        self.proc = multiprocessing.Process(target=ProcProbe.child, args=(socks, self.stop, tx, pids), daemon=True)
        self.cpus = sorted(os.sched_getaffinity(0))

    @staticmethod
    def child(socks, stop, tx, pids):
        p = CtlProbe(socks, fifo=True)
        p.stop, p.pids = stop, pids
        p.run()
        tx.send((p.lat, p.errors, p.snapshots, p.slow, p.fifo_err, p.states, p.faulted, p.faults))

    @staticmethod
    def canary(stop, tx, cpu):
        """The machine's own floor: a SCHED_FIFO 1 process pinned to one CPU that only sleeps 10 ms
        at a time, and when it woke over 100 ms late (cyclictest's measure, coarse), one per CPU: a
        vCPU the emulator's host did not run stalls the threads on it alone, and one canary for
        the machine saw only the stalls of the CPU it happened to be on. If the probe's slow
        answers fall at the same moments, the machine stalled, not meshd."""
        err, late, t0, n = None, [], time.monotonic(), 0
        try:
            os.sched_setaffinity(0, {cpu})
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError as e:
            err = e.strerror
        while not stop.is_set():
            t = time.monotonic()
            time.sleep(0.01)
            n += 1
            over = time.monotonic() - t - 0.01
            if over > 0.1:
                late.append((t - t0, over, t + 0.01))
        tx.send((n, late, err))

    def start(self):
        self.proc.start()
        self.canaries = []
        for cpu in self.cpus:
            crx, ctx = multiprocessing.Pipe(duplex=False)
            cp = multiprocessing.Process(target=ProcProbe.canary, args=(self.stop, ctx, cpu), daemon=True)
            cp.start()
            self.canaries.append((cpu, crx, cp))

    def is_alive(self):
        return self.proc.is_alive()

    def summary(self):
        self.stop.set()
        p = CtlProbe(self.socks, fifo=True)
        p.pids = self.pids
        if self.rx.poll(40):
            p.lat, p.errors, p.snapshots, p.slow, p.fifo_err, p.states, p.faulted, p.faults = self.rx.recv()
        self.proc.join(timeout=5)
        parts, stalls = [], []
        for cpu, crx, cp in self.canaries:
            if not crx.poll(10):
                parts.append(f"CPU {cpu}: no report")
                continue
            n, late, err = crx.recv()
            stalls += [(w, w + x) for _, x, w in late]
            parts.append(f"CPU {cpu}: {len(late)} of {n}" + (f" ({err})" if err else "")
                         + ("" if not late else ", max " + f"{max(x for _, x, _ in late) * 1000:.0f} ms (at " + ", ".join(
                             f"{t:.1f} s: {x * 1000:.0f} ms" for t, x, _ in late[:8]) + ")"))
            cp.join(timeout=5)
        canary = ("canaries (a process per CPU at SCHED_FIFO 1 sleeping 10 ms): wake-ups over 100 ms late: "
                  + "; ".join(parts))
        if p.slow:
            # A slow answer [asked, answered] during which some CPU was not running its canary.
            both = sum(1 for _, lat, _, t, _ in p.slow if any(s < t + lat and t < e for s, e in stalls))
            canary += f"; {both} of the {len(p.slow)} answers over 100 ms overlap a CPU's stall"
        return p.report() + "; " + canary


STOP_TIMEOUT_S = 90


def stop_all(procs, what=None):
    """SIGTERM to every process still running, then SIGKILL to any that did not exit within
    STOP_TIMEOUT_S of it, one deadline for all. 64 meshd stopping at once in the VM tear down 8,000
    QPs of an emulated device together: on a loaded machine (one core taken by other work) that took
    node 1, the first waited for, past the 15 s each process used to get (issue 42). With what (a
    name), says how long the stop took and which were killed."""
    t0 = time.monotonic()
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    killed = []
    for i, p in procs.items():
        try:
            p.wait(timeout=max(0.1, t0 + STOP_TIMEOUT_S - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            killed.append(i)
    if what:
        took = time.monotonic() - t0
        print(f"    stop: {len(procs)} {what} exited {took:.1f} s after SIGTERM"
              + (f"; killed after {STOP_TIMEOUT_S} s: {killed}" if killed else ""), flush=True)


def confirm_up(a, meshctl, socks):
    """Every meshd's links through meshctl (four at a time): None while any link end is not UP,
    else when each meshd's last link came UP (time.monotonic), from the links' time in their
    state."""
    def ask(i):
        r = subprocess.run([meshctl, "-j", "-L", "-s", socks[i], "links"], capture_output=True, text=True)
        now = time.monotonic()
        if r.returncode != 0:
            return None
        links = json.loads(r.stdout)["links"]
        if len(links) != a.nodes - 1 or any(l["state"] != "UP" for l in links):
            return None
        return now - min(l["state_ms"] for l in links) / 1000.0

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        ups = list(pool.map(ask, socks))
    return None if None in ups else ups


def cpu_seconds(procs, split=False):
    """User + system CPU of the meshd so far, from /proc (what the formation costs the machine); with
    split, the pair (user, system)."""
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0
    for p in procs.values():
        try:
            with open(f"/proc/{p.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            user += int(fields[11])
            system += int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return (user / tick, system / tick) if split else (user + system) / tick


def machine_cpu():
    """The machine's CPU time so far from /proc/stat, in seconds: user (with nice), system, softirq
    (where Soft-RoCE does most of its work) and idle."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:8]]
    tick = os.sysconf("SC_CLK_TCK")
    return {"user": (v[0] + v[1]) / tick, "sys": v[2] / tick, "idle": (v[3] + v[4]) / tick,
            "irq": (v[5] + v[6]) / tick}


def cpu_since(c0):
    """What the machine did since machine_cpu() gave c0, as a short line."""
    c1 = machine_cpu()
    d = {k: c1[k] - c0[k] for k in c0}
    busy = d["user"] + d["sys"] + d["irq"]
    return (f"machine CPU {busy:.1f} s busy (user {d['user']:.1f}, sys {d['sys']:.1f}, softirq {d['irq']:.1f}), "
            f"idle {d['idle']:.1f} s")


def diagnose(a, procs, socks, logs):
    """Why a mesh did not form: the meshd short of links, what each waits on, the failures logged."""
    meshctl = os.path.join(a.build, "node", "meshctl")
    short = []
    for i in procs:
        r = subprocess.run([meshctl, "-j", "-L", "-s", socks[i], "links"], capture_output=True, text=True)
        if r.returncode != 0:
            short.append(f"node {i}: meshctl failed: {r.stderr.strip()}")
            continue
        for l in json.loads(r.stdout)["links"]:
            if l.get("state") != "UP":
                short.append(f"node {i} -> {l.get('peer')}: {l.get('state')} for {l.get('state_ms')} ms, "
                             f"last error: {l.get('last_error') or '-'}")
    print(f"  link ends not UP: {len(short)}", flush=True)
    for line in short[:40]:
        print(f"    {line}")
    reasons = {}
    for i in procs:
        with open(logs[i]) as f:
            for line in f:
                m = FAIL_RE.search(line.strip())
                if m:
                    key = re.sub(r"\d+", "N", m.group(2))
                    reasons[key] = reasons.get(key, 0) + 1
    print("  attempt failures logged (numbers as N; meshd logs the 1st, 2nd, 4th, 8th... of a link):")
    for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:12]:
        print(f"    {v:6}  {k}")
    print(f"  meshd CPU: {cpu_seconds(procs):.1f} s in all", flush=True)


def start_probes(socks, procs=None):
    """A CtlProbe and a ProcProbe on every eighth meshd's control socket, started; with procs, each
    samples what a meshd keeping a request waiting is doing (the ProcProbe: its control thread)."""
    probe = CtlProbe([socks[i] for i in list(socks)[:: max(1, len(socks) // 8)]])
    if procs:
        probe.pids = {socks[i]: procs[i].pid for i in procs}
    probe_rt = ProcProbe(probe.socks, probe.pids)
    probe.start()
    probe_rt.start()
    return probe, probe_rt


def hold(a, procs, socks, watch):
    """The full mesh held for a.hold seconds: every link stays UP (no DOWN in any log), what the
    idle mesh costs (meshd CPU per second) and how fast the control socket answers meanwhile."""
    meshctl = os.path.join(a.build, "node", "meshctl")
    c0, t0 = cpu_seconds(procs), time.monotonic()
    probe, probe_rt = start_probes(socks)
    lat = []
    while time.monotonic() - t0 < a.hold:
        for i in list(procs)[:: max(1, len(procs) // 8)]:
            s = time.monotonic()
            r = subprocess.run([meshctl, "-j", "-L", "-s", socks[i], "node"], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"meshctl node on meshd {i} failed while held: {r.stderr.strip()}")
            lat.append(time.monotonic() - s)
        time.sleep(1)
    c1, t1 = cpu_seconds(procs), time.monotonic()
    up = watch.poll()
    if up != a.nodes * (a.nodes - 1):
        raise RuntimeError(f"only {up} of {a.nodes * (a.nodes - 1)} link ends UP after holding {a.hold} s")
    lat.sort()
    print(f"  held {t1 - t0:.0f} s, every link UP: meshd CPU {(c1 - c0) / (t1 - t0):.2f} s per s in all, "
          f"meshctl node median {statistics.median(lat) * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms "
          f"({len(lat)} calls, process start included); {probe.summary()}; {probe_rt.summary()}", flush=True)


def run_once(a, work, keyed, round_no, probed=False, may_hold=True):
    """One formation of meshd. With probed, the control socket is timed throughout (CtlProbe and
    ProcProbe); else nothing but the logs is watched, and those every WATCH_S: the formation is
    bound by CPU here, and the probes (Python threads and processes asking ten times a second, a
    real-time canary waking a hundred times) made it about a tenth slower in the VM, a cost the raw
    rdma_cm round does not pay. When the last link came UP is read from the links' own clocks, so
    how often the logs are read changes only when the round ends, not its time."""
    conf = os.path.join(work, f"mesh-{'key' if keyed else 'nokey'}.conf")
    with open(conf, "w") as f:
        f.write('cluster = {\n  name = "formation";\n'
                f'  transport = "{a.transport}";\n  qps_per_link = {a.qps};\n'
                '  keepalive_interval_ms = 1000;\n  keepalive_timeout_ms = 20000;\n'
                '  connect_timeout_ms = 4000;\n  handshake_timeout_ms = 30000;\n'
                f'  max_handshakes = {a.max_handshakes or a.nodes};\n  backoff_initial_ms = 50;\n  backoff_max_ms = 1000;\n'
                f'  log_level = "info";\n  polling = "{a.polling}";\n'
                + ('  key_file = "cluster.key";\n' if keyed else '') + '};\nnodes = (\n'
                + ",\n".join(f'  {{ id = {i}; addr = "{a.addr}"; port = {a.base_port + i}; }}'
                             for i in range(1, a.nodes + 1)) + "\n);\n")
    procs, logs, socks = {}, {}, {}
    meshd = os.path.join(a.build, "node", "meshd")
    meshctl = os.path.join(a.build, "node", "meshctl")
    t0, c0 = time.monotonic(), machine_cpu()
    for i in range(1, a.nodes + 1):
        socks[i] = os.path.join(work, f"r{round_no}-{int(keyed)}-{i}.sock")
        logs[i] = os.path.join(work, f"r{round_no}-{int(keyed)}-{i}.log")
        with open(logs[i], "w") as lf:
            procs[i] = subprocess.Popen([meshd, "-c", conf, "-n", str(i), "-s", socks[i]],
                                        stdin=subprocess.DEVNULL, stdout=lf, stderr=lf)
    full = None
    next_progress = t0 + a.progress if a.progress else float("inf")
    probes = ()
    if probed:
        probes = start_probes(socks, procs)
    try:
        deadline = t0 + a.timeout
        watch = LogWatch(logs)
        while time.monotonic() < deadline:
            for i in procs:
                if procs[i].poll() is not None:
                    raise RuntimeError(f"meshd {i} exited with {procs[i].returncode}")
            # The logs say when every link end may be UP (reading files costs the meshd nothing; a
            # meshctl per node and poll would, under the emulator); meshctl's links then confirm,
            # and each link's time in its state dates its UP exactly, so when the last one came
            # UP does not depend on how long the confirmation takes. Four meshctl at a time: one
            # after the other (a node and a links request per meshd, each a process start under
            # the emulator) they took 77-83 s of each 64-node round in the VM.
            full = None
            if watch.poll() == a.nodes * (a.nodes - 1):
                ups = confirm_up(a, meshctl, socks)
                if ups is not None:
                    full = max(ups) - t0
            if full is not None:
                print(f"    meshd: {cpu_since(c0)}; meshd processes {cpu_seconds(procs):.1f} s", flush=True)
                for p in probes:
                    print(f"    during formation, {p.summary()}", flush=True)
                if a.hold and may_hold:
                    hold(a, procs, socks, watch)
                break
            if time.monotonic() >= next_progress:
                next_progress += a.progress
                u, sy = cpu_seconds(procs, split=True)
                print(f"  {time.monotonic() - t0:6.1f} s: {watch.poll()} of {a.nodes * (a.nodes - 1)} "
                      f"link ends UP, meshd CPU {u + sy:.1f} s (user {u:.1f}, sys {sy:.1f}); {cpu_since(c0)}",
                      flush=True)
            time.sleep(0.05 if probed else WATCH_S)
        if full is None:
            diagnose(a, procs, socks, logs)
            raise RuntimeError(f"no full mesh within {a.timeout} s")
    finally:
        for p in probes:
            if p.is_alive():
                p.summary()
        stop_all(procs, "meshd")
        if a.keep_logs:
            shutil.copytree(work, a.keep_logs, ignore=shutil.ignore_patterns("*.sock"), dirs_exist_ok=True)
    bad = {i: p.returncode for i, p in procs.items() if p.returncode != 0}
    if bad:
        raise RuntimeError(f"meshd did not stop cleanly on SIGTERM (exit statuses {bad})")
    per_link = []
    for i in procs:
        with open(logs[i]) as f:
            for line in f:
                m = UP_RE.search(line.strip())
                if m:
                    per_link.append(int(m.group(1)))
    return full, per_link


def run_raw(a, round_no):
    """The same mesh formed by cm_mesh processes: seconds from their start until the last one has all
    its connections (each prints the CLOCK_MONOTONIC time it had them, the clock of time.monotonic)."""
    tool = os.path.join(a.build, "tests", "bench", "cm_mesh")
    port = a.base_port + 2000 + 100 * (round_no % 2)
    procs = {}
    t0, c0 = time.monotonic(), machine_cpu()
    for i in range(1, a.nodes + 1):
        procs[i] = subprocess.Popen([tool, "-n", str(i), "-N", str(a.nodes), "-a", a.addr, "-p", str(port), "-q",
                                     str(a.qps), "-T", str(int(a.timeout))], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done, attempts = {}, 0
    try:
        for i, p in procs.items():
            line = p.stdout.readline()
            if not line:
                p.wait(timeout=10)
                raise RuntimeError(f"cm_mesh {i} exited with {p.returncode}: {p.stderr.read().strip()[:300]}")
            j = json.loads(line)
            done[i] = j["mono_ms"] / 1000.0
            attempts += j["attempts"]
        print(f"    raw cm: {cpu_since(c0)}; cm_mesh processes {cpu_seconds(procs):.1f} s", flush=True)
    finally:
        stop_all(procs)
    return max(done.values()) - t0, attempts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--qps", type=int, default=2)
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--addr", default="127.0.0.1")
    ap.add_argument("--base-port", type=int, default=17800)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--max-handshakes", type=int, default=0, help="cluster.max_handshakes (default: the node count)")
    ap.add_argument("--polling", default="adaptive", choices=("adaptive", "busy", "event"),
                    help="cluster.polling of every meshd (default adaptive, meshd's own default)")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy the meshd logs here after each formation (a VM's shared folder)")
    ap.add_argument("--progress", type=float, default=0, help="print link ends UP every this many seconds")
    ap.add_argument("--only", choices=("keyed", "unkeyed"), help="one kind of round only (no ratio)")
    ap.add_argument("--raw-cm", action="store_true",
                    help="rdma: also form the mesh with cm_mesh (rdma_cm alone) in every round, and print the ratio")
    ap.add_argument("--hold", type=float, default=0,
                    help="keep each full mesh this many seconds: links must stay UP; idle CPU and meshctl latency")
    ap.add_argument("--storm-probe", action="store_true",
                    help="after the timed rounds, form the mesh once more with the control socket timed throughout "
                         "(the timed rounds run unobserved: the probes' CPU would slow them)")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    if a.raw_cm and a.transport != "rdma":
        ap.error("--raw-cm needs --transport rdma (cm_mesh is rdma_cm itself)")
    work = tempfile.mkdtemp(prefix="mesh-formation-")
    key = subprocess.run([os.path.join(a.build, "node", "meshctl"), "keygen"], capture_output=True, text=True,
                         check=True).stdout
    fd = os.open(os.path.join(work, "cluster.key"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    res = {False: ([], []), True: ([], [])}
    raw = []
    try:
        for r in range(a.rounds):
            if a.raw_cm:
                full, attempts = run_raw(a, r)
                raw.append(full)
                print(f"round {r + 1} raw cm : full mesh of {a.nodes} in {full:.2f} s ({attempts} dials, "
                      f"{a.nodes * (a.nodes - 1) // 2 * a.qps} connections)", flush=True)
            kinds = (False, True) if r % 2 == 0 else (True, False)
            for keyed in (k for k in kinds if not a.only or k == (a.only == "keyed")):
                full, links = run_once(a, work, keyed, r)
                res[keyed][0].append(full)
                res[keyed][1].extend(links)
                print(f"round {r + 1} {'keyed  ' if keyed else 'no key '}: full mesh of {a.nodes} in {full:.2f} s, "
                      f"{len(links)} link ends, median {statistics.median(links) if links else 0:.0f} ms", flush=True)
        if a.storm_probe:
            keyed = a.only != "unkeyed"
            full, _ = run_once(a, work, keyed, a.rounds, probed=True, may_hold=False)
            print(f"probed round {'keyed' if keyed else 'no key'}: full mesh of {a.nodes} in {full:.2f} s with the "
                  "control socket timed throughout (not in the figures below)", flush=True)
    except Exception as e:  # noqa: BLE001
        if a.keep_logs:
            shutil.copytree(work, a.keep_logs, ignore=shutil.ignore_patterns("*.sock"), dirs_exist_ok=True)
        print(f"formation: FAILED: {e}; logs in {a.keep_logs or work}")
        return 1

    def raw_ratio(kind, full):
        if raw:
            rm = statistics.median(raw)
            print(f"raw rdma_cm mesh (cm_mesh): full mesh median {rm:.2f} s [{min(raw):.2f}-{max(raw):.2f}]; "
                  f"meshd {kind} / raw: {statistics.median(full) / rm:.2f}x (per round: "
                  + ", ".join(f"{f / r:.2f}" for f, r in zip(full, raw)) + ")")

    if a.only:
        full, links = res[a.only == "keyed"]
        print(f"\nformation of {a.nodes} nodes ({a.only}), {a.qps} QPs per link, {a.transport} on {a.addr}: full mesh "
              f"median {statistics.median(full):.2f} s, per link median {statistics.median(links):.0f} ms")
        raw_ratio(a.only, full)
        shutil.rmtree(work, ignore_errors=True)
        return 0

    def q(v, p):
        v = sorted(v)
        return v[min(len(v) - 1, int(p * len(v)))]

    print(f"\nformation of {a.nodes} nodes, {a.qps} QPs per link, {a.transport} on {a.addr}, {a.rounds} rounds "
          f"(interleaved)")
    print(f"{'':10} {'full mesh (s) median [min-max]':>32} {'per link (ms) median / p90':>28}")
    for keyed in (False, True):
        full, links = res[keyed]
        print(f"{'keyed' if keyed else 'no key':10} {statistics.median(full):>12.2f} [{min(full):.2f}-{max(full):.2f}]"
              f"{'':>10} {statistics.median(links):>12.0f} / {q(links, 0.9):.0f}")
    fk, fn = statistics.median(res[True][0]), statistics.median(res[False][0])
    lk, ln = statistics.median(res[True][1]), statistics.median(res[False][1])
    print(f"ratio keyed/no key: full mesh {fk / fn:.2f}x, per link {lk / ln if ln else float('nan'):.2f}x "
          f"(the issue's bound: the proof may cost at most 10% of formation time)")
    raw_ratio("keyed", res[True][0])
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
