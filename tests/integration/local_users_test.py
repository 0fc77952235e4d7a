#!/usr/bin/env python3
"""Local users against meshd's control socket (tcp provider on loopback, two nodes); needs root to
act as other users (setpriv), else it prints 'skip: <reason>' and exits 77.

  1. The socket is mode 0660, group cluster.socket_group ("users" here); with a group that does not
     exist (node 2) it is 0600 and the log says why.
  2. A user outside the group cannot connect (EACCES); the same user in the group can.
  3. Ports below 1024 are root's (EACCES), and a port another user listens on is taken (EADDRINUSE).
  4. Quotas (cluster.max_channels_per_uid = 2): the user's third channel is refused with EDQUOT while
     root still opens one; a listener's accepted channels count against its user, so node 2 refuses
     a third channel to root's port with EDQUOT, which the opener hears.
  5. meshctl channels shows each channel's owner uid (the opener's, the listener's), meshctl ports
     each listening port's.
  6. A member of the group sending bad requests as fast as meshd answers them (3 s): each is
     answered and counted (ctl_errors), the log takes at most a few dozen lines about them, and
     root's meshctl still answers. The same user opening 200 control connections holds 64 (the
     rest get EUSERS with the reason), and root's meshctl and channel requests are served.
  7. SIGTERM: both meshd exit 0; no error lines or sanitizer reports in their logs.
Prints one line per check and a closing 'N passed, M failed' line; exits 1 on failure.
"""
import argparse
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402
import meshring  # noqa: E402
from fixtures import check, wait_until  # noqa: E402

NOBODY = 65534
USERS_GID = 100  # Debian's "users" group

# Runs as the other user: a raw client (meshring.py, copied beside it) that reports each answer.
CLIENT = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
import meshring
sock, mode = sys.argv[2], sys.argv[3]
out, keep = {}, []
def try_(name, f):
    try:
        keep.append(f())
        out[name] = 0
    except OSError as e:
        out[name] = e.errno
if mode == "connect-only":
    try_("node", lambda: meshring.channels(sock))
elif mode == "flood":
    # Bad requests as fast as meshd answers them, for 3 s: each gets its error reply.
    import socket, time
    sent, end = 0, time.monotonic() + 3
    while time.monotonic() < end:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(sock)
        for _ in range(200):
            s.send(b"\xff\xff\xff garbage")
            s.recv(65536)
            sent += 1
        s.close()
    out["sent"] = sent
elif mode == "hold":
    # 200 control connections held open: meshd takes what the per-uid cap allows and answers the
    # rest with its reason (-EUSERS) before it closes them.
    import errno, select, socket, time
    held = []
    for _ in range(200):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(sock)
        held.append(s)
    time.sleep(1)
    refused, why = 0, ""
    for s in held:
        if select.select([s], [], [], 0)[0]:
            d = s.recv(65536)
            r = meshring.Reply(d, []) if d else None
            if r and -r.status == errno.EUSERS:
                refused, why = refused + 1, r.error
    out.update(held=len(held) - refused, refused=refused, why=why)
    keep.extend(held)
else:
    try_("ch1", lambda: meshring.connect(sock, 2, 7000))
    try_("ch2", lambda: meshring.connect(sock, 2, 7000))
    try_("ch3", lambda: meshring.connect(sock, 2, 7000))
    try_("port80", lambda: meshring.Listener(sock, 80))
    try_("port7001", lambda: meshring.Listener(sock, 7001))
    try_("port7002", lambda: meshring.Listener(sock, 7002))
