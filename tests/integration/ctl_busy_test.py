#!/usr/bin/env python3
"""The control socket while meshd's data path cannot answer (tcp provider on loopback, no root).

meshd's data path holds the mesh's lock for whole batches of link work; under a handshake storm on
a loaded machine a batch took seconds, and every `meshctl` call waited behind it. The control
socket now has its own thread. To hold the data path inside its lock for as long as the test
wants, the test does what a stalled journald does to a daemon: meshd's stderr is a pipe of 4 KiB
that nobody reads, and node 9 dials 8 peers that refuse at once, every few milliseconds, logging
each time, so the data-path thread soon sleeps in pipe_write with the lock held.

  1. The data-path thread is blocked writing its log (/proc/PID/task/TID/wchan).
  2. `meshctl node` and `meshctl links` answer anyway (20 calls each; the slowest is printed, not
     asserted), from the snapshot the data path published (from_snapshot, snapshot_age_ms, a note
     on stderr), with every configured link.
  3. `meshctl channels` (not in the snapshot) waits for the data path, and so does `meshctl -L node`
     (live asked for): neither fails.
  4. The pipe is read again: both answer, and the next `meshctl node` is live, counting the
     snapshot and queued replies.
  5. SIGTERM: meshd exits 0.
Before the control thread, step 2 timed out. Prints one line per check and 'N passed, M failed'.
"""
import argparse
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402
from fixtures import check, wait_until  # noqa: E402

F_SETPIPE_SZ = 1031
PEERS = 8


def blocked_in_log(pid):
    """The tids of meshd's threads asleep writing to the pipe."""
    tids = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                if "pipe_write" in f.read():
                    tids.append(tid)
        except OSError:
            pass
    return tids


