#!/usr/bin/env python3
"""meshd-keeper (node/keeper/keeper.c): the descriptor store of sd_notify's FDSTORE=1 kept across
restarts, as systemd keeps it for a service, checked with a small Python program in meshd's place.

What it asserts:
  1. The program's first run stores a memfd holding some bytes (FDSTORE=1, FDNAME=ring) and a pipe it
     then takes back (FDSTOREREMOVE=1, FDNAME=gone), says READY=1 and is killed by SIGKILL (a crash).
  2. The keeper starts it again with the store as systemd passes it: LISTEN_PID its pid, LISTEN_FDS=1,
     LISTEN_FDNAMES=ring, descriptor 3 the same memfd (the bytes are there).
  3. A notification from another process (here the test, with a descriptor) is dropped and said.
  4. SIGUSR2 is a planned restart: the program gets SIGTERM, exits 0 and is started again, the store
     passed on once more (still one descriptor: the stranger's was not kept).
  5. Planned restarts do not count towards the burst limit: 6 more SIGUSR2 in a row each start the
     program again (9 starts within a minute in all).
  6. SIGTERM stops the program and the keeper, which exits with the program's status (0).
  7. A crash loop (a program killed by SIGKILL at once, every time) is ended by the burst limit: the
     keeper says it gives up after 5 starts within 60 s and exits on its own.
Prints one line per check and a closing 'N passed, M failed' line; exits non-zero on failure.
"""
import argparse
import array
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixtures import check, wait_until  # noqa: E402
import fixtures  # noqa: E402

CHILD = r'''
import array, os, signal, socket, sys, time
work = sys.argv[1]
with open(os.path.join(work, "runs"), "a+") as f:
    f.seek(0)
    run = len(f.read().splitlines()) + 1
    f.write("run\n")
addr = os.environ["NOTIFY_SOCKET"]
addr = "\0" + addr[1:] if addr.startswith("@") else addr
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
def notify(text, fds=()):
    # (socket.send_fds ignores its address argument: sendmsg itself)
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    s.sendmsg([text.encode()], anc, 0, addr)
if run == 1:
    fd = os.memfd_create("ring")
    os.write(fd, b"the ring's bytes")
    notify("FDSTORE=1\nFDNAME=ring", [fd])
    r, w = os.pipe()
    notify("FDSTORE=1\nFDNAME=gone", [r])
    notify("FDSTOREREMOVE=1\nFDNAME=gone")
    notify("READY=1")
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
got = {"pid": os.environ.get("LISTEN_PID") == str(os.getpid()), "n": os.environ.get("LISTEN_FDS"),
       "names": os.environ.get("LISTEN_FDNAMES")}
try:
    got["bytes"] = os.pread(3, 64, 0).decode()
except OSError as e:
    got["bytes"] = repr(e)
with open(os.path.join(work, f"run{run}"), "w") as f:
    f.write(repr(got))
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
notify("READY=1")
while True:
    time.sleep(1)
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    keeper = os.path.join(os.path.abspath(args.build), "node", "meshd-keeper")
    work = tempfile.mkdtemp(prefix="mesh-keeper-")
    child = os.path.join(work, "child.py")
    with open(child, "w") as f:
        f.write(CHILD)
    sock = os.path.join(work, "notify.sock")
    k = subprocess.Popen([keeper, "-s", sock, "--", sys.executable, child, work], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        run2 = os.path.join(work, "run2")
        check(wait_until(lambda: os.path.exists(run2), 20, 0.05),
              "the program, killed by SIGKILL, runs again under the keeper")
        got = eval(open(run2).read()) if os.path.exists(run2) else {}  # noqa: S307 (our own repr)
        check(got.get("pid") and got.get("n") == "1" and got.get("names") == "ring"
              and got.get("bytes") == "the ring's bytes",
              "its second run has the stored memfd at descriptor 3 (LISTEN_PID, LISTEN_FDS=1, LISTEN_FDNAMES=ring) "
              "with its bytes; the descriptor taken back is gone", str(got))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        r, w = os.pipe()
        s.sendmsg([b"FDSTORE=1\nFDNAME=stranger"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r]))], 0,
                  sock)
        time.sleep(0.3)
        k.send_signal(signal.SIGUSR2)
        run3 = os.path.join(work, "run3")
        check(wait_until(lambda: os.path.exists(run3), 20, 0.05), "SIGUSR2: the program is restarted")
        got = eval(open(run3).read()) if os.path.exists(run3) else {}  # noqa: S307
        check(got.get("n") == "1" and got.get("names") == "ring" and got.get("bytes") == "the ring's bytes",
              "after the planned restart the store is passed on again, without the stranger's descriptor", str(got))
        runs = 3
        for _ in range(6):
            k.send_signal(signal.SIGUSR2)
            if not wait_until(lambda: os.path.exists(os.path.join(work, f"run{runs + 1}")), 20, 0.05):
                break
            runs += 1
        check(runs == 9, f"6 more planned restarts in a row each start it again (run {runs} of 9; planned restarts "
                         f"do not count towards the burst limit)")
        k.send_signal(signal.SIGTERM)
        rc = k.wait(timeout=20)
        out = k.stdout.read()
        check(rc == 0, f"SIGTERM: the program and the keeper stop, exit {rc}", out[-500:])
        check("dropped" in out and f"pid {os.getpid()}" in out, "the stranger's notification was dropped and said",
              out[-500:])
        crash = subprocess.Popen([keeper, "-s", os.path.join(work, "crash.sock"), "--", "sh", "-c", "kill -9 $$"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            rc = crash.wait(timeout=20)
        except subprocess.TimeoutExpired:
            crash.kill()
            rc = crash.wait()
        out = crash.stdout.read()
        check("5 starts within 60 s: giving up" in out and out.count("starting it again") == 5,
              f"a program killed at every start: the keeper gives up after 5 starts within 60 s (exit {rc})", out[-500:])
    except Exception as e:  # pylint: disable=broad-except
        check(False, "test aborted", repr(e))
    finally:
        if k.poll() is None:
            k.kill()
            k.wait()
    print(f"{fixtures.passed} passed, {fixtures.failed} failed")
    return 1 if fixtures.failed else 0


if __name__ == "__main__":
    sys.exit(main())
