"""The shared fixtures of the Python tests (tests/README.md): one meshd cluster on this machine
(Cluster: configuration, start, meshctl -j, links, stop; meshctl_json for a script's own cluster),
the checks every script counts (check, and the passed/failed counters every script reports), waits
(wait_until, sleep_watch), a fresh cluster key (cluster_key), the cluster.app_send line (app_send)
and meshctl's timeout (CTL_TIMEOUT_S). A test script imports this module; mesh_test.py is a test
like the others.

The counters live here only: a script reports fixtures.passed and fixtures.failed (mesh_test.passed
and mesh_test.failed name the same two counters), so every check of a run is counted once.
"""
import json
import os
import subprocess
import time

passed = failed = 0


# How long a test waits for one meshctl: generous, since -L waits for a busy data path.
CTL_TIMEOUT_S = 60


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {what}", flush=True)
    else:
        failed += 1
        print(f"FAIL {what}{': ' + detail if detail else ''}", flush=True)
    return ok


def app_send(value, transport):
    """cluster.app_send as a test's --app-send asked for it (None: meshd's default, on, as
    node/meshd/config.c says): the config line to write (empty for the default), and whether the
    applications post their own writes (over rdma on a QP of their own, over tcp on a connection of
    their own)."""
    line = f'  app_send = "{value}";\n' if value else ""
    return line, (value or "on") == "on"


