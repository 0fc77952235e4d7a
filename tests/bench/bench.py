#!/usr/bin/env python3
"""The channel benchmark and its references, in one run (driven by run-vm-bench.sh / run-host-bench.sh).

  --mode rdma      inside the Soft-RoCE VM (tests/rdma/rxe-vm): 2 meshd over rdma on one address,
                   ib_write_bw -R / ib_write_lat -R (perftest), rstream (rsocket), TCP over loopback
                   (rstream -T s) and meshbench, all on the same rxe0 device;
  --mode tcp       on this machine: 2 meshd over the tcp provider on 127.0.0.1, TCP over loopback
                   (rstream -T s, else a python socket pair) and meshbench.

Prints one table with every figure and the ratios the project tracks, then a profile of the channel
(meshd's own counters and the CPU time of every process while a bw run is going). Writes raw outputs
and results.json (one JSON object per figure) to --out.

Ratios are reported, never asserted: emulation is noisy. The exit status is 1 when any tool fails to
run or its output cannot be read, 0 otherwise.
"""
import argparse
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
MIB = 1 << 20


class Failure(Exception):
    pass


def fmt_size(n):
    for unit, div in (("MiB", MIB), ("KiB", 1024)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


class Bench:
    def __init__(self, a):
        self.a = a
        self.out = os.path.abspath(a.out)
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="meshbench-")
        self.build = os.path.abspath(a.build)
        self.meshd_procs = {}
        self.results = []
        self.failures = []
        self.ref_failures = []
        self.profiles = []
        self.logf = open(os.path.join(self.out, "bench.log"), "w")
        self.port = 7600
        self.round = None
        self.ratios = []
        self.calibrated = {}
        self.background = []

    # ---- plumbing ----

    def log(self, *parts):
        self.logf.write(" ".join(str(p) for p in parts) + "\n")
        self.logf.flush()

    def say(self, msg):
        print(f"# {msg}", flush=True)
        self.log("#", msg)

    def next_port(self):
        self.port += 1
        return self.port

    def bin(self, rel):
        return os.path.join(self.build, rel)

    def run(self, cmd, timeout, what):
        self.log("$", " ".join(cmd))
        t0 = time.monotonic()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            self.log(e.stdout or "", e.stderr or "")
            raise Failure(f"{what}: no answer within {timeout} s: {' '.join(cmd)}")
        except OSError as e:
            raise Failure(f"{what}: cannot run {cmd[0]}: {e}")
        self.log(r.stdout, r.stderr, f"(exit {r.returncode}, {time.monotonic() - t0:.2f} s)")
        if r.returncode != 0:
            tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-8:])
            raise Failure(f"{what}: exit {r.returncode}: {' '.join(cmd)}\n{tail}")
        return r.stdout

    def start(self, cmd, name):
        path = os.path.join(self.work, name + ".out")
        self.log("$ (background)", " ".join(cmd), ">", path)
        f = open(path, "w")
        try:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True)
        except OSError as e:
            raise Failure(f"{name}: cannot run {cmd[0]}: {e}")
        finally:
            f.close()
        p.out_path = path
        self.background.append(p)
        return p

    def finish(self, p, name, timeout=60):
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = "timeout"
        with open(p.out_path) as f:
            out = f.read()
        self.log(f"[{name} output]", out, f"(exit {rc})")
        if rc != 0:
            tail = "\n".join(out.strip().splitlines()[-8:])
            raise Failure(f"{name}: exit {rc}\n{tail}")
        return out

    def record(self, tool, test, size, **fig):
        r = dict(tool=tool, test=test, size=size, round=self.round, **fig)
        self.results.append(r)
        self.log("result", json.dumps(r))
        return r

    def find(self, tool, test, size):
        for r in self.results:
            if r["tool"] == tool and r["test"] == test and r["size"] == size:
                return r
        return None

    def attempt(self, what, fn, *args):
        """Runs one measurement; a failure is recorded and the others still run."""
        try:
            fn(*args)
        except Failure as e:
            self.failures.append(str(e))
            if not what.startswith(("meshbench", "profile")):
                self.ref_failures.append(str(e))  # a reference tool: perftest, rstream, TCP
            self.say(f"FAILED: {e}")
        finally:
            self.reap()

    def reap(self):
        """Servers left by a failed measurement must not disturb the next one."""
        keep = []
        for p in self.background:
            if p in (getattr(self, "server_proc", None), getattr(self, "server_off_proc", None),
                     getattr(self, "server_app_proc", None)) and p.poll() is None:
                keep.append(p)
            elif p.poll() is None:
                self.log(f"killing leftover pid {p.pid}: {p.args}")
                p.kill()
                p.wait()
        self.background = keep

    # ---- readiness of servers ----

    def wait_tcp_listen(self, port, proc=None, name="server", timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                self.finish(proc, name, 1)  # raises with its output when it failed
                raise Failure(f"{name} exited before listening on TCP port {port}")
            for fn in ("/proc/net/tcp", "/proc/net/tcp6"):
                try:
                    with open(fn) as f:
                        for line in f.readlines()[1:]:
                            parts = line.split()
                            if parts[3] == "0A" and int(parts[1].split(":")[1], 16) == port:
                                return
                except OSError:
                    pass
            time.sleep(0.05)
        raise Failure(f"nothing listens on TCP port {port} after {timeout} s")

    def wait_rdma_listen(self, port, proc, timeout=30):
        """rdma_cm listeners show in `rdma res show cm_id`; without that tool, a fixed pause."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.finish(proc, "server", 1)  # raises with its output when it failed
                raise Failure(f"the server exited before listening on rdma_cm port {port}")
            try:
                r = subprocess.run(["rdma", "-j", "res", "show", "cm_id"], capture_output=True, text=True,
                                   timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                time.sleep(2)
                return
            if r.returncode != 0:
                time.sleep(2)
                return
            try:
                ids = json.loads(r.stdout or "[]")
            except ValueError:
                ids = []
            for cm in ids:
                if cm.get("state") == "LISTEN" and str(cm.get("src-addr", "")).rsplit(":", 1)[-1] == str(port):
                    return
            time.sleep(0.1)
        raise Failure(f"no rdma_cm listener on port {port} after {timeout} s")

    # ---- meshd ----

    def start_mesh(self):
        a = self.a
        conf = os.path.join(self.work, "mesh.conf")
        # Keyed, as a cluster should run: the links prove the key before anything else.
        key = subprocess.run([self.bin("node/meshctl"), "keygen"], capture_output=True, text=True, check=True).stdout
        fd = os.open(os.path.join(self.work, "cluster.key"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key)
        # Two meshes of two meshd each, alike but for cluster.direct_receive: meshd 1 and 2 with it on
        # (the default), meshd 3 and 4 (nodes 1 and 2 of the second) with it off, so that the latency
        # with and without direct receive is measured in the same rounds.
        # A third (meshd 5 and 6) with cluster.app_send on (the default): the applications post
        # their own writes (over rdma on QPs of their own, over tcp on connections of their own), so
        # that the data path without a meshd hop is measured in the same rounds; the first two have
        # it off, so that theirs is the path through meshd.
        confs = {}
        kinds = (("on", a.mesh_port), ("off", a.mesh_port + 2), ("app", a.mesh_port + 4))
        for direct, port in kinds:
            confs[direct] = {"on": conf, "off": os.path.join(self.work, "mesh-direct-off.conf"),
                             "app": os.path.join(self.work, "mesh-app-send.conf")}[direct]
            with open(confs[direct], "w") as f:
                f.write("cluster = {\n  name = \"bench\";\n"
                        f"  transport = \"{a.mode}\";\n  qps_per_link = {a.qps};\n"
                        "  keepalive_interval_ms = 1000;\n  keepalive_timeout_ms = 20000;\n"
                        "  connect_timeout_ms = 4000;\n  handshake_timeout_ms = 30000;\n"
                        f"  polling = \"{a.polling}\";\n  direct_receive = \"{'off' if direct == 'off' else 'on'}\";\n"
                        + f"  app_send = \"{'on' if direct == 'app' else 'off'}\";\n"
                        + (f"  poll_budget_us = {a.poll_budget_us};\n" if a.poll_budget_us is not None else "")
                        + (f"  app_spin_us = {a.app_spin_us};\n" if a.app_spin_us is not None else "")
                        + ("  numa = 0;\n" if a.numa_compare else "")
                        + "  log_level = \"info\";\n  key_file = \"cluster.key\";\n};\n"
                        "nodes = (\n"
                        f"  {{ id = 1; addr = \"{a.addr}\"; port = {port}; }},\n"
                        f"  {{ id = 2; addr = \"{a.addr}\"; port = {port + 1}; }}\n);\n")
        shutil.copy(conf, os.path.join(self.out, "mesh.conf"))
        for i in range(1, 2 * len(kinds) + 1):
            sock = os.path.join(self.work, f"meshd{i}.sock")
            log = open(os.path.join(self.work, f"meshd{i}.log"), "w")
            cmd = [self.bin("node/meshd"), "-c", confs[kinds[(i - 1) // 2][0]], "-n", str(2 - i % 2), "-s", sock]
            self.log("$ (background)", " ".join(cmd))
            self.meshd_procs[i] = dict(proc=subprocess.Popen(cmd, stdout=log, stderr=log), sock=sock,
                                       log=log.name)
            log.close()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            up = 0
            for i, m in self.meshd_procs.items():
                if m["proc"].poll() is not None:
                    raise Failure(f"meshd {i} exited with {m['proc'].returncode}: " + self.meshd_log_tail(i))
                j = self.ctl(i, "node")
                up += bool(j and j.get("links_up") == 1)
            if up == len(self.meshd_procs):
                return
            time.sleep(0.2)
        raise Failure("the meshd did not bring their links UP within 90 s: " + self.meshd_log_tail(1))

    def meshd_log_tail(self, i):
        try:
            with open(self.meshd_procs[i]["log"]) as f:
                return "".join(f.readlines()[-10:])
        except OSError:
            return ""

    def ctl(self, i, *what):
        r = subprocess.run([self.bin("node/meshctl"), "-j", "-L", "-s", self.meshd_procs[i]["sock"], *what],
                           capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def stop_mesh(self):
        for m in self.meshd_procs.values():
            if m["proc"].poll() is None:
                m["proc"].terminate()
        for i, m in self.meshd_procs.items():
            try:
                m["proc"].wait(timeout=15)
            except subprocess.TimeoutExpired:
                m["proc"].kill()
                m["proc"].wait()
            shutil.copy(m["log"], os.path.join(self.out, f"meshd{i}.log"))

    # ---- meshbench ----

    def meshbench_server(self, node=1):
        """A meshbench server on meshd `node` (1, or 3: node 1 of the mesh without direct receive)."""
        port = self.next_port()
        p = self.start([self.bin("meshlib/meshbench"), "-s", self.meshd_procs[node]["sock"], "-j", "-l", str(port)],
                       f"meshbench-server-{port}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with open(p.out_path) as f:
                if "listening" in f.read():
                    return p, port
            if p.poll() is not None:
                break
            time.sleep(0.05)
        self.finish(p, "meshbench server", 1)
        raise Failure("meshbench server did not listen")

    def meshbench_client_cmd(self, port, *args, node=2):
        return [self.bin("meshlib/meshbench"), "-s", self.meshd_procs[node]["sock"], "-j", *args, "1", str(port)]

    def meshbench(self, tool, server_port, test, sizes, *extra):
        node = {"meshbench-direct-off": 4, "meshbench-app": 6, "meshbench-app-pairs": 6}.get(tool, 2)
        cmd = self.meshbench_client_cmd(server_port, "-t", test, "-m", ",".join(str(s) for s in sizes), *extra,
                                        node=node)
        if tool == "meshbench-app-pairs":
            # The client's libmesh then offers no position in immediates, and uses none: both
            # directions send a direct pair after each write, as before MESH_AQ_CAP_IMM_POS.
            cmd = ["env", "MESH_APP_SEND=pairs", *cmd]
        budget = 120 + len(sizes) * (self.a.duration * 3 + 60)
        out = self.run(cmd, budget, f"meshbench {test}")
        got = 0
        for line in out.splitlines():
            if not line.startswith("{"):
                continue
            j = json.loads(line)
            got += 1
            if test == "lat":
                self.record(tool, "lat", j["size"], typ_us=j["t_typical_us"], avg_us=j["t_avg_us"],
                            min_us=j["t_min_us"], p99_us=j["t_p99_us"], max_us=j["t_max_us"], iters=j["iters"],
                            qps=j["qps"], ring=j["ring"])
            else:
                self.record(tool, test, j["size"], mb_s=j["mb_s"], msg_s=j["msg_s"], bytes=j["bytes"],
                            seconds=j["seconds"], server_seconds=j["server_seconds"], qps=j["qps"], ring=j["ring"])
        if got != len(sizes):
            raise Failure(f"meshbench {test}: {got} results for {len(sizes)} sizes:\n{out}")

    # ---- perftest ----

    def perftest(self, tool, size, extra):
        port = self.next_port()
        base = [tool, "-R", "-d", self.a.device, "-s", str(size), "-p", str(port), "-F", *extra]
        srv = self.start(base, f"{tool}-{size}-server")
        self.wait_rdma_listen(port, srv)
        out = self.run(base + [self.a.addr], 300, f"{tool} -s {size}")
        self.finish(srv, f"{tool} server")
        return out

    def perftest_row(self, tool, size, extra, ncols, ok=lambda v: True):
        """The result row of a perftest run, as floats. Under emulation perftest's cycle calibration
        sometimes fails and every figure comes out inf/nan (or a bandwidth of 0 after a run that moved
        data), and now and then its client dies of a signal (SIGSEGV, seen in ib_write_lat): such a
        run is repeated (at most twice, counted in the result); a run that exits with an error of
        its own or prints no row is a failure at once."""
        for attempt in range(3):
            try:
                out = self.perftest(tool, size, extra)
            except Failure as e:
                if attempt == 2 or not re.search(r": exit -\d+:", str(e)):
                    raise
                self.say(f"{tool} -s {size} died of a signal ({str(e).splitlines()[0]}); running it again")
                self.reap()
                continue
            m = re.search(r"^[ \t]*%d[ \t]+(\d+)((?:[ \t]+\S+){%d})" % (size, ncols), out, re.M)
            if not m:
                raise Failure(f"{tool}: no result row for {size} bytes in:\n{out}")
            try:
                vals = [float(x) for x in m.group(2).split()]
            except ValueError:
                raise Failure(f"{tool}: unreadable result row for {size} bytes: {m.group(0).strip()}")
            if all(math.isfinite(v) for v in vals) and ok(vals):
                return int(m.group(1)), vals, attempt
            self.say(f"{tool} -s {size} printed non-finite or zero figures ({m.group(0).strip()}); running it again")
        raise Failure(f"{tool} -s {size}: no usable figures in three runs")

    def ib_write_bw(self, size):
        # In duration mode perftest counts the iterations of the middle of the run only.
        iters, v, retries = self.perftest_row("ib_write_bw", size, ["-D", str(max(1, round(self.a.duration)))], 3,
                                              ok=lambda v: v[1] > 0)
        # perftest's MB is 2^20 bytes; its peak is 0 in duration mode.
        self.record("ib_write_bw", "bw", size, mb_s=v[1] * MIB / 1e6, iters=iters, retries=retries)

    def ib_write_lat(self, size):
        # columns: t_min t_max t_typical t_avg t_stdev 99% 99.9%
        iters, v, retries = self.perftest_row("ib_write_lat", size, ["-n", str(self.a.lat_iters)], 7)
        self.record("ib_write_lat", "lat", size, min_us=v[0], max_us=v[1], typ_us=v[2], avg_us=v[3], p99_us=v[5],
                    iters=iters, retries=retries)

    def ib_send_lat(self, size):
        # The verbs the application-posted path uses to tell the reader: every message consumes a
        # receive and makes a completion the reader polls (a WRITE_WITH_IMM does the same), where
        # ib_write_lat's reader spins on the last byte of its buffer.
        iters, v, retries = self.perftest_row("ib_send_lat", size, ["-n", str(self.a.lat_iters)], 7)
        self.record("ib_send_lat", "lat", size, min_us=v[0], max_us=v[1], typ_us=v[2], avg_us=v[3], p99_us=v[5],
                    iters=iters, retries=retries)

    # ---- handoff: the cost of passing a turn between processes (tests/bench/handoff.c) ----

    def handoff(self, procs, mode, laps):
        out = self.run([self.bin("tests/bench/handoff"), "-n", str(procs), "-m", mode, "-l", str(laps), "-T", "120",
                        "-j"], 180, f"handoff {procs} {mode}")
        try:
            j = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise Failure(f"handoff {procs} {mode}: no JSON in its output:\n{out}")
        self.record(f"handoff-{procs}-{mode}", "hop", 0, hop_us=j["hop_us"], laps=laps,
                    cpus=j["cpus"])

    def derive_floor(self):
        """Per round, an estimate of the fastest half round trip a data path through meshd can have
        here: the RDMA write itself (ib_write_lat) plus the hops between processes that share the CPUs
        with others, at the price handoff measured in the same round. Through meshd on both sides
        (direct receive off): two hops, application -> meshd on the sender, meshd -> application on
        the receiver. With direct receive the receiving application reads the peer's direct pair
        itself: one hop, on the sender (the data path as built)."""
        for lat in [x for x in self.results if (x["tool"], x["test"], x["size"]) == ("ib_write_lat", "lat", 64)]:
            hop = [x for x in self.results if x["tool"] == "handoff-4-yield" and x["round"] == lat["round"]]
            if lat["round"] is not None and hop:
                self.round = lat["round"]
                self.record("floor", "lat", 64, typ_us=lat["typ_us"] + 2 * hop[0]["hop_us"])
                self.record("floor-direct", "lat", 64, typ_us=lat["typ_us"] + hop[0]["hop_us"])
        self.round = None

    # ---- rstream: rsocket, or plain TCP sockets with -T s ----

    def rstream_once(self, tcp, size, count, iters):
        port = self.next_port()
        opts = (["-T", "s"] if tcp else []) + ["-T", "b", "-S", str(size), "-C", str(count), "-I", str(iters),
                                                "-p", str(port)]
        name = "rstream-tcp" if tcp else "rstream"
        srv = self.start(["rstream", *opts], f"{name}-{size}-{port}-server")
        if tcp:
            self.wait_tcp_listen(port, srv, f"{name} server")
        else:
            self.wait_rdma_listen(port, srv)
        out = self.run(["rstream", "-s", self.a.addr, *opts], 600, f"{name} -S {size}")
        self.finish(srv, f"{name} server")
        m = re.search(r"^custom\s+\S+\s+\S+\s+\S+\s+\S+\s+([\d.]+)s\s+([\d.]+)\s+([\d.]+)", out, re.M)
        if not m:
            raise Failure(f"{name}: no result row in:\n{out}")
        return float(m.group(1)), float(m.group(3))

    def rstream(self, tcp, test, size):
        """bw: bursts of 2000 transfers each way, timed by rstream (2 decimals): long enough runs
        for 3 digits, and rsocket's best (with bursts of 100 it stayed under the device's limit,
        with 2000 it reaches it: the figure beside ours is then rsocket at its best, not an easy
        one). lat: 1 transfer each way, usec/xfer is the average half round trip."""
        tool = "tcp" if tcp else "rstream"
        key = (tcp, test, size)
        if test == "bw":
            count, iters = 2000, self.calibrated.get(key, 1)
            for _ in range(4):
                secs, _ = self.rstream_once(tcp, size, count, iters)
                if secs >= self.a.min_secs or key in self.calibrated:
                    break
                iters = max(iters + 1, math.ceil(iters * self.a.min_secs * 1.3 / max(secs, 0.01)))
            self.calibrated[key] = iters
            total = iters * count * size * 2  # both directions, one after the other
            self.record(tool, "bw", size, mb_s=total / secs / 1e6, seconds=secs, iters=iters * count)
        else:
            iters = self.calibrated.get(key, self.a.lat_iters)
            for _ in range(3):
                secs, usec = self.rstream_once(tcp, size, 1, iters)
                if secs >= 0.5 or key in self.calibrated:
                    break
                iters = max(iters * 2, math.ceil(iters * 1.0 / max(secs, 0.01)))
            self.calibrated[key] = iters
            self.record(tool, "lat", size, avg_us=usec, iters=iters)

    # ---- TCP as a C program uses it (tcp_ref): blocking, and both ends busy-polling ----

    def tcp_c(self, test, size, poll=False):
        port = self.next_port()
        tool = "tcp-c-poll" if poll else "tcp-c"
        ref = self.bin("tests/bench/tcp_ref")
        srv = self.start([ref, "-s", str(port), "-T", "300"], f"{tool}-{test}-{size}-server")
        self.wait_tcp_listen(port, srv, "tcp_ref server")
        args = [ref, "-c", self.a.addr, str(port), "-t", test, "-S", str(size), "-T", "240"]
        if test == "bw":
            args += ["-D", str(self.a.duration)]
        else:
            args += ["-n", str(self.a.lat_iters * 10)] + (["-p"] if poll else [])
        out = self.run(args, 300, f"{tool} {test} {size}")
        self.finish(srv, "tcp_ref server", 30)
        try:
            j = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise Failure(f"tcp_ref {test}: no JSON in its output:\n{out}")
        if test == "bw":
            self.record(tool, "bw", size, mb_s=j["mb_s"], seconds=j["seconds"])
        else:
            self.record(tool, "lat", size, typ_us=j["typ_us"], avg_us=j["avg_us"], p99_us=j["p99_us"],
                        iters=j["iters"])

    # ---- TCP without rstream: a python socket pair (one process each way) ----

    def tcp_python(self, test, size):
        port = self.next_port()
        srv = self.start([sys.executable, os.path.abspath(__file__), "--tcp-server", str(port)],
                         f"python-tcp-{test}-server")
        self.wait_tcp_listen(port, srv, "python TCP server")
        c = socket.create_connection((self.a.addr, port))
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b"x" * size
        if test == "bw":
            c.sendall(b"B")
            n, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < self.a.duration:
                c.sendall(buf)
                n += size
            c.shutdown(socket.SHUT_WR)
            got = int(c.makefile().readline())
            secs = time.monotonic() - t0
            if got != n:
                raise Failure(f"python TCP: sent {n} bytes, server read {got}")
            self.record("tcp", "bw", size, mb_s=n / secs / 1e6, seconds=secs, impl="python")
        else:
            c.sendall(b"L")
            lat = []
            for _ in range(self.a.lat_iters):
                t0 = time.perf_counter()
                c.sendall(buf)
                k = 0
                while k < size:
                    k += len(c.recv(size - k))
                lat.append((time.perf_counter() - t0) / 2 * 1e6)
            c.shutdown(socket.SHUT_WR)
            lat.sort()
            self.record("tcp", "lat", size, avg_us=sum(lat) / len(lat), typ_us=lat[len(lat) // 2], impl="python")
        c.close()
        self.finish(srv, "python TCP server", 30)

    # ---- profile: meshd counters and CPU of every process during a bw run ----

    @staticmethod
    def cpu_snapshot():
        procs = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    s = f.read()
            except OSError:
                continue
            comm = s[s.index("(") + 1:s.rindex(")")]
            fields = s[s.rindex(")") + 2:].split()
            procs[int(pid)] = (comm, int(fields[11]), int(fields[12]))  # utime, stime
        with open("/proc/stat") as f:
            total = [int(x) for x in f.readline().split()[1:]]
        return time.monotonic(), procs, total

    def channel_of(self, node, port):
        j = self.ctl(node, "channels")
        self.log(f"meshctl -j channels on node {node}:", json.dumps(j))
        chans = [c for c in (j or {}).get("channels", [])
                 if port in (c.get("local_port"), c.get("peer_port")) and c.get("state") == "OPEN"]
        return chans[0] if len(chans) == 1 else None

    def profile(self, server_port, test, size):
        d = self.a.profile_secs
        cmd = self.meshbench_client_cmd(server_port, "-t", test, "-m", str(size), "-D", str(d))
        roles = {self.meshd_procs[1]["proc"].pid: "meshd 1 (receiver)",
                 self.meshd_procs[2]["proc"].pid: "meshd 2 (sender)",
                 self.server_proc.pid: "meshbench server"}
        client = self.start(cmd, f"profile-{test}-{size}")
        roles[client.pid] = "meshbench client"
        time.sleep(d * 0.25)
        s0 = (self.cpu_snapshot(), self.channel_of(2, server_port), self.channel_of(1, server_port))
        perf = None
        if self.a.perf:
            perf_data = os.path.join(self.out, f"perf-{test}-{size}.data")
            pids = ",".join(str(p) for p in roles)
            perf = subprocess.Popen(["perf", "record", "-q", "-F", "499", "-g", "-p", pids, "-o", perf_data, "--",
                                     "sleep", str(d * 0.5)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True)
        time.sleep(d * 0.5)
        s1 = (self.cpu_snapshot(), self.channel_of(2, server_port), self.channel_of(1, server_port))
        out = self.finish(client, f"profiled meshbench {test}", timeout=d + 120)
        j = [json.loads(x) for x in out.splitlines() if x.startswith("{")][0]
        (t0, p0, c0), tx0, rx0 = s0
        (t1, p1, c1), tx1, rx1 = s1
        dt = t1 - t0
        if not (tx0 and tx1 and rx0 and rx1) or tx0["id"] != tx1["id"]:
            raise Failure(f"profile {test} {size}: meshctl did not show the channel on both nodes")
        prof = dict(test=test, size=size, seconds=dt, meshbench_mb_s=j["mb_s"], meshbench_msg_s=j["msg_s"])
        prof["meshd_tx_mb_s"] = (tx1["tx_bytes"] - tx0["tx_bytes"]) / dt / 1e6
        prof["meshd_rx_mb_s"] = (rx1["rx_bytes"] - rx0["rx_bytes"]) / dt / 1e6
        chunks = tx1["tx_chunks"] - tx0["tx_chunks"]
        prof["chunks_per_s"] = chunks / dt
        prof["avg_chunk"] = (tx1["tx_bytes"] - tx0["tx_bytes"]) / chunks if chunks else 0
        prof["credit_stalls_per_s"] = (tx1["credit_stalls"] - tx0["credit_stalls"]) / dt
        prof["in_flight"] = [tx0["in_flight"], tx1["in_flight"]]
        prof["tx_pending"] = [tx0["tx_pending"], tx1["tx_pending"]]
        prof["rx_unread"] = [rx0["rx_unread"], rx1["rx_unread"]]
        ticks = dt * CLK_TCK
        cpu = []
        for pid, (comm, u1, k1) in p1.items():
            if pid not in p0:
                continue
            _, u0, k0 = p0[pid]
            du, dk = (u1 - u0) / ticks * 100, (k1 - k0) / ticks * 100
            if du + dk >= 1 or pid in roles:
                cpu.append(dict(pid=pid, name=roles.get(pid, comm), user=du, sys=dk))
        cpu.sort(key=lambda x: -(x["user"] + x["sys"]))
        prof["cpu"] = cpu
        tot = [b - a for a, b in zip(c0, c1)]
        names = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]
        all_ticks = sum(tot[:8]) or 1
        ncpu = os.cpu_count()
        prof["machine"] = {n: tot[i] / all_ticks * 100 * ncpu for i, n in enumerate(names) if i < len(tot)}
        if perf:
            _, err = perf.communicate(timeout=60)
            rep = subprocess.run(["perf", "report", "-i", perf_data, "--stdio", "--no-children", "--sort",
                                  "comm,dso,symbol", "--percent-limit", "1.5", "-g", "none"],
                                 capture_output=True, text=True, timeout=300)
            with open(perf_data + ".txt", "w") as f:
                f.write(rep.stdout + rep.stderr + err)
            prof["perf_top"] = [re.sub(r"(\s+-)+\s*$", "", ln.strip()) for ln in rep.stdout.splitlines()
                                if ln.strip() and not ln.startswith("#")][:25]
        self.profiles.append(prof)
        self.log("profile", json.dumps(prof))

    # ---- the run ----

    def run_all(self):
        a = self.a
        self.say(f"mode {a.mode}: 2 meshd on {a.addr}, {a.qps} QPs per link"
                 + (f", device {a.device}" if a.mode == "rdma" else "") + f", {a.rounds} rounds")
        self.start_mesh()
        self.say("link UP")
        self.server_proc, port = self.meshbench_server()
        self.server_off_proc, port_off = self.meshbench_server(3)
        self.server_app_proc, port_app = self.meshbench_server(5)
        d = ["-D", str(a.duration)]
        if a.numa_compare:
            # Both meshd have numa = 0: data-path threads and the server's rings on node 0. The client
            # asks for its rings on node 0 (right: with the thread that drives the device) or 1 (wrong).
            for r in range(a.rounds):
                self.round = r
                self.attempt("meshbench bw right node", self.meshbench, "meshbench-numa-right", port, "bw", [65536],
                             "-N", "0", *d)
                self.attempt("meshbench bw wrong node", self.meshbench, "meshbench-numa-wrong", port, "bw", [65536],
                             "-N", "1", *d)
                self.say(f"round {r + 1} of {a.rounds} done")
            self.round = None
            for p in (self.server_proc, self.server_off_proc, self.server_app_proc):
                if p:
                    p.terminate()
                    self.finish(p, "meshbench server", 30)
            return
        rdma = a.mode == "rdma"
        tcp_bw, tcp_lat = ((lambda: self.rstream(True, "bw", 65536)), (lambda: self.rstream(True, "lat", 64))) \
            if shutil.which("rstream") and not a.python_tcp else \
            ((lambda: self.tcp_python("bw", 65536)), (lambda: self.tcp_python("lat", 64)))
        # Once: the other sizes, the message rate, a checked run, latency with the applications polling.
        self.attempt("meshbench bw", self.meshbench, "meshbench", port, "bw", [4096, 1 << 20], *d)
        self.attempt("meshbench rate", self.meshbench, "meshbench", port, "rate", [64], *d)
        self.attempt("meshbench bw -c", self.meshbench, "meshbench-check", port, "bw", [65536], "-c", "-D",
                     str(min(a.duration, 2)))
        self.attempt("meshbench lat -p", self.meshbench, "meshbench-poll", port, "lat", [64], "-p", "-n",
                     str(a.lat_iters))
        if rdma:
            self.attempt("ib_write_lat 2", self.ib_write_lat, 2)
        # Rounds: each figure a ratio is made of, interleaved, so that a slow spell of the machine
        # hits both sides of a ratio alike; the table shows medians and per-round ratios.
        for r in range(a.rounds):
            self.round = r
            # The streams a bandwidth ratio is made of run back to back: the reference (ib_write_bw,
            # or TCP's C stream on the host) between meshd's stream and the applications' own, so
            # that a drift of the machine's speed over a round (the VM's figures move by 10% from
            # one minute to the next) weighs on both sides of each ratio alike.
            self.attempt("meshbench bw 64K", self.meshbench, "meshbench", port, "bw", [65536], *d)
            if rdma:
                self.attempt("ib_write_bw", self.ib_write_bw, 65536)
            else:
                self.attempt("tcp C bw", self.tcp_c, "bw", 65536)
            self.attempt("meshbench bw 64K, app_send", self.meshbench, "meshbench-app", port_app, "bw", [65536], *d)
            if rdma:
                self.attempt("rstream bw", self.rstream, False, "bw", 65536)
            self.attempt("tcp bw", tcp_bw)
            self.attempt("meshbench lat", self.meshbench, "meshbench", port, "lat", [64], "-n", str(a.lat_iters))
            self.attempt("meshbench lat, direct receive off", self.meshbench, "meshbench-direct-off", port_off, "lat",
                         [64], "-n", str(a.lat_iters))
            self.attempt("meshbench lat, app_send", self.meshbench, "meshbench-app", port_app, "lat", [64], "-n",
                         str(a.lat_iters))
            if rdma:
                self.attempt("meshbench lat, app_send with pairs", self.meshbench, "meshbench-app-pairs", port_app,
                             "lat", [64], "-n", str(a.lat_iters))
            if rdma:
                self.attempt("ib_write_lat 64", self.ib_write_lat, 64)
                self.attempt("ib_send_lat 64", self.ib_send_lat, 64)
                self.attempt("rstream lat", self.rstream, False, "lat", 64)
            self.attempt("tcp lat", tcp_lat)
            if not rdma:
                # TCP itself, not a harness: a C ping-pong sleeping in recv as TCP programs do, and
                # the same with both ends busy-polling (TCP's lowest latency); its C stream is above.
                self.attempt("tcp C lat", self.tcp_c, "lat", 64)
                self.attempt("tcp C lat, busy-poll", self.tcp_c, "lat", 64, True)
            # The price of a hop between processes, in the same round: perftest's shape (2 pollers,
            # one per CPU) and a channel's (4 processes sharing the CPUs, yielding while they poll).
            self.attempt("handoff 2", self.handoff, 2, "spin", 2000)
            self.attempt("handoff 4", self.handoff, 4, "yield", 500)
            self.say(f"round {r + 1} of {a.rounds} done")
        self.round = None
        if rdma:
            self.derive_floor()
        if a.profile_secs > 0:
            self.attempt("profile bw 64K", self.profile, port, "bw", 65536)
            self.attempt("profile bw 4K", self.profile, port, "bw", 4096)
            self.attempt("profile rate 64", self.profile, port, "rate", 64)
            self.say("profile done")
        for p in (self.server_proc, self.server_off_proc, self.server_app_proc):
            if p:
                p.terminate()
                self.finish(p, "meshbench server", 30)

    # ---- report ----

    NAMES = {"meshbench": "channel (meshbench)", "meshbench-check": "channel (meshbench -c, every byte checked)",
             "meshbench-poll": "channel (meshbench -p, apps busy-poll)", "ib_write_bw": "ib_write_bw -R (perftest)",
             "meshbench-direct-off": "channel, cluster.direct_receive = off",
             "meshbench-app": "channel, cluster.app_send = on (apps post)",
             "meshbench-app-pairs": "channel, app_send, a pair per write (MESH_APP_SEND=pairs)",
             "floor-direct": "floor, direct receive (ib_write_lat + 1 hop)",
             "ib_write_lat": "ib_write_lat -R (perftest)", "ib_send_lat": "ib_send_lat -R (perftest)",
             "rstream": "rstream -T b (rsocket)",
             "tcp": "TCP over loopback (rstream -T s -T b)",
             "tcp-c": "TCP over loopback (C, blocking: tcp_ref)",
             "tcp-c-poll": "TCP over loopback (C, both ends busy-poll)",
             "meshbench-numa-right": "channel, client rings on node 0 (meshd's)",
             "meshbench-numa-wrong": "channel, client rings on node 1 (wrong)",
             "handoff-2-spin": "hop, 2 processes spinning (perftest's shape)",
             "handoff-4-yield": "hop, 4 processes yielding (a channel's shape)",
             "floor": "floor via meshd both sides (ib_write_lat + 2 hops)"}
    KEYS = {"bw": "mb_s", "rate": "msg_s", "lat": "typ_us", "hop": "hop_us"}

    def figures(self):
        """One entry per (tool, test, size): the runs in order, medians of every numeric field."""
        groups = {}
        for r in self.results:
            groups.setdefault((r["tool"], r["test"], r["size"]), []).append(r)
        out = []
        for (tool, test, size), runs in groups.items():
            med = {}
            for k, v in runs[0].items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("size", "round"):
                    vals = sorted(x[k] for x in runs if k in x)
                    med[k] = vals[len(vals) // 2] if len(vals) % 2 else (vals[len(vals) // 2 - 1] +
                                                                         vals[len(vals) // 2]) / 2
            out.append(dict(tool=tool, test=test, size=size, runs=runs, med=med, impl=runs[0].get("impl")))
        return out

    def table(self):
        a = self.a
        lines = []
        w = lines.append
        where = ("Soft-RoCE rxe0 in the TCG VM (2 vCPUs)" if a.mode == "rdma"
                 else "tcp provider on 127.0.0.1 (this machine)")
        if a.numa_compare:
            where += ", 2 NUMA nodes of 1 vCPU each, numa = 0 on both meshd"
        pol = a.polling + "".join(f", {k} {v} us" for k, v in (("budget", a.poll_budget_us), ("app spin", a.app_spin_us))
                                  if v is not None)
        w(f"== rdmamesh channel benchmark: {where}; 2 meshd ({pol} polling), {a.qps} QPs per link, "
          "ring 1 MiB (meshd default),")
        w(f"   zero-copy unless said; MB = 10^6 bytes; latency = half round trip in us; medians of {a.rounds} "
          "interleaved rounds where runs > 1")
        w("")
        w(f"{'figure':<52} {'size':>7} {'median':>10} {'unit':<7} {'runs':>4}  {'min..max / also':<40}")
        w("-" * 124)
        figs = self.figures()
        for f in figs:
            name = self.NAMES[f["tool"]]
            if f["tool"] == "tcp" and f["impl"] == "python":
                name = "TCP over loopback (python sockets)"
            m, runs, test = f["med"], f["runs"], f["test"]
            if test == "lat" and "typ_us" not in m:
                key, label = "avg_us", "lat average"
            else:
                key, label = self.KEYS[test], {"bw": "bw", "rate": "rate", "lat": "lat typical",
                                               "hop": ""}[test]
            vals = [x[key] for x in runs]
            spread = f"{min(vals):.2f}..{max(vals):.2f}" if len(vals) > 1 else ""
            reruns = sum(x.get("retries", 0) for x in runs)
            if reruns:
                spread += f"{'; ' if spread else ''}{reruns} rerun(s) after inf/nan output or a crash"
            if test == "bw":
                also = f"{m['mb_s'] * 8 / 1e3:.3f} Gbit/s"
                w(f"{name + ' ' + label:<52} {fmt_size(f['size']):>7} {m[key]:>10.2f} {'MB/s':<7} {len(runs):>4}  "
                  f"{(spread + '; ' if spread else '') + also}")
            elif test == "rate":
                w(f"{name + ' ' + label:<52} {fmt_size(f['size']):>7} {m[key] / 1e3:>10.1f} {'kmsg/s':<7} "
                  f"{len(runs):>4}  {m['mb_s']:.2f} MB/s")
            else:
                also = f"avg {m['avg_us']:.1f}, p99 {m['p99_us']:.1f}" if key == "typ_us" and "p99_us" in m else ""
                if test == "hop":
                    also = f"{m['cpus']:.0f} CPUs"
                size = "-" if test == "hop" else fmt_size(f["size"])
                w(f"{name + ' ' + label:<52} {size:>7} {m[key]:>10.2f} {'us':<7} {len(runs):>4}  "
                  f"{'; '.join(x for x in (spread, also) if x)}")
        w("")
        w(f"{'ratio (reported, never asserted)':<60} {'median':>8}   {'per round':<54}")
        w("-" * 124)
        self.ratios = []

        def ratio(label, num, den, key_n, key_d):
            rn = [x for x in self.results if (x["tool"], x["test"], x["size"]) == num and key_n in x]
            rd = [x for x in self.results if (x["tool"], x["test"], x["size"]) == den and key_d in x]
            byround = {x.get("round"): x for x in rd}
            pairs = [(x[key_n], byround[x["round"]][key_d]) for x in rn
                     if x.get("round") is not None and x["round"] in byround]
            if not pairs:
                w(f"{label:<60} {'n/a':>8}   (a figure is missing)")
                return
            vals = sorted(n / d for n, d in pairs)
            med = vals[len(vals) // 2] if len(vals) % 2 else (vals[len(vals) // 2 - 1] + vals[len(vals) // 2]) / 2
            self.ratios.append(dict(ratio=label, median=med, rounds=[n / d for n, d in pairs]))
            w(f"{label:<60} {med:>8.3f}   " + ", ".join(f"{n / d:.3f} ({n:.1f}/{d:.1f})" for n, d in pairs))

        mb, ml = ("meshbench", "bw", 65536), ("meshbench", "lat", 64)
        if a.numa_compare:
            ratio("channel bw @64 KiB, rings on meshd's node / on the other node",
                  ("meshbench-numa-right", "bw", 65536), ("meshbench-numa-wrong", "bw", 65536), "mb_s", "mb_s")
            w("(emulated NUMA has no real distance: this ratio is reported, not a target)")
            return "\n".join(lines)
        if a.mode == "rdma":
            ratio("channel bw @64 KiB / ib_write_bw @64 KiB", mb, ("ib_write_bw", "bw", 65536), "mb_s", "mb_s")
            ratio("channel bw @64 KiB / rstream bw @64 KiB", mb, ("rstream", "bw", 65536), "mb_s", "mb_s")
        ratio("channel bw @64 KiB / TCP bw @64 KiB", mb, ("tcp", "bw", 65536), "mb_s", "mb_s")
        if a.mode == "rdma":
            ratio("channel half-RTT @64 B / ib_write_lat @64 B (typical)", ml, ("ib_write_lat", "lat", 64),
                  "typ_us", "typ_us")
            ratio("channel half-RTT @64 B / rstream @64 B (average)", ml, ("rstream", "lat", 64), "avg_us", "avg_us")
            ratio("floor through meshd @64 B / ib_write_lat @64 B", ("floor", "lat", 64), ("ib_write_lat", "lat", 64),
                  "typ_us", "typ_us")
            ratio("channel half-RTT @64 B / floor through meshd", ml, ("floor", "lat", 64), "typ_us", "typ_us")
            ratio("channel half-RTT @64 B / floor with direct receive", ml, ("floor-direct", "lat", 64), "typ_us",
                  "typ_us")
        ratio("channel half-RTT @64 B / TCP @64 B (average)", ml, ("tcp", "lat", 64), "avg_us", "avg_us")
        if a.mode == "tcp":
            ratio("channel bw @64 KiB / TCP (C) bw @64 KiB", mb, ("tcp-c", "bw", 65536), "mb_s", "mb_s")
            ratio("channel half-RTT @64 B / TCP (C, blocking) @64 B (typical)", ml, ("tcp-c", "lat", 64), "typ_us",
                  "typ_us")
            ratio("channel half-RTT @64 B / TCP (C, busy-poll) @64 B (typical)", ml, ("tcp-c-poll", "lat", 64),
                  "typ_us", "typ_us")
        ratio("channel half-RTT @64 B, direct receive on / off", ml, ("meshbench-direct-off", "lat", 64), "typ_us",
              "typ_us")
        if a.mode == "rdma":
            # cluster.app_send: no meshd between the applications. The floor of that data path is
            # the verbs it uses: a write whose immediate consumes a receive and makes a completion
            # that the reader polls, which ib_send_lat measures (perftest has no write-with-immediate
            # latency test); ib_write_lat, whose reader spins on a byte, is the lower bound of any path.
            mab, mal = ("meshbench-app", "bw", 65536), ("meshbench-app", "lat", 64)
            ratio("app_send: channel bw @64 KiB / ib_write_bw @64 KiB", mab, ("ib_write_bw", "bw", 65536), "mb_s",
                  "mb_s")
            ratio("app_send: channel bw @64 KiB / rstream bw @64 KiB", mab, ("rstream", "bw", 65536), "mb_s", "mb_s")
            ratio("app_send: half-RTT @64 B / ib_send_lat @64 B (its floor)", mal, ("ib_send_lat", "lat", 64),
                  "typ_us", "typ_us")
            ratio("app_send: half-RTT @64 B / ib_write_lat @64 B", mal, ("ib_write_lat", "lat", 64), "typ_us", "typ_us")
            ratio("ib_send_lat @64 B / ib_write_lat @64 B (a completion against a polled byte)",
                  ("ib_send_lat", "lat", 64), ("ib_write_lat", "lat", 64), "typ_us", "typ_us")
            ratio("app_send: half-RTT @64 B / rstream @64 B (average)", mal, ("rstream", "lat", 64), "avg_us", "avg_us")
            ratio("app_send: half-RTT @64 B / through meshd (typical)", mal, ml, "typ_us", "typ_us")
            ratio("app_send: half-RTT @64 B, position in the immediate / a pair per write", mal,
                  ("meshbench-app-pairs", "lat", 64), "typ_us", "typ_us")
        if a.mode == "tcp":
            # cluster.app_send over tcp: each application sends on a TCP connection of its own, and
            # the other reads it into its ring: kernel TCP is the floor of that path.
            mab, mal = ("meshbench-app", "bw", 65536), ("meshbench-app", "lat", 64)
            ratio("app_send: channel bw @64 KiB / TCP (C) bw @64 KiB", mab, ("tcp-c", "bw", 65536), "mb_s", "mb_s")
            ratio("app_send: half-RTT @64 B / TCP (C, blocking) @64 B (typical)", mal, ("tcp-c", "lat", 64), "typ_us",
                  "typ_us")
            ratio("app_send: half-RTT @64 B / TCP (C, busy-poll) @64 B (typical)", mal, ("tcp-c-poll", "lat", 64),
                  "typ_us", "typ_us")
            ratio("app_send: half-RTT @64 B / through meshd (typical)", mal, ml, "typ_us", "typ_us")
        for p in self.profiles:
            w("")
            w(f"profile: meshbench {p['test']} {fmt_size(p['size'])}, {p['seconds']:.1f} s sampled mid-run")
            w(f"  rate seen by meshd: sender tx {p['meshd_tx_mb_s']:.2f} MB/s, receiver rx {p['meshd_rx_mb_s']:.2f} "
              f"MB/s; meshbench reported {p['meshbench_mb_s']:.2f} MB/s for the whole run")
            w(f"  chunks: {p['chunks_per_s']:.0f}/s of {p['avg_chunk'] / 1024:.1f} KiB on average; credit stalls "
              f"{p['credit_stalls_per_s']:.0f}/s; in_flight {p['in_flight'][0]}, {p['in_flight'][1]}; "
              f"tx_pending {p['tx_pending'][0]}, {p['tx_pending'][1]}; rx_unread {p['rx_unread'][0]}, "
              f"{p['rx_unread'][1]} (two samples)")
            m = p["machine"]
            w(f"  CPU of the machine ({os.cpu_count() * 100}% = all CPUs): user {m['user']:.0f}%, system "
              f"{m['system']:.0f}%, softirq {m.get('softirq', 0):.0f}%, irq {m.get('irq', 0):.0f}%, idle "
              f"{m['idle']:.0f}%")
            w("  CPU per process (% of one CPU, user+sys): " + "; ".join(
                f"{c['name']} {c['user'] + c['sys']:.0f}% ({c['user']:.0f}+{c['sys']:.0f})" for c in p["cpu"][:8]))
            for ln in p.get("perf_top", []):
                w("    perf: " + ln)
        return "\n".join(lines)

    def report(self):
        text = self.table()
        print(text, flush=True)
        with open(os.path.join(self.out, "table.txt"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(self.out, "results.json"), "w") as f:
            for r in self.results:
                f.write(json.dumps(r) + "\n")
            for r in self.ratios:
                f.write(json.dumps(r) + "\n")
            for p in self.profiles:
                f.write(json.dumps(dict(profile=p)) + "\n")


def tcp_server(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    kind = c.recv(1)
    n = 0
    while True:
        d = c.recv(1 << 20)
        if not d:
            break
        n += len(d)
        if kind == b"L":
            c.sendall(d)
    if kind == b"B":
        c.sendall(f"{n}\n".encode())
    c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["rdma", "tcp"], default="rdma")
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default="build/bench")
    ap.add_argument("--addr", default=None, help="default 10.77.0.1 (rdma), 127.0.0.1 (tcp)")
    ap.add_argument("--device", default="rxe0")
    ap.add_argument("--qps", type=int, default=4)
    ap.add_argument("--mesh-port", type=int, default=7471)
    ap.add_argument("--duration", type=float, default=4, help="seconds per bw/rate run (meshbench, ib_write_bw)")
    ap.add_argument("--polling", choices=["adaptive", "busy", "event"], default="adaptive",
                    help="meshd's cluster.polling (default adaptive, meshd's default)")
    ap.add_argument("--poll-budget-us", type=int, default=None, help="cluster.poll_budget_us (default: meshd's)")
    ap.add_argument("--app-spin-us", type=int, default=None, help="cluster.app_spin_us (default: meshd's)")
    ap.add_argument("--reference-failures-ok", action="store_true",
                    help="exit 0 when only reference tools (perftest, rstream, TCP) failed (CI: emulated perftest "
                         "sometimes prints no usable figure; meshbench or meshd failing still fails)")
    ap.add_argument("--numa-compare", action="store_true",
                    help="only: bw 64 KiB with the client's rings on meshd's node vs the other node (needs 2 nodes)")
    ap.add_argument("--lat-iters", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved rounds of the figures ratios use (default 5 in the VM, 3 on the host)")
    ap.add_argument("--min-secs", type=float, default=2.0, help="shortest rstream bw run")
    ap.add_argument("--profile-secs", type=float, default=10, help="0: no profile runs")
    ap.add_argument("--perf", action="store_true", help="perf record the processes during the profile runs")
    ap.add_argument("--python-tcp", action="store_true", help="TCP reference by python sockets, not rstream -T s")
    ap.add_argument("--tcp-server", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.tcp_server:
        tcp_server(a.tcp_server)
        return 0
    if a.addr is None:
        a.addr = "10.77.0.1" if a.mode == "rdma" else "127.0.0.1"
    if a.rounds is None:
        a.rounds = 5 if a.mode == "rdma" else 3
    if a.rounds < 1 or a.duration <= 0 or a.lat_iters < 1:
        ap.error("--rounds, --duration and --lat-iters must be positive")
    b = Bench(a)
    try:
        b.run_all()
    except Failure as e:
        b.failures.append(str(e))
        b.say(f"FAILED: {e}")
    finally:
        for p in [getattr(b, "server_proc", None), getattr(b, "server_off_proc", None),
                  getattr(b, "server_app_proc", None)]:
            if p and p.poll() is None:
                p.kill()
                p.wait()
        b.stop_mesh()
    b.report()
    if b.failures:
        print(f"\n{len(b.failures)} tool(s) failed:", file=sys.stderr)
        for f in b.failures:
            print("  " + f.replace("\n", "\n    "), file=sys.stderr)
        for i in b.meshd_procs:
            print(f"--- meshd {i} log (tail)\n{b.meshd_log_tail(i)}", file=sys.stderr)
        if a.reference_failures_ok and len(b.failures) == len(b.ref_failures):
            print("only reference tools failed (--reference-failures-ok): their ratios are missing, "
                  "the channel's own figures are complete", file=sys.stderr)
            return 0
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
