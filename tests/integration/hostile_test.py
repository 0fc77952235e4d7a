#!/usr/bin/env python3
"""Hostile clients against one meshd (tcp provider on loopback), each check fails without its fix.

  1. Out of descriptors: node 1's meshd runs under `prlimit --nofile` (a small limit) and 120 tcp
     connections to its port plus 80 to its control socket are held open, more than it has
     descriptors for. A listener that stays readable while accept() fails with EMFILE used to make
     meshd spin (93% of a CPU, 47 MB of log in 3 s): now it rests each listener for a while, so over
     2 s it uses under a quarter of a CPU and logs a handful of lines. Once the connections close it
     accepts again: node 2, started then, brings its link UP, and meshctl answers.
  2. Before the handshake (node 1 restarted without the limit; the stranger at 127.0.0.2, the nodes
     at 127.0.0.1): 12 connections each announce a 16 MiB frame and stream it; they used to take
     meshd from 3 MiB to 187 MiB, now each is closed after its 32-byte header and node 1's RSS
     grows by less than 8 MiB. 15,000 connections from five addresses, each closed as soon as it
     is connected: each used to stay on the tcp provider's list (20,000 took meshd's RSS up by
     55-67 MB and every poll walked them all); now node 1's RSS grows by less than 8 MiB and it
     uses under 25 ticks of CPU in the 5 s after. 200 connections that never say who they are:
     node 1 holds at most 64 from that address and closes the rest at once, and node 2, restarted
     meanwhile, rejoins within seconds. 64 from each of five addresses, 320 for the 256 places,
     re-opened as node 1 drops them: node 2 (at a node's address) used to stay DOWN for as long as
     they went on; now its newcomers take strangers' places and it rejoins within 15 s. 3,000
     connections that send a junk frame: each a protocol error, logged at most 20 times in 10 s
     (then a count); they used to be a line each.
  3. An application's own port (cluster.app_send over tcp: each application listens for the peer
     application's connection, docs/design.md "Application-sent bytes over tcp"). A checked stream
     from node 1 to node 2 whose receiver declines (MESH_APP_SEND=off), so the sender's port stays
     open for the whole stream: 120 strangers from 127.0.0.2 that say a wrong token, junk or nothing
     get nowhere, the sender holds at most 4 of them at a time, and the stream (meshd's) arrives
     intact. Then one whose applications both send their own bytes: intact, and once both
     connections are in neither process listens any more.
  4. SIGTERM: both exit 0; no error lines or sanitizer reports in the logs.
Prints one line per check and a closing 'N passed, M failed' line; exits 1 on failure.
"""
import argparse
import errno
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402
import meshring  # noqa: E402
from fixtures import check, wait_until  # noqa: E402


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def stranger(port, payload=b"", src="127.0.0.2"):
    """A non-blocking connection from src (not a node's address) that sends payload."""
    s = socket.socket()
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    if payload:
        try:
            s.send(payload)
        except OSError:
            pass
    return s


STRANGERS = [f"127.0.0.{i}" for i in range(2, 7)]  # not a node's address (the nodes are at 127.0.0.1)


def knock(port, sources, each):
    """each connections from every address of sources, each closed as soon as it is connected; returns
    how many connected. A short pause every 100 lets meshd's listen backlog drain."""
    n = 0
    for k in range(each):
        for src in sources:
            s = socket.socket()
            try:
                s.bind((src, 0))
                s.connect(("127.0.0.1", port))
                n += 1
            except OSError:
                pass
            s.close()
        if k % 100 == 99:
            time.sleep(0.01)
    return n


def refill(port, crowd):
    """Re-opens every connection of crowd (one row per source address) that meshd closed; returns how
    many."""
    n = 0
    for row, src in zip(crowd, STRANGERS):
        for i, s in enumerate(row):
            if closed_by_peer(s):
                s.close()
                row[i] = stranger(port, src=src)
                n += 1
    return n