def thread_name(pid, tid):
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--port", type=int, default=19400)
    a = ap.parse_args()
    meshd = os.path.join(a.build, "node", "meshd")
    meshctl = os.path.join(a.build, "node", "meshctl")
    workdir = tempfile.mkdtemp(prefix="mesh-ctl-busy-")
    sock = os.path.join(workdir, "meshd.sock")
    conf = os.path.join(workdir, "mesh.conf")
    # Peers 1..8 on ports nobody listens on: each dial is refused at once and logged.
    with open(conf, "w") as f:
        f.write('cluster = {\n  name = "busy";\n  transport = "tcp";\n  qps_per_link = 1;\n'
                '  backoff_initial_ms = 5;\n  backoff_max_ms = 10;\n  log_level = "debug";\n'
                + fixtures.cluster_key(a.build, workdir) + '};\n')
        f.write("nodes = (\n" + ",\n".join(
            f'  {{ id = {i}; addr = "127.0.0.1"; port = {a.port + i}; }}' for i in list(range(1, PEERS + 1)) + [9])
            + "\n);\n")

    def ctl(*what, timeout=10):
        t0 = time.monotonic()
        r = subprocess.run([meshctl, "-j", "-s", sock, *what], capture_output=True, text=True, timeout=timeout)
        return r, time.monotonic() - t0

    p = subprocess.Popen([meshd, "-c", conf, "-n", "9", "-s", sock], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    drain = None
    try:
        # Read the start-up lines (the pipe cannot shrink below what it holds), then shrink it.
        started = False
        for _ in range(200):
            line = p.stderr.readline().decode(errors="replace")
            if not line:
                break
            # main.c's start-up line (not the warning about the socket's group, which comes
            # before the socket listens)
            if "listening on" in line and "control socket" in line:
                started = True
                break
        if not check(started, "meshd started (its stderr a pipe the test reads only so far)"):
            return 1
        fcntl.fcntl(p.stderr.fileno(), F_SETPIPE_SZ, 4096)
        # That line comes just before the control thread listens (after its warm-up): until then
        # meshctl finds nobody answering.
        deadline = time.monotonic() + 10
        r, _ = ctl("node")
        while r.returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
            r, _ = ctl("node")
        check(r.returncode == 0 and not json.loads(r.stdout).get("from_snapshot"),
              "before the stall: meshctl node answers live", r.stderr.strip())

        # 1. the data path asleep in its log with the lock held
        stuck = wait_until(lambda: blocked_in_log(p.pid), 30, 0.05)
        names = [thread_name(p.pid, t) for t in stuck or []]
        if not check(bool(stuck) and "ctl" not in names,
                     f"meshd's data path sleeps writing its log to the full pipe (threads {names})",
                     "no thread blocked in pipe_write within 30 s"):
            return 1
        time.sleep(0.2)

        # 2. node and links from the snapshot
        worst, ok, results = 0.0, True, []
        for _ in range(20):
            try:
                r, dt = ctl("node", timeout=10)
            except subprocess.TimeoutExpired:
                ok = False
                break
            worst = max(worst, dt)
            j = json.loads(r.stdout) if r.returncode == 0 else {}
            results.append(j)
            ok &= r.returncode == 0 and j.get("from_snapshot") is True and j.get("snapshot_age_ms", 0) > 0 \
                and "busy" in r.stderr and j.get("id") == 9
        last = results[-1] if results else {}
        check(ok, f"meshctl node answers while the data path is stuck: from its snapshot "
              f"({last.get('snapshot_age_ms')} ms old at the last call), slowest of 20 calls {worst * 1000:.0f} ms",
              f"{r.returncode if results else 'timeout'} {r.stderr.strip() if results else ''}")
        check(blocked_in_log(p.pid), "the data path is still stuck meanwhile")
        try:
            r, dt = ctl("links", timeout=10)
            j = json.loads(r.stdout) if r.returncode == 0 else {}
            peers = sorted(l.get("peer") for l in j.get("links", []))
            check(r.returncode == 0 and peers == list(range(1, PEERS + 1)) and "busy" in r.stderr,
                  f"meshctl links answers from the snapshot too: {len(peers)} links ({dt * 1000:.0f} ms)",
                  f"{r.returncode} {r.stderr.strip()} {peers}")
        except subprocess.TimeoutExpired:
            check(False, "meshctl links answers from the snapshot too", "timed out after 10 s")

        # 3. what is not in the snapshot waits for the data path
        waiting = [subprocess.Popen([meshctl, "-j", "-s", sock, *what], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for what in (["channels"], ["-L", "node"])]
        time.sleep(1.0)
        check(all(w.poll() is None for w in waiting), "meshctl channels, and meshctl -L node, wait for the data path",
              f"{[w.poll() for w in waiting]}")

        # 4. the log is read again
        drain = threading.Thread(target=lambda: shutil.copyfileobj(p.stderr, open(os.devnull, "wb")), daemon=True)
        drain.start()
        codes = []
        for w in waiting:
            try:
                codes.append(w.wait(timeout=20))
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
                codes.append("hung")
        live = json.loads(waiting[1].stdout.read() or "{}") if codes[1] == 0 else {}
        check(codes == [0, 0] and live.get("from_snapshot") is not True and live.get("id") == 9,
              f"once the data path runs again both are answered, node live ({codes})")
        ok = wait_until(lambda: not blocked_in_log(p.pid), 10, 0.05)
        r, _ = ctl("node")
        j = json.loads(r.stdout) if r.returncode == 0 else {}
        check(ok and r.returncode == 0 and not j.get("from_snapshot") and j.get("snapshot_replies", 0) >= 20
              and j.get("queued_replies", 0) >= 2,
              f"then meshctl node is live again and counts {j.get('snapshot_replies')} snapshot replies and "
              f"{j.get('queued_replies')} that waited", r.stderr.strip())

        # 5. clean stop
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "hung"
        check(rc == 0, f"SIGTERM: meshd exits 0 ({rc})")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{fixtures.passed} passed, {fixtures.failed} failed")
    return 1 if fixtures.failed else 0


if __name__ == "__main__":
    sys.exit(main())
