#!/usr/bin/env python3
"""Test of libmesh_preload.so: unmodified TCP programs over the mesh.

Two meshd (tcp provider, cluster key) form a mesh; programs that know nothing of the mesh run under
LD_PRELOAD=libmesh_preload.so, the server beside node 2's meshd, the client beside node 1's.

--part echo (no root: node 1 at 127.0.0.1, node 2 at 127.0.0.2, both loopback):
  1. the test's own echo programs (tests/integration/preload_echo.c): a blocking client against a
     blocking server; non-blocking clients through epoll, poll and select against an epoll edge-
     triggered server, at once. Every echo comes back whole, and node 1's link counted the bytes
     (rdmamesh_link_bytes_total): the stream crossed the mesh.
  2. fallbacks: a server without the preload (nobody listens through the mesh) is reached over
     kernel TCP; MESH_PRELOAD=off and a missing meshd (one warning) leave TCP alone. The link
     counts none of those bytes.
--part apps (real programs from Debian; each host a network namespace (root), or with --addrs two
  addresses of this machine (the Soft-RoCE VM, --transport rdma)):
  3. redis-server; `redis-benchmark -t ping,set,get -n 100000 -c 50 -q` completes without error,
     redis-cli reads back values it set (and a client without the preload sees them too).
  4. memcached; memcslap sets and gets, memccp/memccat store and fetch a file checked by hash.
  Both: the link counted at least the bytes the work implies, and the client host's kernel made
  (almost) no TCP connection (/proc/net/snmp ActiveOpens): the traffic crossed the mesh.
--part fork (no root, the loopback pair of --part echo): servers that fork and thread.
  5. the test's own (tests/integration/preload_fork.c): workers forked after listen() and threads of
     one process taking connections with accept4(SOCK_NONBLOCK) from one listener (each worker or
     thread its share, so both accept), a child forked per connection, children forked while a
     connection is open that hold it or close their copy, a child that takes a connection over
     (the parent's copy then says ENOTCONN); every echo whole, over the link.
  6. a daemon: listen, fork (the parent exits), fork a worker that serves.
  7. Debian's nginx with `daemon on; worker_processes 2` (16 keep-alive clients x 25 GETs; meshctl
     lists the held connections' channels), memcached -d -t 2 with memcslap, socat's
     TCP-LISTEN,fork with EXEC:cat; each skipped with the reason where not installed.
Skips (exit 77) with the reason: not root for namespaces. A sanitizer build preloads its runtime
first (leak checks off for Debian's uninstrumented programs).
Prints one line per check and 'N passed, M failed'; exit 1 on failure.
"""
import argparse
import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402
from fixtures import check, wait_until  # noqa: E402


def skip(reason):
    print(f"skip: {reason}", flush=True)
    sys.exit(77)


class Mesh:
    """Two meshd; hosts are namespaces (ns given) or plain addresses of this machine."""

    def __init__(self, a, workdir, addrs, ns=None):
        self.a = a
        self.ns = ns or {1: None, 2: None}
        self.addr = {1: addrs[0], 2: addrs[1]}
        self.sock = {i: os.path.join(workdir, f"meshd{i}.sock") for i in (1, 2)}
        self.log = {i: os.path.join(workdir, f"meshd{i}.log") for i in (1, 2)}
        self.proc = {}
        self.conf = os.path.join(workdir, "mesh.conf")
        with open(self.conf, "w") as f:
            f.write('cluster = {\n  name = "preload";\n'
                    f'  transport = "{a.transport}";\n  qps_per_link = 2;\n'
                    '  keepalive_interval_ms = 500;\n  keepalive_timeout_ms = 5000;\n'
                    '  backoff_initial_ms = 100;\n  backoff_max_ms = 1000;\n  log_level = "info";\n'
                    + getattr(a, "cluster_extra", "") + fixtures.cluster_key(a.build, workdir) + '};\n')
            f.write("nodes = (\n" + ",\n".join(
                f'  {{ id = {i}; addr = "{self.addr[i]}"; port = {a.port + i}; }}' for i in (1, 2)) + "\n);\n")

    def wrap(self, i, cmd):
        return (["ip", "netns", "exec", self.ns[i]] if self.ns[i] else []) + cmd

    def start(self):
        for i in (1, 2):
            with open(self.log[i], "a") as logf:
                self.proc[i] = subprocess.Popen(
                    self.wrap(i, [os.path.join(self.a.build, "node", "meshd"), "-c", self.conf, "-n", str(i),
                                  "-s", self.sock[i]]), stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)

    def ctl(self, i, *what, json_out=True):
        r = subprocess.run([os.path.join(self.a.build, "node", "meshctl")] + (["-j", "-L"] if json_out else ["-L"]) +
                           ["-s", self.sock[i], *what], capture_output=True, text=True, timeout=10)
        if r.returncode:
            return None
        if not json_out:
            return r.stdout
        import json
        return json.loads(r.stdout)

    def up(self):
        for i in (1, 2):
            j = self.ctl(i, "links")
            if not j or [l["state"] for l in j["links"]] != ["UP"]:
                return False
        return True

    def link_counter(self, name):
        """A counter of node 1's link to node 2 (meshctl metrics)."""
        text = self.ctl(1, "metrics", json_out=False) or ""
        return sum(int(v) for v in re.findall(r'^' + name + r'\{peer="2"\} (\d+)', text, re.M))

    def link_bytes(self):
        """Channel payload bytes over node 1's link to node 2, both directions."""
        text = self.ctl(1, "metrics", json_out=False) or ""
        return sum(int(v) for v in re.findall(r'^rdmamesh_link_bytes_total\{peer="2",direction="\w+"\} (\d+)',
                                              text, re.M))

    def ports(self, i):
        j = self.ctl(i, "ports")
        return {p["port"] for p in (j or {}).get("ports", [])}

    def stop(self):
        ok = True
        for p in self.proc.values():
            if p.poll() is None:
                p.terminate()
        for i, p in self.proc.items():
            try:
                rc = p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                rc = None
            ok &= rc == 0
        check(ok, "both meshd stop cleanly on SIGTERM")

    def dump_logs(self):
        for i in (1, 2):
            try:
                with open(self.log[i]) as f:
                    print(f"--- meshd {i} log (last 20 lines)\n" + "".join(f.readlines()[-20:]), end="")
            except OSError:
                pass


