#!/usr/bin/env python3
"""meshd under systemd's notify protocol, without systemd: the test binds the datagram socket that
$NOTIFY_SOCKET names and reads what meshd sends (sd_notify(3), through libsystemd).

  1. READY=1 comes once the control socket answers (meshctl works as soon as it is read), with
     STATUS= "node 1: 0 of 1 links UP"; STATUS= follows the count when node 2 comes UP.
  2. With WATCHDOG_USEC=400000: WATCHDOG=1 about every 200 ms (at least 4 in 1.5 s).
  3. A meshd without $NOTIFY_SOCKET (node 2) maps no libsystemd, neither maps libmicrohttpd (no
     metrics address): both are opened only when used.
  4. The log under the journal: node 1's stderr is a stream socket whose device and inode
     $JOURNAL_STREAM names, as systemd connects a service's stderr to journald. Every line starts
     with its sd-daemon priority (<6> info; <4> for the warning, and the rails' state, when node 2
     is killed and the link goes DOWN unexpectedly) and names no function. Node 2 inherits a
     $JOURNAL_STREAM that is not its stderr (a file): no prefixes.
  5. SIGTERM: STOPPING=1, exit 0. A clean stop of both nodes logs no warning on either: node 2's
     DOWN after node 1's goodbye is info, as are node 1's own while it stops.
Prints one line per check and a closing 'N passed, M failed' line; exits 1 on failure.
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402
from fixtures import check, wait_until  # noqa: E402


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
                + fixtures.cluster_key(args.build, work) + '};\n'
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

    # Node 1's stderr as systemd gives a service's: one end of a stream socket, the other end
    # journald's (here a thread that copies what arrives to node 1's log file).
    journal, stream = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    st = os.fstat(stream.fileno())
    journal_stream = f"{st.st_dev}:{st.st_ino}"

    def journald():
        with open(logs[1], "ab", buffering=0) as lf:
            while True:
                data = journal.recv(65536)
                if not data:
                    return
                lf.write(data)
    reader = threading.Thread(target=journald, daemon=True)
    reader.start()

    def start(i, env=None):
        with open(logs[i], "a") as lf:
            err = stream if i == 1 else lf
            procs[i] = subprocess.Popen([meshd, "-c", conf, "-n", str(i), "-s", socks[i]],
                                        env=env, stdin=subprocess.DEVNULL, stdout=lf, stderr=err)

    def lines(i):
        with open(logs[i]) as f:
            return f.read().splitlines()

    # What a line says after its priority and meshd's prefix, and whether a C function's name
    # (snake_case, as slow_path or load_keys) comes first in it.
    def fields(ln):
        m = re.match(r"(<\d>)?meshd\[\d+\] (\w+): (.*)", ln)
        return m.groups() if m else (None, None, ln)

    def names_function(ln):
        return re.match(r"[a-z][a-z0-9]*(_[a-z0-9]+)+: ", fields(ln)[2]) is not None

    try:
        env = dict(os.environ, NOTIFY_SOCKET=nsock, WATCHDOG_USEC="400000", JOURNAL_STREAM=journal_stream)
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

        # Node 2 inherits node 1's $JOURNAL_STREAM, but its stderr is a file.
        env2 = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
        env2["JOURNAL_STREAM"] = journal_stream
        start(2, env2)
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

        # Node 2 killed: an unexpected DOWN, a warning followed by the rails' state (a warning too).
        def count(i, text):
            return sum(text in ln for ln in lines(i))
        procs[2].kill()
        procs[2].wait()
        wait_until(lambda: count(1, "link to node 2 DOWN") == 1, 10)
        start(2, env2)
        up = wait_until(lambda: count(1, "link to node 2 UP") == 2, 20)
        l1 = lines(1)
        prio = [fields(ln)[0] for ln in l1]
        level = {"<3>": "error", "<4>": "warn", "<6>": "info", "<7>": "debug"}
        wrong = [ln for ln in l1 if level.get(fields(ln)[0]) != fields(ln)[1]]
        down = [ln for ln in l1 if ln.startswith("<4>") and "link to node 2 DOWN: " in ln]
        rails = [ln for ln in l1 if ln.startswith("<4>") and "link to node 2, its rails: " in ln]
        check(up and l1 and not wrong and "<6>" in prio and down and rails,
              "under $JOURNAL_STREAM every line of node 1 starts with its priority: <6> info, <4> for the "
              "DOWN when node 2 was killed and the rails' state after it",
              f"{len(l1)} lines, {len(down)} DOWN, {len(rails)} rails; wrong: " + "\n".join((wrong or l1)[:6]))
        fn = [ln for i in (1, 2) for ln in lines(i) if names_function(ln)]
        check(not fn, "no line names the function that wrote it (info level)", "\n".join(fn[:6]))
        l2 = lines(2)
        check(l2 and all(fields(ln)[0] is None and fields(ln)[1] for ln in l2),
              "node 2, whose stderr is not the stream $JOURNAL_STREAM names, writes no priority prefix",
              "\n".join(l2[:4]))

        # A clean stop of both: node 1 says goodbye, node 2 takes the link DOWN at info.
        mark = {i: len(lines(i)) for i in (1, 2)}
        procs[1].send_signal(signal.SIGTERM)
        code = procs[1].wait(timeout=15)
        check(code == 0 and got(lambda t: "STOPPING=1" in t, 2), f"SIGTERM: STOPPING=1, exit {code}")
        procs[2].send_signal(signal.SIGTERM)
        procs[2].wait(timeout=15)
        stream.close()
        reader.join(5)
        after = {i: lines(i)[mark[i]:] for i in (1, 2)}
        warned = [ln for i in (1, 2) for ln in after[i] if fields(ln)[1] in ("warn", "error")]
        bye = [ln for ln in after[2] if "link to node 1 DOWN: node 1 said goodbye" in ln]
        check(not warned and bye and all(fields(ln)[1] == "info" for ln in bye),
              "a clean stop of both nodes logs no warning: node 2's DOWN after the goodbye is info",
              "\n".join(warned[:6] or after[2][:6]))
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
        if not fixtures.failed:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{fixtures.passed} passed, {fixtures.failed} failed")
    return 1 if fixtures.failed else 0


if __name__ == "__main__":
    sys.exit(main())
