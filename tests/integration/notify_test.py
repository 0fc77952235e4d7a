#!/usr/bin/env python3
"""meshd under systemd's notify protocol, without systemd: the test binds the datagram socket that
$NOTIFY_SOCKET names and reads what meshd sends (sd_notify(3), through libsystemd).

  1. READY=1 comes once the control socket answers (meshctl works as soon as it is read), with
     STATUS= "node 1: 0 of 1 links UP"; STATUS= follows the count when node 2 comes UP.
  2. With WATCHDOG_USEC=400000: WATCHDOG=1 about every 200 ms (at least 4 in 1.5 s).
  3. A meshd without $NOTIFY_SOCKET (node 2) maps no libsystemd, neither maps libmicrohttpd (no
     metrics address): both are opened only when used.
  4. SIGTERM: STOPPING=1, exit 0.
Prints one line per check and a closing 'N passed, M failed' line; exits 1 on failure.
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mesh_test  # noqa: E402
from mesh_test import check, wait_until  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--port", type=int, default=17720)
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    work = tempfile.mkdtemp(prefix="mesh-notify-")
    meshd = os.path.join(args.build, "node", "meshd")
    meshctl = os.path.join(args.build, "node", "meshctl")
    conf = os.path.join(work, "mesh.conf")
    with open(conf, "w") as f:
        f.write('cluster = {\n  name = "notify";\n  transport = "tcp";\n  qps_per_link = 2;\n'
                '  keepalive_interval_ms = 300;\n  keepalive_timeout_ms = 3000;\n'
                + mesh_test.cluster_key(args.build, work) + '};\n'
                f'nodes = (\n  {{ id = 1; addr = "127.0.0.1"; port = {args.port}; }},\n'
                f'  {{ id = 2; addr = "127.0.0.1"; port = {args.port + 1}; }}\n);\n')
    nsock = os.path.join(work, "notify.sock")
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(nsock)
    ns.settimeout(0.1)
    msgs = []  # (time, text)

    def read_for(secs):
        end = time.monotonic() + secs
        while time.monotonic() < end:
            try:
                msgs.append((time.monotonic(), ns.recv(4096).decode()))
            except socket.timeout:
                pass

    def got(pred, secs):
        end = time.monotonic() + secs
        while time.monotonic() < end:
            if any(pred(t) for _, t in msgs):
                return True
            read_for(0.1)
        return any(pred(t) for _, t in msgs)

    procs = {}
    logs = {i: os.path.join(work, f"meshd{i}.log") for i in (1, 2)}
    socks = {i: os.path.join(work, f"meshd{i}.sock") for i in (1, 2)}

    def start(i, env=None):
        with open(logs[i], "a") as lf:
            procs[i] = subprocess.Popen([meshd, "-c", conf, "-n", str(i), "-s", socks[i]],
                                        env=env, stdin=subprocess.DEVNULL, stdout=lf, stderr=lf)

    try:
        env = dict(os.environ, NOTIFY_SOCKET=nsock, WATCHDOG_USEC="400000")
        start(1, env)
        ready = got(lambda t: "READY=1" in t, 15)
        answers = subprocess.run([meshctl, "-s", socks[1], "node"], capture_output=True).returncode == 0
        first = next((t for _, t in msgs if "READY=1" in t), "")
        check(ready and answers and "STATUS=node 1: 0 of 1 links UP" in first,
              "READY=1 with STATUS=node 1: 0 of 1 links UP, and the control socket answers at once", repr(msgs[:3]))

        n0 = len(msgs)
        read_for(1.5)
        dogs = [t for _, t in msgs[n0:] if "WATCHDOG=1" in t]
        check(len(dogs) >= 4, f"WATCHDOG_USEC=400000: {len(dogs)} WATCHDOG=1 in 1.5 s (every ~200 ms)")

        start(2, {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"})
        check(got(lambda t: "STATUS=node 1: 1 of 1 links UP" in t, 20),
              "node 2 comes UP: STATUS=node 1: 1 of 1 links UP")

        # meshd opens libsystemd only for a service manager, libmicrohttpd only for a metrics
        # address (neither is configured here): node 2, run by hand, maps neither.
        def libs(i):
            with open(f"/proc/{procs[i].pid}/maps") as f:
                text = f.read()
            return {n for n in ("libsystemd.so", "libmicrohttpd.so", "libgnutls.so") if n in text}
        l1, l2 = libs(1), libs(2)
        check(l1 == {"libsystemd.so"} and not l2,
              f"libsystemd mapped only under NOTIFY_SOCKET, libmicrohttpd not at all: node 1 {sorted(l1)}, "
              f"node 2 {sorted(l2)}")

        procs[1].send_signal(signal.SIGTERM)
        code = procs[1].wait(timeout=15)
        check(code == 0 and got(lambda t: "STOPPING=1" in t, 2), f"SIGTERM: STOPPING=1, exit {code}")
        procs[2].send_signal(signal.SIGTERM)
        procs[2].wait(timeout=15)
        bad = [ln for i in (1, 2) for ln in open(logs[i]).read().splitlines()
               if " error: " in ln or "AddressSanitizer" in ln or "runtime error" in ln]
        check(not bad, "no error lines or sanitizer reports in the meshd logs", "\n".join(bad[:10]))
    except Exception as e:  # noqa: BLE001
        check(False, "test aborted", repr(e))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        ns.close()
        if not mesh_test.failed:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{mesh_test.passed} passed, {mesh_test.failed} failed")
    return 1 if mesh_test.failed else 0


if __name__ == "__main__":
    sys.exit(main())