class Env:
    def __init__(self, a, m):
        self.a, self.m = a, m

    def env(self, i, preload=True, **extra):
        e = dict(os.environ)
        e["MESH_SOCKET"] = self.m.sock[i]
        e.pop("LD_PRELOAD", None)
        if preload:
            e["LD_PRELOAD"] = self.a.preload_env
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def run(self, i, cmd, preload=True, timeout=120, **extra):
        return subprocess.run(self.m.wrap(i, cmd), env=self.env(i, preload, **extra), capture_output=True,
                              text=True, timeout=timeout)

    def spawn(self, i, cmd, preload=True, log=None, **extra):
        out = open(log, "w") if log else subprocess.DEVNULL
        p = subprocess.Popen(self.m.wrap(i, cmd), env=self.env(i, preload, **extra), stdin=subprocess.DEVNULL,
                             stdout=out, stderr=subprocess.STDOUT if log else subprocess.DEVNULL)
        if log:
            out.close()
        return p


def active_opens(m, i):
    """TCP connections the kernel of host i opened (ActiveOpens of /proc/net/snmp in its namespace)."""
    r = subprocess.run(m.wrap(i, ["cat", "/proc/net/snmp"]), capture_output=True, text=True, timeout=10)
    lines = [l.split() for l in r.stdout.splitlines() if l.startswith("Tcp:")]
    return int(lines[1][lines[0].index("ActiveOpens")])


def own_opens(a, chans):
    """TCP connections host 1's applications open for chans channels of their own: over tcp with
    cluster.app_send (meshd's default, on) each channel's application on host 1 connects once to the
    peer application (the peer's connection to it is a passive open), none over rdma."""
    return chans if a.transport == "tcp" else 0


