#!/usr/bin/env python3
"""redis-benchmark over libmesh_preload.so, kernel TCP and rsocket's librspreload.so (not asserted).

Two meshd (node 1 and node 2 at two addresses of this machine: 127.0.0.1 and 127.0.0.2 by default,
the Soft-RoCE VM's 10.77.0.1 and 10.77.0.2 with --transport rdma) and one redis-server beside node
2, started under each library in turn; redis-benchmark (ping, set, get) beside node 1 with 50 clients
and with 1 client (latency bound). Prints requests/s per case and the ratio to kernel TCP. Where a
library cannot run (rsocket without an RDMA device, or a crash), the row says so.

  tests/bench/preload_bench.py [--build build] [--transport tcp|rdma] [--addrs "A B"] [-n REQUESTS]
                               [--rtt-count N] [--cases tcp,mesh,rsocket] [--echo-only]
                               [--set KEY=VALUE ...]

With each redis-benchmark run, the machine's CPU over it: CPU-microseconds per request (all
processes and the kernel's work for the device together), the idle share and the softirq share,
which say whether the CPUs were the limit and what a request costs each way.

Then the test's own blocking echo programs (tests/integration/preload_echo.c), which every library
can run: the mean 64 B round trip and the rate of a 64 MiB echo, with the machine's CPU-milliseconds
per MB echoed (where the device's emulation holds both libraries to one rate, the CPU each spends
on it is what differs), and who spent it: the two echo programs, the two meshd, and the rest, which
the per-process figures (/proc, sampled at the kernel's tick) did not attribute. Take the split as a
hint and the machine's total as the comparison: rxe does a packet's work in whichever process's
system call or softirq it lands (one meshd post may process the applications' queued packets on
the VM's loopback), and perf of the same echo in the VM put about 86% of the busy samples in the
echo programs, 12% in meshd and 1% elsewhere, where the tick's accounting showed a fifth as rest.

--set KEY=VALUE adds a cluster setting to both meshd (polling=event, app_spin_us=0, ...) for
comparing; --cases and --echo-only shorten a run to what is being compared.
"""
import argparse
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "integration"))
import preload_test  # noqa: E402
from fixtures import wait_until  # noqa: E402

RSOCKET = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so"