print(json.dumps(out), flush=True)
sys.stdin.read()  # holds its channels until the test is done with them
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--port", type=int, default=17690)
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    if os.geteuid() != 0:
        print("skip: needs root to act as other users (setpriv)")
        return 77
    py = "/usr/bin/python3"
    if not shutil.which("setpriv") or not os.access(py, os.X_OK):
        print("skip: setpriv (util-linux) or /usr/bin/python3 not found")
        return 77
    work = tempfile.mkdtemp(prefix="mesh-users-")
    os.chmod(work, 0o755)  # the other user reaches the sockets and the client script here
    shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "meshring.py"), work)
    client = os.path.join(work, "client.py")
    with open(client, "w") as f:
        f.write(CLIENT)
    os.chmod(client, 0o644)
    os.chmod(os.path.join(work, "meshring.py"), 0o644)
    meshd = os.path.join(args.build, "node", "meshd")
    meshctl = os.path.join(args.build, "node", "meshctl")
    base = ('  transport = "tcp";\n  qps_per_link = 2;\n  keepalive_interval_ms = 300;\n'
            '  keepalive_timeout_ms = 3000;\n  max_channels_per_uid = 2;\n'
            + fixtures.cluster_key(args.build, work))
    nodes = (f'nodes = (\n  {{ id = 1; addr = "127.0.0.1"; port = {args.port}; }},\n'
             f'  {{ id = 2; addr = "127.0.0.1"; port = {args.port + 1}; }}\n);\n')
    confs = {1: os.path.join(work, "mesh1.conf"), 2: os.path.join(work, "mesh2.conf")}
    for i, group in ((1, "users"), (2, "no-such-group-for-meshd")):
        with open(confs[i], "w") as f:
            f.write(f'cluster = {{\n  name = "users";\n  socket_group = "{group}";\n' + base + '};\n' + nodes)
    socks = {i: os.path.join(work, f"meshd{i}.sock") for i in (1, 2)}
    logs = {i: os.path.join(work, f"meshd{i}.log") for i in (1, 2)}
    procs, held, clients = {}, [], []

    def ctl(i, *what):
        r = subprocess.run([meshctl, "-j", "-L", "-s", socks[i], *what], capture_output=True, text=True, timeout=10)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def up():
        l1 = ctl(1, "links")
        return bool(l1) and all(l["state"] == "UP" for l in l1["links"])

    def as_user(groups, mode):
        cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}"]
        cmd += [f"--groups={groups}"] if groups else ["--clear-groups"]
        p = subprocess.Popen([*cmd, py, client, work, socks[1], mode], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        clients.append(p)
        line = p.stdout.readline()
        try:
            return json.loads(line)
        except ValueError:
            return {"error": line + p.stderr.read() if p.poll() is not None else line}

    def log(i):
        with open(logs[i]) as f:
            return f.read()

    try:
        for i in (1, 2):
            # Node 1 starts as systemd's default would start it: 1024 descriptors, a hard limit above.
            limit = ["prlimit", "--nofile=1024:8192"] if i == 1 and shutil.which("prlimit") else []
            with open(logs[i], "a") as lf:
                procs[i] = subprocess.Popen([*limit, meshd, "-c", confs[i], "-n", str(i), "-s", socks[i]],
                                            stdin=subprocess.DEVNULL, stdout=lf, stderr=lf)
        if not check(wait_until(up, 30), "two nodes, link UP"):
            raise RuntimeError("the link did not come up")
        if shutil.which("prlimit"):
            with open(f"/proc/{procs[1].pid}/limits") as f:
                nofile = [ln.split()[3:5] for ln in f if ln.startswith("Max open files")]
            check(nofile == [["8192", "8192"]] and "descriptors: at most 8192" in log(1),
                  "meshd started with 1024 descriptors of a hard 8192 raises its own limit to 8192, and warns "
                  "that is below what it wants", f"{nofile}: {[ln for ln in log(1).splitlines() if 'descriptors' in ln]}")

        st1, st2 = os.stat(socks[1]), os.stat(socks[2])
        check(stat.S_IMODE(st1.st_mode) == 0o660 and st1.st_gid == USERS_GID,
              "node 1's control socket: mode 0660, group users", f"{oct(st1.st_mode)} gid {st1.st_gid}")
        check(stat.S_IMODE(st2.st_mode) == 0o600 and "group no-such-group-for-meshd does not exist" in log(2),
              "node 2's group does not exist: its socket is 0600 and its log says why", oct(st2.st_mode))

        out = as_user(None, "connect-only")
        check(out.get("node") == errno.EACCES, "a user outside the group cannot connect (EACCES)", str(out))
        out = as_user(str(USERS_GID), "connect-only")
        check(out.get("node") == 0, "the same user in the group can", str(out))
        # Changing the node is root's (or meshd's own user's): a reload or a drain may close links and
        # channels of every user.
        for what in (["reload"], ["--deadline", "60", "drain"]):
            r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", f"--groups={USERS_GID}", meshctl,
                                "-s", socks[1], *what], capture_output=True, text=True, timeout=30)
            n = ctl(1, "node") or {}
            check(r.returncode == 2 and "only root" in r.stderr and not n.get("draining")
                  and n.get("config_generation") == 1,
                  f"a group member's meshctl {what[-1]} is refused (exit 2, only root), nothing changed",
                  f"exit {r.returncode}: {r.stderr.strip()} {({k: n.get(k) for k in ('draining', 'config_generation')})}")

        # Root listens on node 2's port 7000 (channels from node 1 land there) and on node 1's 7001.
        held.append(meshring.Listener(socks[2], 7000))
        held.append(meshring.Listener(socks[1], 7001))
        out = as_user(str(USERS_GID), "all")
        check(out.get("ch1") == 0 and out.get("ch2") == 0, "the user opens two channels", str(out))
        check(out.get("ch3") == errno.EDQUOT, "its third is refused: max_channels_per_uid (EDQUOT)", str(out))
        check(out.get("port80") == errno.EACCES, "port 80 is root's (EACCES)", str(out))
        check(out.get("port7001") == errno.EADDRINUSE, "root's port 7001 cannot be taken (EADDRINUSE)", str(out))
        check(out.get("port7002") == 0, "a free port above 1024 can", str(out))

        chans = (ctl(1, "channels") or {}).get("channels", [])
        mine = [c for c in chans if c.get("owner_uid", 0) == NOBODY]
        check(len(mine) == 2 and all(c["opener"] for c in mine),
              f"node 1: meshctl channels shows the user's two channels with uid {NOBODY}",
              json.dumps(chans)[:600])
        ports = (ctl(1, "ports") or {}).get("ports", [])
        check(sorted((p["port"], p.get("owner_uid", 0)) for p in ports) == [(7001, 0), (7002, NOBODY)],
              f"node 1: meshctl ports shows root's 7001 and the user's 7002 with their uids", json.dumps(ports))
        acc = (ctl(2, "channels") or {}).get("channels", [])
        check(len(acc) == 2 and all(c.get("owner_uid", 0) == 0 and not c["opener"] for c in acc),
              "node 2: the accepted channels are the listener's (uid 0)", json.dumps(acc)[:600])

        # Root on node 1 is within its own quota, but root's listener on node 2 holds two already.
        try:
            meshring.connect(socks[1], 2, 7000)
            got = 0
        except OSError as e:
            got = e.errno
        check(got == errno.EDQUOT, "root's channel to root's port on node 2: node 2 refuses it (EDQUOT: the "
              "listener's user holds max_channels_per_uid)", os.strerror(got) if got else "opened")
        try:
            ch = meshring.connect(socks[1], 2, 7001 + 1000)
            got = 0
            ch.close()
        except OSError as e:
            got = e.errno
        check(got == errno.ECONNREFUSED, "root on node 1 may still open channels (refused only by nobody "
              "listening)", os.strerror(got) if got else "opened")

        # A group member floods the control socket with bad requests.
        errs0, lines0 = (ctl(1, "node") or {}).get("ctl_errors", 0), len(log(1).splitlines())
        out = as_user(str(USERS_GID), "flood")
        sent = out.get("sent", 0)
        errs1 = (ctl(1, "node") or {}).get("ctl_errors", 0)
        more = len(log(1).splitlines()) - lines0
        check(sent >= 1000 and errs1 - errs0 >= sent,
              f"a group member's {sent} bad requests in 3 s: each answered with an error and counted "
              f"(ctl_errors +{errs1 - errs0})", str(out))
        check(more <= 60, f"... and the log took {more} lines for them (at most 20 per 10 s, then a count)",
              "\n".join(log(1).splitlines()[lines0:lines0 + 5]))
        check(ctl(1, "node") is not None, "root's meshctl node still answers")

        # A group member holds 200 control connections: it gets at most 64 (its listener on port
        # 7002 holds one already), root still gets in.
        hold = as_user(str(USERS_GID), "hold")
        check(hold.get("held") == 63 and hold.get("refused") == 137 and "the most one user may" in hold.get("why", ""),
              "a group member opening 200 more control connections holds 64 in all; the rest are told why "
              "(EUSERS)", str(hold))
        t0 = time.monotonic()
        node = ctl(1, "node")
        dt = time.monotonic() - t0
        check(node is not None and dt < 10, f"... root's meshctl node answers meanwhile ({dt:.2f} s)")
        try:
            meshring.connect(socks[1], 2, 7001 + 1001).close()
            got = 0
        except OSError as e:
            got = e.errno
        check(got == errno.ECONNREFUSED, "... and root's channel request is served (refused only by nobody "
              "listening on node 2)", os.strerror(got) if got else "opened")

        for p in clients:
            p.stdin.close()
            p.wait(timeout=10)
        for h in held:
            h.close()
        check(wait_until(lambda: not (ctl(1, "channels") or {}).get("channels"), 10),
              "the user's client exits: its channels go")

        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=15) for p in procs.values()]
        check(codes == [0, 0], "SIGTERM: both meshd exit 0", str(codes))
        bad = [ln for i in (1, 2) for ln in log(i).splitlines()
               if " error: " in ln or "ERROR: AddressSanitizer" in ln or "runtime error" in ln]
        check(not bad, "no error lines or sanitizer reports in the meshd logs", "\n".join(bad[:10]))
    except Exception as e:  # noqa: BLE001
        check(False, "test aborted", repr(e))
    finally:
        for p in clients:
            if p.poll() is None:
                p.kill()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        if not fixtures.failed:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{fixtures.passed} passed, {fixtures.failed} failed")
    return 1 if fixtures.failed else 0


if __name__ == "__main__":
    sys.exit(main())