def finish(p, timeout=20):
    """Waits for a server that serves a given number of connections to end by itself; its exit status, or None
    if it still runs."""
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def stop(p):
    if p and p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def part_echo(a, m, e, workdir):
    echo = os.path.join(a.build, "tests", "integration", "preload_echo")
    host = m.addr[2]
    size = a.bytes

    def bserver_echo(port, client, log):
        """A blocking server for one connection on node 2 and the client command on node 1: whether the server
        listened through the mesh, the client's result, the server's exit status and its log, the link's bytes."""
        before = m.link_bytes()
        srv = e.spawn(2, [echo, "bserver", str(port), "1"], log=os.path.join(workdir, log))
        listening = wait_until(lambda: port in m.ports(2), 10, 0.05)
        r = e.run(1, client)
        status = finish(srv)
        stop(srv)
        return listening, r, status, open(os.path.join(workdir, log)).read()[-600:], m.link_bytes() - before

    # 1. blocking pair, then three non-blocking clients against the epoll server at once
    ok, r, status, log, moved = bserver_echo(a.app_port, [echo, "client", host, str(a.app_port), "block", str(size)],
                                             "bserver.log")
    check(ok, f"a blocking server under the preload listens on port {a.app_port} through the mesh too (meshctl ports)")
    check(r.returncode == 0, f"blocking client: connect, dup, writev/readv, FIONREAD, {size} bytes echoed, EOF",
          (r.stdout + r.stderr).strip()[-600:])
    check(status == 0, "blocking server: accept, read/write until EOF, exit 0", log)
    check(moved >= 2 * size, f"the link counted the blocking echo: {moved} bytes >= {2 * size}")

    # 1b. a reader thread and a writer thread on one blocking socket at once: one's wait must never take the
    # other's wake-up (the Go binding stalled so); the blocking server echoes as it reads
    port = a.app_port + 7
    _, r, status, log, moved = bserver_echo(port, [echo, "duplex", host, str(port), str(2 * size)],
                                            "duplex-server.log")
    check(r.returncode == 0, f"two threads on one socket, writing and reading at once: {2 * size} bytes echoed",
          (r.stdout + r.stderr).strip()[-600:])
    check(status == 0, "the blocking server echoed the duplex client until EOF, exit 0", log)
    check(moved >= 4 * size, f"the link counted the duplex echo: {moved} bytes >= {4 * size}")

    # 2. a client beside its server (node 2 to its own address, then to a loopback address of no node): a channel to the
    # local node, ring to ring in node 2's meshd, nothing on the link
    before = m.link_bytes()
    for k, target in enumerate((host, "127.0.0.9" if ":" not in host else "::1")):
        port = a.app_port + 5 + k
        srv = e.spawn(2, [echo, "bserver", str(port), "1"], log=os.path.join(workdir, f"local{k}.log"))
        wait_until(lambda: port in m.ports(2), 10, 0.05)
        r = e.run(2, [echo, "client", target, str(port), "block", str(size)], MESH_PRELOAD_DEBUG="1")
        out = (r.stdout + r.stderr).strip()
        check(r.returncode == 0 and re.search(rf"channel \d+ to node 2 port {port}", out),
              f"a client on node 2 connecting to {target} (its own node) gets a local channel: {size} bytes echoed",
              out[-600:])
        finish(srv)
        stop(srv)
    moved = m.link_bytes() - before
    check(moved == 0, f"the same-node echoes never crossed the link ({moved} bytes)")

    before = m.link_bytes()
    port = a.app_port + 1
    srv = e.spawn(2, [echo, "server", str(port), "3"], log=os.path.join(workdir, "server.log"))
    wait_until(lambda: port in m.ports(2), 10, 0.05)
    clients = {mode: subprocess.Popen(m.wrap(1, [echo, "client", host, str(port), mode, str(size), "4000"]),
                                      env=e.env(1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for mode in ("epoll", "poll", "select")}
    for mode, p in clients.items():
        try:
            out = p.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            out = p.communicate()[0] + " (timed out)"
        check(p.returncode == 0, f"non-blocking client through {mode}: EINPROGRESS, writable, SO_ERROR 0, "
              f"{size} bytes echoed, EOF", out.strip()[-600:])
    check(finish(srv) == 0, "epoll edge-triggered server: 3 connections echoed and closed, exit 0",
          open(os.path.join(workdir, "server.log")).read()[-600:])
    stop(srv)
    moved = m.link_bytes() - before
    check(moved >= 6 * size, f"the link counted the three echoes: {moved} bytes >= {6 * size}")

    # 2. fallbacks: nothing of these crosses the mesh
    before = m.link_bytes()
    port = a.app_port + 2
    srv = e.spawn(2, [echo, "bserver", str(port), "1"], preload=False, log=os.path.join(workdir, "plain.log"))
    time.sleep(0.3)
    r = e.run(1, [echo, "client", host, str(port), "block", "100000"])
    check(r.returncode == 0, "a server without the preload (nobody listens through the mesh): the client falls "
          "back to kernel TCP", (r.stdout + r.stderr).strip()[-400:])
    stop(srv)
    srv = e.spawn(2, [echo, "bserver", str(port), "1"], log=os.path.join(workdir, "off.log"))
    wait_until(lambda: port in m.ports(2), 10, 0.05)
    r = e.run(1, [echo, "client", host, str(port), "block", "100000"], MESH_PRELOAD="off")
    check(r.returncode == 0, "MESH_PRELOAD=off: the client uses kernel TCP", (r.stdout + r.stderr).strip()[-400:])
    stop(srv)
    srv = e.spawn(2, [echo, "bserver", str(port), "1"], log=os.path.join(workdir, "ports.log"))
    wait_until(lambda: port in m.ports(2), 10, 0.05)
    r = e.run(1, [echo, "client", host, str(port), "block", "100000"], MESH_PRELOAD_PORTS="6379,11211")
    check(r.returncode == 0, "MESH_PRELOAD_PORTS without the port: kernel TCP", (r.stdout + r.stderr).strip()[-400:])
    stop(srv)
    srv = e.spawn(2, [echo, "bserver", str(port), "1"], preload=False, log=os.path.join(workdir, "nomeshd.log"))
    time.sleep(0.3)
    r = e.run(1, [echo, "client", host, str(port), "block", "100000"], MESH_SOCKET=os.path.join(workdir, "none.sock"))
    warns = [l for l in r.stderr.splitlines() if "no meshd" in l]
    check(r.returncode == 0 and len(warns) == 1, "no meshd: plain TCP with exactly one warning",
          (r.stdout + r.stderr).strip()[-400:])
    stop(srv)
    moved = m.link_bytes() - before
    check(moved == 0, f"none of the fallback traffic crossed the mesh ({moved} bytes)")


def part_apps(a, m, e, workdir):
    host = m.addr[2]
    missing = [p for p in ("redis-server", "redis-benchmark", "redis-cli") if not shutil.which(p)]
    if missing:
        check(False, f"{', '.join(missing)} not installed (deploy/install-deps.sh installs redis-server, redis-tools)")
        return
    # 3. redis
    port = a.app_port
    srv = e.spawn(2, ["redis-server", "--port", str(port), "--bind", "0.0.0.0", "--protected-mode", "no",
                      "--save", "", "--appendonly", "no", "--dir", workdir, "--daemonize", "no"],
                  log=os.path.join(workdir, "redis.log"))
    up = wait_until(lambda: port in m.ports(2), 15, 0.05)
    check(up, f"redis-server under the preload listens on port {port} through the mesh too")
    opens, before, chans = active_opens(m, 1), m.link_bytes(), m.link_counter("rdmamesh_link_channels_opened_total")
    t0 = time.monotonic()
    r = e.run(1, ["redis-benchmark", "-h", host, "-p", str(port), "-t", "ping,set,get", "-n", str(a.requests),
                  "-c", "50", "-q"], timeout=600)
    secs = time.monotonic() - t0
    lines = [l.strip() for l in re.split(r"[\r\n]", r.stdout) if "requests per second" in l]
    bad = [l for l in (r.stdout + r.stderr).splitlines() if re.search(r"error|Error|ERR", l)]
    check(r.returncode == 0 and len(lines) == 4 and not bad,
          f"redis-benchmark -t ping,set,get -n {a.requests} -c 50 -q: 4 tests, no error ({secs:.1f} s)",
          (r.stdout[-800:] + r.stderr[-800:]))
    for l in lines:
        print(f"#   {l}")
    vals = {f"preload:key:{i}": hashlib.sha256(str(i).encode()).hexdigest() for i in range(20)}
    for k, v in vals.items():
        r = e.run(1, ["redis-cli", "-h", host, "-p", str(port), "set", k, v])
        if r.stdout.strip() != "OK":
            break
    got = {k: e.run(1, ["redis-cli", "-h", host, "-p", str(port), "get", k]).stdout.strip() for k in vals}
    check(got == vals, "redis-cli sets 20 values and reads them back through the mesh",
          str({k: v for k, v in got.items() if vals[k] != v})[:400])
    r = e.run(1, ["redis-cli", "-h", host, "-p", str(port), "get", "preload:key:7"], preload=False)
    check(r.stdout.strip() == vals["preload:key:7"], "a redis-cli without the preload (kernel TCP) sees the same values")
    moved, opened = m.link_bytes() - before, active_opens(m, 1) - opens
    chans = m.link_counter("rdmamesh_link_channels_opened_total") - chans
    want = a.requests * 3 * 20
    check(moved >= want, f"the link counted the redis traffic: {moved} bytes >= {want}")
    # the one kernel connection is the plain redis-cli above; a few fallbacks may join it
    check(opened - own_opens(a, chans) <= 5, f"host 1's kernel opened {opened} TCP connections for about {50 * 4 + 41} "
          f"made by the clients, {own_opens(a, chans)} of them the applications' own for {chans} channels "
          "(cluster.app_send over tcp): the rest were channels")
    if a.transport == "rdma":
        # cluster.app_send (on by default): each channel's application posts on a QP of its own, but
        # all of a process's channels on a device share one verbs context (aq_verbs.c, struct aq_dev): a
        # server's thousand connections must not cost it thousands of descriptors.
        code = ("import os, socket\n"
                f"s = [socket.create_connection(('{host}', {port})) for _ in range(20)]\n"
                "for c in s:\n    c.sendall(b'PING\\r\\n')\n    assert c.recv(64) == b'+PONG\\r\\n'\n"
                "def dev(f):\n    try:\n        return os.readlink('/proc/self/fd/' + f).startswith('/dev/infiniband/')\n"
                "    except OSError:\n        return False\n"
                "print(sum(dev(f) for f in os.listdir('/proc/self/fd')))\n")
        r = e.run(1, [sys.executable, "-c", code])
        n = r.stdout.strip()
        check(r.returncode == 0 and n == "1", f"20 preloaded connections of one process ping redis, and hold "
              f"{n or '?'} descriptor(s) of the RDMA device between them (one shared context)", r.stderr[-600:])
    stop(srv)

    # 4. memcached
    missing = [p for p in ("memcached", "memcslap", "memccp", "memccat") if not shutil.which(p)]
    if missing:
        check(False, f"{', '.join(missing)} not installed (deploy/install-deps.sh installs memcached, "
              "libmemcached-tools)")
        return
    port = a.app_port + 1
    srv = e.spawn(2, ["memcached", "-u", "root" if os.geteuid() == 0 else os.environ.get("USER", "nobody"),
                      "-p", str(port), "-U", "0", "-l", "0.0.0.0", "-t", "2", "-m", "256", "-I", "8m"],
                  log=os.path.join(workdir, "memcached.log"))
    up = wait_until(lambda: port in m.ports(2), 15, 0.05)
    check(up, f"memcached under the preload listens on port {port} through the mesh too")
    opens, before, chans = active_opens(m, 1), m.link_bytes(), m.link_counter("rdmamesh_link_channels_opened_total")
    server = f"--servers={host}:{port}"
    ok, out = True, ""
    for test in ("set", "get"):
        r = e.run(1, ["memcslap", server, "--concurrency=8", f"--execute-number={a.mc_ops}", f"--test={test}"],
                  timeout=300)
        ok &= r.returncode == 0 and "Failure" not in r.stdout + r.stderr
        out += r.stdout + r.stderr
        secs = re.search(r"Time to \w+ +(\d+) keys by +8 threads: +([\d.]+) seconds", r.stdout + r.stderr)
        if secs:
            print(f"#   memcslap {test}: {secs.group(1)} keys by 8 threads in {secs.group(2)} s")
    check(ok, f"memcslap: 8 clients x {a.mc_ops} sets, then gets, without failure", out[-600:])
    blob = os.path.join(workdir, "blob.bin")
    with open(blob, "wb") as f:
        f.write(random.randbytes(4 << 20))
    digest = hashlib.sha256(open(blob, "rb").read()).hexdigest()
    r = e.run(1, ["memccp", server, blob])
    ok = r.returncode == 0
    r2 = subprocess.run(m.wrap(1, ["memccat", server, "blob.bin"]), env=e.env(1), capture_output=True, timeout=60)
    value = r2.stdout[:-1] if r2.stdout.endswith(b"\n") else r2.stdout  # memccat ends the value with a newline
    check(ok and hashlib.sha256(value).hexdigest() == digest,
          "memccp stores a 4 MiB file and memccat fetches it back, same SHA-256", (r.stderr + r2.stderr.decode())[-400:])
    moved, opened = m.link_bytes() - before, active_opens(m, 1) - opens
    chans = m.link_counter("rdmamesh_link_channels_opened_total") - chans
    want = 2 * (4 << 20)
    check(moved >= want, f"the link counted the memcached traffic: {moved} bytes >= {want}")
    check(opened - own_opens(a, chans) <= 5, f"host 1's kernel opened {opened} TCP connections, "
          f"{own_opens(a, chans)} of them the applications' own for {chans} channels (cluster.app_send over tcp): "
          "the clients' were channels")
    stop(srv)


def pids_of(log):
    """The processes that took connections, by their "accepted pid N" lines."""
    try:
        return re.findall(r"accepted pid (\d+)", open(log).read())
    except OSError:
        return []


def tail(path, n=600):
    try:
        return open(path, errors="replace").read()[-n:]
    except OSError:
        return ""


def clients_run(a, m, e, port, n, size):
    """n blocking preload_echo clients on node 1 at once, size bytes each: the failed ones' output."""
    echo = os.path.join(a.build, "tests", "integration", "preload_echo")
    procs = [subprocess.Popen(m.wrap(1, [echo, "client", m.addr[2], str(port), "block", str(size)]), env=e.env(1),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(n)]
    bad = []
    for p in procs:
        try:
            out = p.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            out = p.communicate()[0] + " (timed out)"
        if p.returncode != 0:
            bad.append(out.strip()[-300:])
    return bad


def channels_held(a, m, e, port, n, request=b""):
    """n connections from node 1 held open at once (each sends request and reads an answer when one is
    given): the number of node 2's channels to port that meshctl lists meanwhile, and the error, if any."""
    code = ("import socket, sys\n"
            f"s = [socket.create_connection(('{m.addr[2]}', {port}), timeout=30) for _ in range({n})]\n"
            f"req = {request!r}\n"
            "for c in s:\n    if req:\n        c.sendall(req)\n        assert c.recv(4096)\n"
            "print('held', flush=True)\nsys.stdin.readline()\n")
    p = subprocess.Popen(m.wrap(1, [sys.executable, "-c", code]), env=e.env(1), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        j = m.ctl(2, "channels") if "held" in line else None
        seen = len([c for c in (j or {}).get("channels", []) if c.get("local_port") == port])
        p.stdin.write("\n")
        p.stdin.flush()
        err = p.communicate(timeout=30)[1]
    except (subprocess.TimeoutExpired, OSError) as ex:
        p.kill()
        p.wait()
        return 0, repr(ex)
    return seen, ("" if p.returncode == 0 else err[-400:])


def part_fork(a, m, e, workdir):
    fork = os.path.join(a.build, "tests", "integration", "preload_fork")
    size = 1 << 20
    # 5. the test's own forking and threaded servers: (case, server arguments after the port, clients, what)
    cases = (
        ("prefork", ["2", "3"], 6, "listen, fork 2 workers that accept4(SOCK_NONBLOCK) 3 connections each on the "
         "shared listener"),
        ("threads", ["2", "3"], 6, "2 threads of one process accept4(SOCK_NONBLOCK) 3 connections each on one listener"),
        ("perconn", ["4"], 4, "a child forked per accepted connection serves it; the parent closes its copy"),
        ("bgsave", [], 1, "children forked while a connection is open hold it or close their copy; the parent's "
         "echo goes on"),
        ("steal", [], 1, "a child forked after the first echo serves the rest; the parent's copy says ENOTCONN"),
    )
    for k, (case, args, n, what) in enumerate(cases):
        port = a.app_port + 20 + k
        log = os.path.join(workdir, f"fork-{case}.log")
        before = m.link_bytes()
        srv = e.spawn(2, [fork, case, str(port), *args], log=log)
        listening = wait_until(lambda: port in m.ports(2), 10, 0.05)
        bad = clients_run(a, m, e, port, n, size) if listening else ["no mesh listener"]
        status = finish(srv, 60)
        stop(srv)
        moved = m.link_bytes() - before
        pids = pids_of(log)
        ok = listening and not bad and status == 0 and moved >= 2 * n * size
        if case == "prefork":
            ok &= len(set(pids)) == 2 and len(pids) == n
        elif case == "perconn":
            ok &= len(set(pids)) == n
        check(ok, f"{case}: {what}: {n} x {size} bytes echoed over the mesh ({moved} bytes on the link, "
              f"{len(set(pids))} process(es) accepted), exit 0", f"server exit {status}; clients: {bad[:2]}; "
              f"server log: {tail(log)}")

    # 6. a daemon: listen, fork (the parent exits), fork a worker (the second fork hung on the table's lock)
    port = a.app_port + 30
    pidfile = os.path.join(workdir, "daemon")
    log = os.path.join(workdir, "fork-daemon.log")
    srv = e.spawn(2, [fork, "daemon", str(port), "2", pidfile], log=log)  # its output a file: the daemon keeps it
    status = finish(srv, 30)
    listening = status == 0 and wait_until(lambda: port in m.ports(2), 10, 0.05)
    bad = clients_run(a, m, e, port, 2, size) if listening else ["no mesh listener"]
    done = wait_until(lambda: os.path.exists(pidfile + ".done") and open(pidfile + ".done").read().strip(), 30, 0.1)
    check(listening and not bad and done == "ok", "a daemon (fork, the parent exits, fork a worker) serves 2 "
          "connections over the mesh", f"exit {status}, {tail(log)}; clients {bad[:2]}; worker {done!r}")

    # 7. Debian's forking and threaded servers, where installed (skipped with the reason otherwise)
    fork_nginx(a, m, e, workdir)
    fork_memcached(a, m, e, workdir)
    fork_socat(a, m, e, workdir)


def skip_case(what, why):
    print(f"skip {what}: {why}", flush=True)


def fork_nginx(a, m, e, workdir):
    if not shutil.which("nginx"):
        skip_case("nginx daemon on, 2 workers", "nginx not installed (deploy/install-deps.sh installs nginx-light)")
        return
    port = a.app_port + 31
    d = os.path.join(workdir, "nginx")
    os.makedirs(d, exist_ok=True)
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"daemon on;\nworker_processes 2;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n"
                "events { worker_connections 256; }\nhttp {\n"
                f"  log_format w '$pid $status';\n  access_log {d}/access.log w;\n"
                + "".join(f"  {t}_temp_path {d};\n" for t in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
                + f"  server {{ listen {port}; location / {{ return 200 \"hello from nginx\\n\"; }} }}\n}}\n")
    r = e.run(2, ["nginx", "-c", conf, "-p", d, "-e", os.path.join(d, "error.log")], timeout=30)
    try:
        up = r.returncode == 0 and wait_until(lambda: port in m.ports(2), 15, 0.05)
        check(up, f"nginx (daemon on, 2 workers) under the preload listens on port {port} through the mesh too",
              r.stderr[-400:] + tail(os.path.join(d, "error.log")))
        if not up:
            return
        before = m.link_bytes()
        code = ("import http.client, threading\nok = []\n"
                "def run():\n"
                f"    c = http.client.HTTPConnection('{m.addr[2]}', {port}, timeout=30)\n"
                "    for _ in range(25):\n        c.request('GET', '/')\n        r = c.getresponse()\n"
                "        ok.append(r.status == 200 and r.read() == b'hello from nginx\\n')\n"
                "t = [threading.Thread(target=run) for _ in range(16)]\n"
                "[x.start() for x in t]\n[x.join() for x in t]\nprint(sum(ok), len(ok))\n")
        r = e.run(1, [sys.executable, "-c", code], timeout=180)
        got = r.stdout.split()
        check(r.returncode == 0 and got == ["400", "400"], f"16 keep-alive clients x 25 GETs to nginx's forked "
              f"workers: {' of '.join(got) or 'none'} answered 200 with the body", r.stderr[-400:])
        moved = m.link_bytes() - before
        check(moved >= 400 * 40, f"the link counted nginx's traffic: {moved} bytes")
        try:
            served = {}
            for line in open(os.path.join(d, "access.log")):
                served[line.split()[0]] = served.get(line.split()[0], 0) + 1
        except OSError:
            served = {}
        print(f"#   requests served per nginx worker: {sorted(served.values())}")
        seen, err = channels_held(a, m, e, port, 4, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        check(seen >= 4 and not err, f"meshctl on node 2 lists the channels of 4 connections held to nginx's "
              f"workers ({seen})", err)
    finally:
        pid = None
        try:
            pid = int(open(os.path.join(d, "nginx.pid")).read())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            pass
        gone = wait_until(lambda: port not in m.ports(2), 15, 0.1)
        if pid and not gone:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        check(gone, "nginx stopped; its listener left meshd")


def fork_memcached(a, m, e, workdir):
    missing = [p for p in ("memcached", "memcslap") if not shutil.which(p)]
    if missing:
        skip_case("memcached -d -t 2", f"{', '.join(missing)} not installed (deploy/install-deps.sh installs "
                  "memcached, libmemcached-tools)")
        return
    port = a.app_port + 32
    pidfile = os.path.join(workdir, "memcached.pid")
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "nobody")
    r = e.run(2, ["memcached", "-d", "-P", pidfile, "-u", user, "-p", str(port), "-U", "0", "-l", "0.0.0.0",
                  "-t", "2", "-m", "64"], timeout=30)
    try:
        up = r.returncode == 0 and wait_until(lambda: port in m.ports(2), 15, 0.05)
        check(up, f"memcached -d -t 2 (a daemon: it forks, the parent exits) listens on port {port} through the "
              "mesh too", r.stderr[-400:])
        if not up:
            return
        before = m.link_bytes()
        ok, out = True, ""
        for test in ("set", "get"):
            r = e.run(1, ["memcslap", f"--servers={m.addr[2]}:{port}", "--concurrency=8", "--execute-number=500",
                          f"--test={test}"], timeout=300)
            ok &= r.returncode == 0 and "Failure" not in r.stdout + r.stderr
            out += r.stdout + r.stderr
        moved = m.link_bytes() - before
        check(ok and moved > 8 * 500 * 20, f"memcslap: 8 clients x 500 sets, then gets, against the daemon over "
              f"the mesh ({moved} bytes on the link)", out[-600:])
    finally:
        try:
            os.kill(int(open(pidfile).read()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        check(wait_until(lambda: port not in m.ports(2), 15, 0.1), "memcached stopped; its listener left meshd")


def fork_socat(a, m, e, workdir):
    if not shutil.which("socat"):
        skip_case("socat fork", "socat not installed (deploy/install-deps.sh installs socat)")
        return
    port = a.app_port + 33
    log = os.path.join(workdir, "socat.log")
    srv = e.spawn(2, ["socat", f"TCP-LISTEN:{port},fork,reuseaddr", "EXEC:cat"], log=log)
    try:
        up = wait_until(lambda: port in m.ports(2), 15, 0.05)
        check(up, f"socat TCP-LISTEN:{port},fork EXEC:cat under the preload listens through the mesh too", tail(log))
        if not up:
            return
        before = m.link_bytes()
        bad = clients_run(a, m, e, port, 4, 1 << 20)
        moved = m.link_bytes() - before
        check(not bad and moved >= 8 << 20, f"4 clients at once through socat's child per connection (it execs "
              f"cat): 1 MiB each echoed over the mesh ({moved} bytes on the link)", f"{bad[:2]} {tail(log)}")
    finally:
        stop(srv)


def sanitizer_preload(a):
    """The LD_PRELOAD value: the library alone, or behind the sanitizer runtime it was built with.
    None (with the reason) when that cannot work."""
    r = subprocess.run(["ldd", a.preload], capture_output=True, text=True)
    asan = re.search(r"(\S*libasan\.so\S*) => (\S+)", r.stdout)
    if not asan:
        return a.preload, None
    # The sanitizer runtime goes first; Debian's programs are not instrumented, so their own leaks at
    # exit (memcached's) are not ours to report: leak checking stays on for the test's own programs.
    # (Appended: the sanitizer takes the last of a repeated option, and the test command runs ctest
    # with detect_leaks=1, which put first would have won: python's own leaks at exit then failed
    # the fork part's clients under the sanitizer build.)
    if a.part in ("apps", "fork"):
        os.environ["ASAN_OPTIONS"] = os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    return f"{asan.group(2)}:{a.preload}", None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--part", choices=("echo", "apps", "fork"), default="echo")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--addrs", default=None, help="two addresses of this machine instead of namespaces")
    ap.add_argument("--port", type=int, default=None, help="meshd's ports are PORT+1 and PORT+2")
    ap.add_argument("--app-port", type=int, default=None)
    ap.add_argument("--bytes", type=int, default=32 << 20)
    ap.add_argument("--requests", type=int, default=100000)
    ap.add_argument("--mc-ops", type=int, default=5000)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    a.preload = os.path.join(a.build, "meshlib", "preload", "libmesh_preload.so")
    a.port = a.port or 17500 + random.randrange(0, 400) * 2
    a.app_port = a.app_port or 26000 + random.randrange(0, 1000) * 4
    if not os.path.exists(a.preload):
        print(f"FAIL {a.preload} not built\n0 passed, 1 failed")
        return 1
    a.preload_env, why = sanitizer_preload(a)
    if why:
        skip(why)

    net = None
    if a.part in ("echo", "fork") and not a.addrs:
        a.addrs = "127.0.0.1 127.0.0.2"
    if a.addrs:
        addrs, ns = a.addrs.split(), None
    else:
        import netns_test
        tag = f"mtn{os.getpid()}x{random.randrange(16 ** 4):04x}"
        netns_test.preflight(tag)
        netns_test.reap_stale()
        net = netns_test.Net(tag, 2, random.randrange(1, 255))
        addrs, ns = [net.addr[1], net.addr[2]], dict(net.hosts)
    workdir = tempfile.mkdtemp(prefix="mesh-preload-" + (tag + "-" if net else ""))
    m = None
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        if net:
            net.setup()
        m = Mesh(a, workdir, addrs, ns)
        m.start()
        up = wait_until(m.up, 30, 0.05)
        check(up, f"two meshd ({a.transport}) at {addrs[0]} and {addrs[1]}: the link is UP")
        if not up:
            raise RuntimeError("no mesh")
        e = Env(a, m)
        {"echo": part_echo, "apps": part_apps, "fork": part_fork}[a.part](a, m, e, workdir)
        m.stop()
    except (RuntimeError, OSError, subprocess.TimeoutExpired, KeyboardInterrupt) as ex:
        check(False, f"test aborted: {ex!r}")
    finally:
        if m:
            for p in m.proc.values():
                if p.poll() is None:
                    p.kill()
            if fixtures.failed:
                m.dump_logs()
        if net:
            net.cleanup()
        if a.keep:
            print(f"# kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"{fixtures.passed} passed, {fixtures.failed} failed")
    return 1 if fixtures.failed else 0


if __name__ == "__main__":
    sys.exit(main())