def machine_cpu():
    """(busy, idle, softirq) seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq + steal) / hz, (idle + iowait) / hz, softirq / hz


def proc_cpu(pid):
    """CPU seconds (user + system) of a live process so far, from /proc/PID/stat; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def bench(env, host, port, clients, n):
    """{test: requests/s} from redis-benchmark, with "_cpu": the machine's (busy, idle, softirq)
    seconds over the run and "_requests" (every server, client, meshd and the device's work in the
    kernel share it: what a request costs once the CPUs are the limit); or a string saying why not."""
    c0 = machine_cpu()
    try:
        r = subprocess.run(["redis-benchmark", "-h", host, "-p", str(port), "-t", "ping,set,get", "-n", str(n),
                            "-c", str(clients), "-q"], env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "timed out"
    c1 = machine_cpu()
    res = {m.group(1): float(m.group(2)) for m in
           re.finditer(r"(\w+): ([\d.]+) requests per second", r.stdout.replace("\r", "\n"))}
    if r.returncode or len(res) < 4:
        return f"failed (exit {r.returncode}: {(r.stderr or r.stdout).strip()[-80:]})"
    res["_cpu"] = tuple(b - a for a, b in zip(c0, c1))
    res["_requests"] = 4 * n  # PING_INLINE, PING_MBULK, SET, GET
    return res


def echo_bench(a, mesh, env_srv, env_cli, host, port, workdir):
    """The test's own blocking echo programs (tests/integration/preload_echo.c): the mean round trip
    of 64 B (TCP_NODELAY) and the rate of a 64 MiB echo in blocking 64 KiB write/read pairs (the
    "bulk" client: plain read and write only, which rsocket's preload serves too); (rtt_us, MB/s),
    or a string saying why not. With the rate, the machine's CPU per MB and its split: the two echo
    programs, the two meshd, and the rest the per-process accounting attributed to neither (a hint:
    see the module's help)."""
    echo = os.path.join(a.build, "tests", "integration", "preload_echo")
    srv = subprocess.Popen([echo, "bserver", str(port), "2"], env=env_srv, stdout=subprocess.DEVNULL,
                           stderr=open(os.path.join(workdir, f"echo-{port}.log"), "w"))
    time.sleep(0.5)
    try:
        r = subprocess.run([echo, "rtt", host, str(port), str(a.rtt_count), "64"], env=env_cli, capture_output=True,
                           text=True, timeout=300)
        m = re.search(r"rtt_us ([\d.]+)", r.stdout)
        if r.returncode or not m:
            return f"failed (exit {r.returncode}: {(r.stderr or r.stdout).strip()[-80:]})"
        size = 64 << 20
        c0 = machine_cpu()
        p0 = [proc_cpu(srv.pid), sum(proc_cpu(p.pid) for p in mesh.proc.values())]
        k0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            r2 = subprocess.run([echo, "bulk", host, str(port), str(size)], env=env_cli, capture_output=True,
                                text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return f"rtt {float(m.group(1)):.1f} us; the 64 MiB echo timed out"
        c1 = machine_cpu()
        k1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p1 = [proc_cpu(srv.pid), sum(proc_cpu(p.pid) for p in mesh.proc.values())]
        m2 = re.search(r"bulk_mb_s ([\d.]+)", r2.stdout)
        if r2.returncode or not m2:
            return f"rtt {float(m.group(1)):.1f} us; echo failed (exit {r2.returncode}: " \
                   f"{(r2.stderr or r2.stdout).strip()[-80:]})"
        # CPU-seconds of the whole machine per MB moved (both directions, as the rate counts them)
        busy, idle = c1[0] - c0[0], c1[1] - c0[1]
        mb = 2 * size / 1e6
        apps = p1[0] - p0[0] + (k1.ru_utime + k1.ru_stime) - (k0.ru_utime + k0.ru_stime)
        meshd = p1[1] - p0[1]
        return (float(m.group(1)), float(m2.group(1)), busy / mb, idle / max(busy + idle, 1e-9),
                apps / mb, meshd / mb, max(busy - apps - meshd, 0.0) / mb)
    except subprocess.TimeoutExpired:
        return "timed out"
    finally:
        preload_test.stop(srv)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--addrs", default="127.0.0.1 127.0.0.2")
    ap.add_argument("-n", "--requests", type=int, default=100000)
    ap.add_argument("--rtt-count", type=int, default=5000)
    ap.add_argument("--app-send", choices=["on", "off"], default=None,
                    help="cluster.app_send of both meshd (default: meshd's own, on); over rdma, on: the "
                         "preloaded programs post their own writes")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another cluster setting of both meshd (for comparing, e.g. polling=event); repeatable")
    ap.add_argument("--echo-only", action="store_true", help="skip redis-benchmark: only the echo programs")
    ap.add_argument("--cases", default="tcp,mesh,rsocket",
                    help="which of tcp, mesh, rsocket to run, comma-separated (default: all three)")
    a = ap.parse_args()
    a.cluster_extra, a.app_send = preload_test.fixtures.app_send(a.app_send, a.transport)
    for kv in a.set:
        k, sep, v = kv.partition("=")
        if not sep or not re.fullmatch(r"[a-z_]+", k):
            ap.error(f"--set {kv!r}: expected KEY=VALUE with a cluster setting's name")
        a.cluster_extra += f"  {k} = {v if re.fullmatch(r'[0-9]+', v) else chr(34) + v + chr(34)};\n"
    a.build = os.path.abspath(a.build)
    a.preload = os.path.join(a.build, "meshlib", "preload", "libmesh_preload.so")
    a.preload_env = a.preload
    a.port = 17900 + random.randrange(0, 50) * 2
    for p in ("redis-server", "redis-benchmark"):
        if not shutil.which(p):
            sys.exit(f"preload_bench: {p} is not installed (apt-get install redis-server redis-tools)")
    workdir = tempfile.mkdtemp(prefix="mesh-preload-bench-")
    m = preload_test.Mesh(a, workdir, a.addrs.split())
    e = preload_test.Env(a, m)
    host, port = m.addr[2], 26400 + random.randrange(0, 500)
    rows, echo_rows = [], []
    try:
        m.start()
        if not wait_until(m.up, 30, 0.05):
            sys.exit("preload_bench: the mesh did not come UP")
        cases = [("kernel TCP", None, "tcp"), ("libmesh_preload", a.preload, "mesh"),
                 ("rsocket librspreload", RSOCKET, "rsocket")]
        for name, lib, key in cases:
            if key not in a.cases.split(","):
                continue
            if lib and not os.path.exists(lib):
                rows.append((name, "not installed", "not installed"))
                continue
            env_srv = e.env(2, preload=False)
            env_cli = e.env(1, preload=False)
            if lib:
                env_srv["LD_PRELOAD"] = env_cli["LD_PRELOAD"] = lib
            log = os.path.join(workdir, f"redis-{len(rows)}.log")
            with open(log, "w") as f:
                srv = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "0.0.0.0", "--protected-mode",
                                        "no", "--save", "", "--appendonly", "no", "--dir", workdir], env=env_srv,
                                       stdout=f, stderr=subprocess.STDOUT)
            time.sleep(1.0)
            if a.echo_only:
                rows.append((name, "not run (--echo-only)", "not run (--echo-only)"))
            elif srv.poll() is not None:
                why = f"server exited {srv.returncode}" + (" (SIGSEGV)" if srv.returncode == -11 else "")
                rows.append((name, why, why))
            else:
                rows.append((name, bench(env_cli, host, port, 50, a.requests),
                             bench(env_cli, host, port, 1, max(a.requests // 10, 1000))))
            preload_test.stop(srv)
            port += 1
            echo_rows.append((name, echo_bench(a, m, env_srv, env_cli, host, port, workdir)))
            port += 1
    finally:
        for p in m.proc.values():
            if p.poll() is None:
                p.terminate()
                p.wait()
        shutil.rmtree(workdir, ignore_errors=True)

    base = rows[0] if rows and rows[0][0] == "kernel TCP" else ("", None, None)
    print(f"redis-benchmark requests/s, {a.transport} mesh between {m.addr[1]} and {m.addr[2]}"
          + (", cluster.app_send on" if a.app_send else "") + " (ratio to kernel TCP in brackets)")
    print(f"{'CASE':<22} {'CLIENTS':>7} " + " ".join(f"{t:>20}" for t in ("PING_INLINE", "PING_MBULK", "SET", "GET")))
    for name, r50, r1 in rows:
        for clients, res, ref in ((50, r50, base[1]), (1, r1, base[2])):
            if isinstance(res, str):
                print(f"{name:<22} {clients:>7} {res}")
                continue
            cells = []
            for t in ("PING_INLINE", "PING_MBULK", "SET", "GET"):  # not the "_" entries
                v = res.get(t)
                ratio = f"({v / ref[t]:.2f}x)" if isinstance(ref, dict) and ref.get(t) and v else ""
                cells.append(f"{v:>11.0f} {ratio:>8}" if v else f"{'-':>20}")
            print(f"{name:<22} {clients:>7} " + " ".join(cells))
    print("\nthe machine's CPU over each redis-benchmark run (every process and the kernel's device work "
          "included; idle near 0: the CPUs are the limit, and CPU per request decides)")
    print(f"{'CASE':<22} {'CLIENTS':>7} {'CPU_US/REQ':>16} {'IDLE':>6} {'SOFTIRQ':>8}")
    for name, r50, r1 in rows:
        for clients, res, ref in ((50, r50, base[1]), (1, r1, base[2])):
            if isinstance(res, str) or "_cpu" not in res:
                continue
            busy, idle, soft = res["_cpu"]
            per = busy * 1e6 / res["_requests"]
            ratio = ""
            if isinstance(ref, dict) and "_cpu" in ref:
                ratio = f"({per / (ref['_cpu'][0] * 1e6 / ref['_requests']):.2f}x)"
            print(f"{name:<22} {clients:>7} {per:>8.1f} {ratio:>7} {idle / max(busy + idle, 1e-9):>6.0%} "
                  f"{soft / max(busy, 1e-9):>8.0%}")
    print(f"\nthe test's own blocking echo (preload_echo: 64 B round trips, 64 MiB echoed; ratio to kernel TCP)")
    print(f"{'CASE':<22} {'RTT_US':>16} {'ECHO_MB/S':>18} {'ECHO_CPU_MS/MB':>18} {'IDLE':>6}")
    ebase = echo_rows[0][1] if echo_rows and echo_rows[0][0] == "kernel TCP" else None
    for name, res in echo_rows:
        if isinstance(res, str):
            print(f"{name:<22} {res}")
            continue
        rr = f"({res[0] / ebase[0]:.2f}x)" if isinstance(ebase, tuple) else ""
        br = f"({res[1] / ebase[1]:.2f}x)" if isinstance(ebase, tuple) else ""
        cr = f"({res[2] / ebase[2]:.2f}x)" if isinstance(ebase, tuple) and ebase[2] else ""
        print(f"{name:<22} {res[0]:>8.1f} {rr:>7} {res[1]:>10.1f} {br:>7} {res[2] * 1e3:>10.2f} {cr:>7} {res[3]:>6.0%}")
    print("\nthe 64 MiB echo's CPU-milliseconds per MB by who spent them, as the kernel's per-process accounting "
          "says (REST: what it attributed to none of them; a hint, see --help)")
    print(f"{'CASE':<22} {'ECHO_PROGRAMS':>14} {'MESHD':>8} {'REST':>8}")
    for name, res in echo_rows:
        if isinstance(res, tuple):
            print(f"{name:<22} {res[4] * 1e3:>14.2f} {res[5] * 1e3:>8.2f} {res[6] * 1e3:>8.2f}")
    if not os.listdir("/sys/class/infiniband") if os.path.isdir("/sys/class/infiniband") else True:
        print("note: no RDMA device here: librspreload.so falls back to kernel TCP, so its rows measure TCP")
    return 0


if __name__ == "__main__":
    sys.exit(main())
