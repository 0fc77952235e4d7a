#!/usr/bin/env python3
"""A connect that waits for its link (MESH_OPT_WAIT_LINK, meshcat's default; issue 41).

Node 1's meshd runs alone at first: its link to node 2 is DOWN.
  1. meshcat -n to node 2: fails at once, exit 2, the link named (ENETUNREACH, as before the option).
  2. meshcat -t 1500 to node 2 (waits by default): fails at the end of its timeout, exit 2, saying
     the link did not come UP (meshd's answer) or that nothing answered in time (libmesh's own).
  3. node 2's meshd starts, a meshcat listens there, and the meshd is stopped (SIGSTOP) until node 1
     takes the link DOWN. meshcat to node 2 with the default wait (-t 120000) then waits (meshctl shows
     no channel: a wait is not one); SIGCONT brings the link back and the bytes go through intact.
  4. meshcat -t 60000 to node 2 killed while it waits: meshd forgets the wait (a later connect on a new
     control connection works, node 1's log has no error) and stops cleanly on SIGTERM.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402
from fixtures import check, wait_until  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--addr", default="127.0.0.1")
    ap.add_argument("--base-port", type=int, default=18010)
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    a.nodes, a.addrs, a.qps, a.ka_interval, a.ka_timeout = 2, a.addr, 2, 300, 3000
    work = tempfile.mkdtemp(prefix="mesh-wait-")
    c = fixtures.Cluster(a, work)
    meshcat = os.path.join(a.build, "meshlib", "meshcat")
    s1, s2 = c.nodes[1]["sock"], c.nodes[2]["sock"]
    data = os.urandom(300 * 1000 + 7)
    procs = []

    def cat(sock, *args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE):
        p = subprocess.Popen([meshcat, "-s", sock, *map(str, args)], stdin=stdin, stdout=stdout,
                             stderr=subprocess.PIPE)
        procs.append(p)
        return p

    def finish(p, timeout, data_in=None):
        try:
            out, err = p.communicate(data_in, timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            return None, out, err.decode(errors="replace")
        return p.returncode, out, err.decode(errors="replace")

    try:
        c.start(1)
        check(wait_until(lambda: os.path.exists(s1) and c.ctl(1, "node") is not None, 10),
              "node 1's meshd answers (node 2 not started yet)")

        # 1. no wait: at once
        rc, _, err = finish(cat(s1, "-n", 2, 7000), 30)
        check(rc == 2 and "not UP" in err, "meshcat -n to node 2 (link DOWN): exit 2 at once, the link named",
              f"exit {rc}: {err.strip()}")

        # 2. the wait ends with the timeout
        rc, _, err = finish(cat(s1, "-t", 1500, 2, 7000), 60)
        check(rc == 2 and ("did not come UP within 1500 ms" in err or "no answer within 1500 ms" in err),
              "meshcat -t 1500 to node 2 (waits, the link stays DOWN): exit 2 at the timeout, saying why",
              f"exit {rc}: {err.strip()}")

        # 3. the link comes while a connect waits. The listener must be there first (a link UP to a
        # port nobody listens on refuses, as TCP does): node 2 starts, listens, and is stopped
        # (SIGSTOP) until node 1 takes the link DOWN; SIGCONT brings it back.
        c.start(2)
        check(wait_until(lambda: c.all_up(), 30), "node 2's meshd started: the link is UP")
        out_path = os.path.join(work, "received")
        of = open(out_path, "wb")
        lst = cat(s2, "-l", 7000, stdout=of)
        check(wait_until(lambda: any(p["port"] == 7000 for p in (c.ctl(2, "ports") or {}).get("ports", [])), 20),
              "node 2 listens on port 7000")
        c.nodes[2]["proc"].send_signal(signal.SIGSTOP)
        check(wait_until(lambda: (c.links(1) or {}).get(2, {}).get("state") != "UP", 30),
              "node 2's meshd stopped (SIGSTOP): node 1's link to it goes DOWN")
        in_path = os.path.join(work, "sent")
        with open(in_path, "wb") as f:
            f.write(data)
        with open(in_path, "rb") as inf:
            snd = cat(s1, "-t", 120000, 2, 7000, stdin=inf)
        check(wait_until(lambda: snd.poll() is not None, 1) is False,
              "meshcat to node 2 waits while the link is DOWN (default: wait)")
        chans = (c.ctl(1, "channels") or {}).get("channels", [])
        check(chans == [], "meshctl channels: none while the connect waits", str(chans))
        c.nodes[2]["proc"].send_signal(signal.SIGCONT)
        rc_s, _, err_s = finish(snd, 120)
        rc_l, _, err_l = finish(lst, 120)
        of.close()
        with open(out_path, "rb") as f:
            got = f.read()
        check(rc_s == 0 and rc_l == 0 and got == data,
              f"the waiting meshcat sends {len(data)} bytes once the link is UP again, intact",
              f"sender exit {rc_s} ({err_s.strip()}), listener exit {rc_l} ({err_l.strip()}), {len(got)} bytes")

        # 4. a waiting client that dies is forgotten
        c.nodes[2]["proc"].terminate()
        c.nodes[2]["proc"].wait(timeout=10)
        check(wait_until(lambda: (c.links(1) or {}).get(2, {}).get("state") != "UP", 20),
              "node 2's meshd stopped: node 1's link to it is not UP")
        w = cat(s1, "-t", 60000, 2, 7001)
        check(w.poll() is None, "a meshcat waits again for the link")
        w.kill()
        w.wait()
        c.start(2)
        check(wait_until(lambda: c.all_up(), 30), "node 2 back: the link is UP again")
        with open(os.devnull, "wb") as nul:
            lst = cat(s2, "-l", 7002, stdout=nul)
            # Its listener registered first (a connect before that is refused, rightly).
            wait_until(lambda: any(p["port"] == 7002 for p in (c.ctl(2, "ports") or {}).get("ports", [])), 20)
            rc_s, _, err_s = finish(cat(s1, 2, 7002, stdin=subprocess.PIPE), 60, b"after\n")
            rc_l, _, _ = finish(lst, 60)
        check(rc_s == 0 and rc_l == 0, "a new connect after the killed waiter works", err_s.strip())
        with open(c.nodes[1]["log"]) as f:
            bad = [ln for ln in f if " error" in ln.lower() or "sanitizer" in ln.lower()]
        check(not bad, "node 1's log: no error line", "".join(bad[-3:]))
        c.stop_all()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for nd in c.nodes.values():
            if nd["proc"] and nd["proc"].poll() is None:
                nd["proc"].kill()
                nd["proc"].wait()
        if fixtures.failed:
            c.dump_logs()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{fixtures.passed} passed, {fixtures.failed} failed")
    return 1 if fixtures.failed else 0


if __name__ == "__main__":
    sys.exit(main())