def cluster_key(build, workdir, name="cluster.key"):
    """A fresh cluster key from `meshctl keygen` in workdir/name (mode 600), and the cluster line that
    names it (relative to a configuration file in workdir): the tests run keyed, as a cluster should."""
    # Bounded: in a freshly booted VM the kernel's random pool may not be ready yet, and a silent
    # wait there would leave a VM test with no output at all until its timeout.
    key = subprocess.run([os.path.join(build, "node", "meshctl"), "keygen"], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    path = os.path.join(workdir, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return f'  key_file = "{name}";\n'


def sleep_watch(seconds, step=0.02):
    """Sleeps, and returns the longest time between two of its wake-ups: a stall of the whole
    machine (a VM its host did not run) shows as a gap far longer than step."""
    end = last = time.monotonic()
    end += seconds
    gap = 0.0
    while True:
        now = time.monotonic()
        gap = max(gap, now - last)
        last = now
        if now >= end:
            return gap
        time.sleep(min(step, end - now))


def wait_until(pred, timeout, step=0.1):
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > end:
            return v
        time.sleep(step)


def chan_test(build, sock, *args, enter=()):
    """tests/integration/chan_test against the meshd at sock (enter: a command prefix, as
    `ip netns exec NS`), its output read as text."""
    return subprocess.Popen([*enter, os.path.join(build, "tests", "integration", "chan_test"), "-s", sock,
                             *map(str, args)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def chan_receiver(build, sock, port, enter=()):
    """chan_test recv on port, once it listens (its first line says so)."""
    r = chan_test(build, sock, "recv", port, 1, enter=enter)
    line = r.stdout.readline()
    if "listening" not in line:
        raise RuntimeError(f"chan_test recv at {sock} port {port}: {line.strip()}")
    return r


def finish(proc, timeout):
    """A chan_test's exit status and output; ("hung", the end of its output) when it did not end within
    timeout (it is killed)."""
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "hung", proc.stdout.read().strip()[-2000:]
    return rc, proc.stdout.read().strip()


def meshctl_json(meshctl, sock, i, *what):
    """meshctl -j -L WHAT on node i's socket, decoded; None when it failed or did not answer. -L
    waits for the data path, and meshctl waits 5 s for each page: a machine busy with the sanitizer
    build under emulation took more than 10 s for a listing of many pages. The bound is generous and
    says what it waited for."""
    try:
        r = subprocess.run([meshctl, "-j", "-L", "-s", sock, *what], capture_output=True, text=True,
                           timeout=CTL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"# meshctl {' '.join(what)} on node {i}: no reply within {CTL_TIMEOUT_S} s", flush=True)
        return None
    if r.returncode != 0:
        return None
    return json.loads(r.stdout)


class Cluster:
    def __init__(self, args, workdir):
        self.a = args
        self.dir = workdir
        self.n = args.nodes
        addrs = args.addrs.split()
        self.nodes = {}
        for i in range(1, self.n + 1):
            addr = addrs[(i - 1) % len(addrs)]
            port = args.base_port + (i if len(addrs) == 1 else 0)
            self.nodes[i] = dict(addr=addr, port=port, sock=os.path.join(workdir, f"meshd{i}.sock"),
                                 log=os.path.join(workdir, f"meshd{i}.log"), proc=None, conf=None)
        self.conf = os.path.join(workdir, "mesh.conf")
        with open(self.conf, "w") as f:
            f.write('cluster = {\n  name = "itest";\n'
                    f'  transport = "{args.transport}";\n  qps_per_link = {args.qps};\n'
                    f'  keepalive_interval_ms = {args.ka_interval};\n  keepalive_timeout_ms = {args.ka_timeout};\n'
                    '  connect_timeout_ms = 4000;\n  handshake_timeout_ms = 20000;\n'
                    '  backoff_initial_ms = 100;\n  backoff_max_ms = 2000;\n  log_level = "info";\n'
                    + cluster_key(args.build, workdir) + getattr(args, "cluster_extra", "") + '};\n')
            # node_extra: {node id: 'key = value; ...'} for tests that configure nodes apart
            extra = getattr(args, "node_extra", {})
            f.write("nodes = (\n" + ",\n".join(
                f'  {{ id = {i}; addr = "{v["addr"]}"; port = {v["port"]}; {extra.get(i, "")}}}'
                for i, v in self.nodes.items()) + "\n);\n")

    def bin(self, name):
        return os.path.join(self.a.build, "node", name)

    def start(self, i):
        nd = self.nodes[i]
        logf = open(nd["log"], "a")
        nd["proc"] = subprocess.Popen([self.bin("meshd"), "-c", nd["conf"] or self.conf, "-n", str(i), "-s", nd["sock"]],
                                      stdout=logf, stderr=logf)
        logf.close()

    def ctl(self, i, *what):
        """meshctl -j -L WHAT on node i, decoded (meshctl_json)."""
        return meshctl_json(self.bin("meshctl"), self.nodes[i]["sock"], i, *what)

    def links(self, i):
        j = self.ctl(i, "links")
        return {l["peer"]: l for l in j["links"]} if j else None

    def all_up(self, nodes=None):
        for i in nodes or self.nodes:
            ls = self.links(i)
            if not ls or len(ls) != self.n - 1:
                return False
            for l in ls.values():
                if l["state"] != "UP" or l["qps"] != self.a.qps or not l["mailbox"]["rkey"] \
                        or not l["mailbox"]["addr"] or l["mailbox"]["len"] < 512:
                    return False
        return True

    def stop_all(self):
        """SIGTERM to every meshd still running; True when each exited 0 (a check per node)."""
        ok = True
        for nd in self.nodes.values():
            if nd["proc"] and nd["proc"].poll() is None:
                nd["proc"].terminate()
        for i, nd in self.nodes.items():
            if nd["proc"]:
                try:
                    rc = nd["proc"].wait(timeout=10)
                except subprocess.TimeoutExpired:
                    nd["proc"].kill()
                    nd["proc"].wait()
                    rc = None
                ok &= check(rc == 0, f"meshd {i} stops cleanly on SIGTERM (exit {rc})")
        return ok

    def dump_logs(self):
        for i, nd in self.nodes.items():
            if not os.path.exists(nd["log"]):
                continue
            print(f"--- meshd {i} log (last 30 lines)")
            with open(nd["log"]) as f:
                print("".join(f.readlines()[-30:]), end="")