def json_link(meshctl, sock):
    """meshctl -j links of the meshd at sock: its one link (a dict; empty if it cannot answer)."""
    r = subprocess.run([meshctl, "-j", "-L", "-s", sock, "links"], capture_output=True, text=True, timeout=60)
    try:
        return (json.loads(r.stdout).get("links") or [{}])[0]
    except ValueError:
        return {}


def json_channels(meshctl, sock):
    """meshctl -j channels of the meshd at sock (a list; empty if it cannot answer)."""
    r = subprocess.run([meshctl, "-j", "-L", "-s", sock, "channels"], capture_output=True, text=True, timeout=10)
    try:
        return json.loads(r.stdout).get("channels", [])
    except ValueError:
        return []


def socket_inodes(pid):
    """The inodes of process pid's sockets, as /proc/net/tcp names them."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def tcp_sockets(pid, state):
    """How many of process pid's TCP sockets are in state (hex, as /proc/net/tcp: 01 established)."""
    inodes = socket_inodes(pid)
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            n += sum(1 for line in f.readlines()[1:] if line.split()[3] == state and line.split()[9] in inodes)
    return n


def listening_ports(pid):
    """TCP ports process pid listens on (its socket inodes matched in /proc/net/tcp{,6})."""
    inodes = socket_inodes(pid)
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and parts[9] in inodes:  # 0A: LISTEN
                    ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def closed_by_peer(s):
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--port", type=int, default=17670)
    ap.add_argument("--nofile", type=int, default=48)
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    if not shutil.which("prlimit"):
        print("skip: prlimit (util-linux) not found")
        return 77
    work = tempfile.mkdtemp(prefix="mesh-hostile-")
    meshd = os.path.join(args.build, "node", "meshd")
    meshctl = os.path.join(args.build, "node", "meshctl")
    conf = os.path.join(work, "mesh.conf")
    with open(conf, "w") as f:
        f.write('cluster = {\n  name = "hostile";\n  transport = "tcp";\n  qps_per_link = 2;\n'
                '  connect_timeout_ms = 20000;\n  handshake_timeout_ms = 20000;\n'
                '  keepalive_interval_ms = 300;\n  keepalive_timeout_ms = 3000;\n'
                + fixtures.cluster_key(args.build, work) + '};\n'
                f'nodes = (\n  {{ id = 1; addr = "127.0.0.1"; port = {args.port}; }},\n'
                f'  {{ id = 2; addr = "127.0.0.1"; port = {args.port + 1}; }}\n);\n')
    socks = {i: os.path.join(work, f"meshd{i}.sock") for i in (1, 2)}
    logs = {i: os.path.join(work, f"meshd{i}.log") for i in (1, 2)}
    procs, held = {}, []

    # Under AddressSanitizer freed memory waits in its quarantine (256 MiB by default), so RSS grows
    # by what the connections allocated whether they leak or not (54 MiB for 15,000): a small one
    # keeps the RSS checks about leaks in both builds. (Ignored by a build without ASan.)
    env = dict(os.environ, ASAN_OPTIONS="quarantine_size_mb=1:" + os.environ.get("ASAN_OPTIONS", ""))

    def start(i, wrap=()):
        with open(logs[i], "a") as lf:
            procs[i] = subprocess.Popen([*wrap, meshd, "-c", conf, "-n", str(i), "-s", socks[i]],
                                        stdin=subprocess.DEVNULL, stdout=lf, stderr=lf, env=env)

    def ctl(i, *what):
        r = subprocess.run([meshctl, "-j", "-L", "-s", socks[i], *what], capture_output=True, text=True, timeout=10)
        return r.returncode == 0

    def log(i):
        with open(logs[i]) as f:
            return f.read()

    try:
        start(1, ("prlimit", f"--nofile={args.nofile}:{args.nofile}"))
        if not check(wait_until(lambda: ctl(1, "node"), 10), f"node 1 runs under prlimit --nofile={args.nofile}"):
            raise RuntimeError("node 1 did not start")
        for _ in range(120):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", args.port))
            held.append(s)
        for _ in range(80):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.setblocking(False)
            try:
                s.connect(socks[1])
            except OSError:
                pass
            held.append(s)
        time.sleep(0.5)
        lines0 = len(log(1).splitlines())
        c0, t0 = cpu_seconds(procs[1].pid), time.monotonic()
        time.sleep(2.0)
        share = (cpu_seconds(procs[1].pid) - c0) / (time.monotonic() - t0)
        lines = len(log(1).splitlines()) - lines0
        paused = "not accepting for" in log(1)
        check(procs[1].poll() is None and paused and share < 0.25 and lines < 20,
              f"out of descriptors under 200 held connections: meshd rests its listeners ({share:.0%} of a CPU "
              f"over 2 s, {lines} log lines)", log(1)[-1500:])
        for s in held:
            s.close()
        held.clear()
        start(2)
        up = wait_until(lambda: ctl(1, "links") and '"UP"' in subprocess.run(
            [meshctl, "-j", "-L", "-s", socks[1], "links"], capture_output=True, text=True).stdout, 30, 0.1)
        check(up, "the connections closed: node 1 accepts again (node 2's link UP) and meshctl answers")
        # Channels until meshd refuses one: it keeps a reserve of descriptors for its links and the
        # control socket (one user's 332 channels under a soft limit of 1024 used to leave none).
        lst, chans, refused = meshring.Listener(socks[2], 7000), [], None
        try:
            for _ in range(args.nofile):
                try:
                    chans.append(meshring.connect(socks[1], 2, 7000, timeout=10))
                except OSError as e:
                    refused = e
                    break
            ok_ctl = ctl(1, "node") and ctl(1, "links")
            check(refused is not None and refused.errno == errno.EMFILE and "descriptor limit" in str(refused)
                  and ok_ctl and procs[1].poll() is None,
                  f"node 1 under --nofile={args.nofile}: {len(chans)} channels, then one refused with the reserve's "
                  f"reason (EMFILE), and meshctl still answers", f"{refused!r}, meshctl {ok_ctl}")
        finally:
            for ch in chans:
                ch.close()
            lst.close()

        # 2. Before the handshake. Node 1 again, without the descriptor limit.
        procs[1].send_signal(signal.SIGTERM)
        procs[1].wait(timeout=15)
        start(1)
        check(wait_until(lambda: '"UP"' in subprocess.run([meshctl, "-j", "-L", "-s", socks[1], "links"],
                                                          capture_output=True, text=True).stdout, 30, 0.1),
              "node 1 restarted without the limit: link UP")
        time.sleep(1.0)
        rss0 = rss_kib(procs[1].pid)
        # A SEND header announcing 16 MiB, then the bytes: nothing is accepted yet, so nothing of it
        # may be buffered.
        hdr = struct.pack(">BBHIQQII", 4, 0, 0, 16 << 20, 0, 0, 0, 0)
        big = [stranger(args.port, hdr) for _ in range(12)]
        chunk, sent = b"\0" * (1 << 20), [0] * len(big)
        end = time.monotonic() + 5
        while time.monotonic() < end and any(n < (16 << 20) for n in sent):
            for i, s in enumerate(big):
                if sent[i] >= 16 << 20:
                    continue
                try:
                    sent[i] += s.send(chunk)
                except BlockingIOError:
                    pass
                except OSError:
                    sent[i] = 16 << 20  # reset by meshd: done
            time.sleep(0.01)
        time.sleep(0.5)
        grown = rss_kib(procs[1].pid) - rss0
        gone = sum(closed_by_peer(s) for s in big)
        check(gone == len(big) and grown < 8 << 10,
              f"12 connections announcing 16 MiB frames before the handshake: all closed by node 1, its RSS "
              f"grew {grown} KiB", f"{gone} closed; " + log(1)[-800:])
        for s in big:
            s.close()

        # Connect and close at once, from five addresses: every connection that ends before its
        # CONNECT is freed then (each used to stay on the provider's list: 20,000 took meshd's RSS up
        # by 55-67 MB and made every poll walk them all).
        rss0 = rss_kib(procs[1].pid)
        n_knock = knock(args.port, STRANGERS, 4000)
        time.sleep(1.0)
        grown = rss_kib(procs[1].pid) - rss0
        c0 = cpu_seconds(procs[1].pid)
        # The link's keepalive round trip meanwhile (each poll used to walk every leaked connection:
        # 2.3-4.9 ms after 20,000): the least of the samples, so that one late wake-up of a busy
        # machine does not decide it.
        rtts = []
        for _ in range(10):
            time.sleep(0.5)
            rtts.append(json_link(meshctl, socks[1]).get("rtt_us", 10 ** 9))
        ticks = round((cpu_seconds(procs[1].pid) - c0) * os.sysconf("SC_CLK_TCK"))
        check(grown < 8 << 10 and ticks < 25 and min(rtts) < 2000 and procs[1].poll() is None,
              f"{n_knock} connections opened and closed before saying who they are, from {len(STRANGERS)} "
              f"addresses: node 1's RSS grew {grown} KiB, it used {ticks} ticks of CPU over the next 5 s, "
              f"the link's keepalive RTT {min(rtts)} us (least of {len(rtts)}; want < 2000)", f"RTTs {rtts}")

        # Junk from strangers (a frame of no known type, then close), 3,000 connections: each is a
        # protocol error, which used to be a log line each (3,000 junk connections added 2,594).
        lines0 = len(log(1).splitlines())
        junk = struct.pack(">BBHIQQII", 0xEE, 0, 0, 0, 0, 0, 0, 0)
        n_junk = 0
        for k in range(3000):
            try:
                stranger(args.port, junk, src=STRANGERS[k % len(STRANGERS)]).close()
                n_junk += 1
            except OSError:
                pass
            if k % 100 == 99:
                time.sleep(0.01)
        time.sleep(1.0)
        junk_lines = log(1).splitlines()[lines0:]
        # (The count of lines left out comes with the next line allowed, after the 10 s: maybe later.)
        check(len(junk_lines) < 200 and any("protocol error" in ln for ln in junk_lines),
              f"{n_junk} connections that send junk: node 1 wrote {len(junk_lines)} log lines for them (protocol "
              f"errors: at most 20 in 10 s, then a count)", "\n".join(junk_lines[:3] + junk_lines[-3:]))

        idle = [stranger(args.port) for _ in range(200)]
        time.sleep(1.0)
        dropped = sum(closed_by_peer(s) for s in idle)
        check(200 - dropped <= 64 and "have not said who they are yet" in log(1),
              f"200 silent connections from one address: node 1 holds {200 - dropped} (at most 64), closes "
              f"the rest at once and says so")
        procs[2].send_signal(signal.SIGTERM)
        procs[2].wait(timeout=15)
        t0 = time.monotonic()
        start(2)
        up = wait_until(lambda: '"UP"' in subprocess.run([meshctl, "-j", "-L", "-s", socks[1], "links"],
                                                         capture_output=True, text=True).stdout, 15, 0.1)
        check(up, f"meanwhile node 2 restarts and rejoins node 1 in {time.monotonic() - t0:.1f} s")
        for s in idle:
            s.close()

        # 64 silent connections from each of five addresses, 320 for the 256 places, each re-opened as
        # node 1 drops it: node 2 (at a node's address), restarted meanwhile, still gets in. It used
        # to stay DOWN for as long as the strangers kept the places taken.
        crowd = [[stranger(args.port, src=src) for _ in range(64)] for src in STRANGERS]
        time.sleep(0.5)
        refill(args.port, crowd)
        time.sleep(0.5)
        held_n = sum(not closed_by_peer(s) for row in crowd for s in row)
        boot = json_link(meshctl, socks[1]).get("peer_boot_epoch")

        def node2_back():
            """The strangers keep at it; is the link UP with the restarted node 2 (a new boot epoch)?"""
            refill(args.port, crowd)
            k = json_link(meshctl, socks[1])
            return k.get("state") == "UP" and k.get("peer_boot_epoch") not in (None, boot)

        procs[2].send_signal(signal.SIGTERM)
        procs[2].wait(timeout=15)
        t0 = time.monotonic()
        start(2)
        up = wait_until(node2_back, 15, 0.2)
        check(held_n >= 250 and up,
              f"{len(STRANGERS)} addresses keep 320 silent connections open for 256 places (node 1 holds "
              f"{held_n}): node 2, restarted meanwhile, rejoins in {time.monotonic() - t0:.1f} s",
              "\n".join(log(1).splitlines()[-20:]))
        for row in crowd:
            for s in row:
                s.close()

        # 3. An application's own port: first one whose peer never comes.
        chan_test = os.path.join(args.build, "tests", "integration", "chan_test")
        rx = subprocess.Popen([chan_test, "-s", socks[2], "recv", "7601", "1"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, MESH_APP_SEND="off"))
        line = rx.stdout.readline()
        total = 64 << 20
        tx = subprocess.Popen([chan_test, "-s", socks[1], "send", "2", "7601", str(total), "-R", str(16 << 20)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        hello_bad = struct.pack(">I", 0x4d415154) + b"\x00" * 16
        ports = set()
        wait_until(lambda: ports.update(listening_ports(tx.pid)) or ports, 10, 0.01)
        pests, most = [], 0
        for k in range(120) if ports else ():
            payload = (hello_bad, b"GET / HTTP/1.0\r\n\r\n" * 10, b"")[k % 3]
            try:
                pests.append(stranger(min(ports), payload))
            except OSError:
                pass
            if k % 10 == 9:
                time.sleep(0.05)
                most = max(most, tcp_sockets(tx.pid, "01"))
        txr = tx.communicate(timeout=120)[0]
        rxr = rx.communicate(timeout=120)[0]
        check(tx.returncode == 0 and rx.returncode == 0 and "listening" in line and len(ports) == 1 and most <= 4,
              f"a receiver that declines its own connection: 120 strangers on the sender's open port "
              f"({sorted(ports)}) get nowhere, the sender holds at most {most} of them (4 slots), and the "
              f"stream of {total} bytes arrives intact", (txr + rxr)[-800:])
        for s in pests:
            s.close()

        # Then both applications on their own connections.
        rx = subprocess.Popen([chan_test, "-s", socks[2], "recv", "7600", "1"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = rx.stdout.readline()
        total = 128 << 20  # 8 s at the rate: the channel is still open when it is looked at
        tx = subprocess.Popen([chan_test, "-s", socks[1], "send", "2", "7600", str(total), "-R", str(16 << 20)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        granted = wait_until(lambda: [c.get("writer") for c in json_channels(meshctl, socks[1])] == ["app"]
                             and [c.get("writer") for c in json_channels(meshctl, socks[2])] == ["app"], 10, 0.05)
        left = listening_ports(tx.pid) | listening_ports(rx.pid) if tx.poll() is None and rx.poll() is None \
            else set()
        txr = tx.communicate(timeout=120)[0]
        rxr = rx.communicate(timeout=120)[0]
        ok = tx.returncode == 0 and rx.returncode == 0
        check(ok and "listening" in line and granted and not left,
              f"a stream of {total} bytes whose applications both sent their own (meshctl writer app) arrives "
              f"intact, and once their connections were in neither listened any more (ports left: {sorted(left)})",
              (txr + rxr)[-800:])
        for i in (2, 1):
            procs[i].send_signal(signal.SIGTERM)
        codes = [procs[i].wait(timeout=15) for i in (2, 1)]
        check(codes == [0, 0], "SIGTERM: both meshd exit 0", str(codes))
        bad = [ln for i in (1, 2) for ln in log(i).splitlines()
               if "ERROR" in ln or "AddressSanitizer" in ln or "runtime error" in ln]
        check(not bad, "no error lines or sanitizer reports in the meshd logs", "\n".join(bad[:10]))
    except Exception as e:  # report, never hang
        check(False, "test aborted", repr(e))
    finally:
        for s in held:
            s.close()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{fixtures.passed} passed, {fixtures.failed} failed")
    return 1 if fixtures.failed else 0


if __name__ == "__main__":
    sys.exit(main())
