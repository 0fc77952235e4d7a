#!/usr/bin/env python3
"""The hardened unit (deploy/meshd@.service.in), as installed by `cmake --install` into a scratch
DESTDIR:

  1. `systemd-analyze security --offline=true` rates it at most 3.0 (parsed from its "Overall
     exposure level" line);
  2. `systemd-analyze verify` is silent and exits 0 (on a copy whose ExecStart names the scratch
     install's meshd, as verify wants the program to exist; MANPATH finds the scratch man pages);
  3. two instances on one host: each has its own control socket (ExecStart's --socket names %i), and
     the unit's ExecStartPost=/ExecStopPost= lines, run as systemd would (%i expanded, /run/meshd a
     scratch directory), link /run/meshd/meshd.sock to the first instance's socket, leave it to that
     one when a second starts and stops, and remove it when the first stops;
  4. with strace: meshd with a link UP and its metrics endpoint scraped, meshctl queries, a channel
     of 4 MiB through libmesh and a SIGTERM, traced with -f: every system call it made is inside the unit's SystemCallFilter=
     (expanded by `systemd-analyze syscall-filter`), every socket family inside
     RestrictAddressFamilies=, and no mapping is made writable and executable or executable later
     (MemoryDenyWriteExecute=). Without systemd as PID 1 the sandbox itself cannot be run here; this
     is the evidence that it would not stop meshd on the tcp provider.
Skipped (77) without systemd-analyze; part 4 skipped (said so) without strace.
"""
import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

fails = []


def check(ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what + ("" if ok or not detail else f": {detail}"))
    if not ok:
        fails.append(what)


def unit_values(text, key):
    vals = []
    for line in text.splitlines():
        if line.startswith(key + "="):
            vals.extend(line[len(key) + 1:].split())
    return vals


def syscall_set(names, cache={}):
    """Expands @groups (nested too) into syscall names through systemd-analyze."""
    out = set()
    for n in names:
        if not n.startswith("@"):
            out.add(n)
            continue
        if n not in cache:
            text = subprocess.run(["systemd-analyze", "syscall-filter", n], capture_output=True, text=True,
                                  check=True).stdout
            items = [l.strip() for l in text.splitlines()[1:] if l.strip() and not l.strip().startswith("#")]
            cache[n] = syscall_set(items)
        out |= cache[n]
    return out


def exec_lines(unit, key, instance, rundir):
    """The unit's KEY= command lines as systemd runs them for instance: %i expanded, the "-" prefix
    (failure ignored) dropped, /run/meshd moved to rundir; each as an argv list."""
    out = []
    for line in unit.splitlines():
        if line.startswith(key + "="):
            cmd = line[len(key) + 1:].lstrip("-").replace("%i", instance).replace("/run/meshd", rundir)
            out.append(shlex.split(cmd))
    return out


def instances_part(unit, work):
    m = re.search(r"^ExecStart=.*--socket (\S+)", unit, re.M)
    check(m and "%i" in m.group(1), "ExecStart: a control socket per instance (--socket names %i)",
          m.group(1) if m else "no --socket")
    rundir = os.path.join(work, "run-meshd")
    os.mkdir(rundir)
    link = os.path.join(rundir, "meshd.sock")

    def run(key, instance):
        for argv in exec_lines(unit, key, instance, rundir):
            subprocess.run(argv, capture_output=True)  # "-": a failure is not the unit's

    def target():
        return os.readlink(link) if os.path.islink(link) else None
    run("ExecStartPost", "1")
    check(target() == "1.sock", "first instance started: meshd.sock -> 1.sock", str(target()))
    run("ExecStartPost", "2")
    check(target() == "1.sock", "second instance started: meshd.sock still -> 1.sock", str(target()))
    run("ExecStopPost", "2")
    check(target() == "1.sock", "second instance stopped: meshd.sock still -> 1.sock", str(target()))
    run("ExecStopPost", "1")
    check(not os.path.lexists(link), "first instance stopped: meshd.sock removed", str(target()))
    run("ExecStartPost", "2")
    check(target() == "2.sock", "an instance started alone: meshd.sock -> its socket", str(target()))


def strace_part(args, work, unit):
    meshd = os.path.join(args.build, "node", "meshd")
    meshctl = os.path.join(args.build, "node", "meshctl")
    meshecho = os.path.join(args.build, "meshlib", "meshecho")
    meshcat = os.path.join(args.build, "meshlib", "meshcat")
    conf = os.path.join(work, "mesh.conf")
    with open(conf, "w") as f:
        f.write('cluster = { name = "unit"; transport = "tcp"; qps_per_link = 2; keepalive_interval_ms = 300; '
                f'socket_group = "{os.getgid()}"; }};\n'
                f'nodes = (\n  {{ id = 1; addr = "127.0.0.1"; port = {args.port}; '
                f'metrics_listen = "127.0.0.1:{args.port + 2}"; }},\n'
                f'  {{ id = 2; addr = "127.0.0.1"; port = {args.port + 1}; }}\n);\n')
    socks = {i: os.path.join(work, f"meshd{i}.sock") for i in (1, 2)}
    trace = os.path.join(work, "strace.log")
    procs = []
    traced = None  # meshd under strace, killed by pid if the test stops early

    def child_of(pid):
        for _ in range(100):
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    kids = f.read().split()
                if kids:
                    return int(kids[0])
            except OSError:
                pass
            time.sleep(0.05)
        return None
    try:
        for i in (1, 2):
            cmd = [meshd, "-c", conf, "-n", str(i), "-s", socks[i]]
            if i == 1:
                cmd = ["strace", "-f", "-qq", "-s", "0", "-e", "signal=none", "-o", trace] + cmd
            # A process group of its own: strace killed detaches its tracee, which would live on
            # (and hold the port for the next run) unless the whole group goes.
            procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=open(os.path.join(work, f"meshd{i}.log"), "w"),
                                          start_new_session=True))
            if i == 1:
                traced = child_of(procs[0].pid)
        up = False
        for _ in range(150):
            r = subprocess.run([meshctl, "-s", socks[1], "-j", "links"], capture_output=True, text=True)
            if '"state":"UP"' in r.stdout:
                up = True
                break
            time.sleep(0.1)
        check(up, "traced meshd 1 and meshd 2: link UP")
        echo = subprocess.Popen([meshecho, "-s", socks[1], "-l", "7100", "-n", "1"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        procs.append(echo)
        time.sleep(0.3)
        data = os.urandom(4 << 20)
        r = subprocess.run([meshcat, "-s", socks[2], "1", "7100"], input=data, capture_output=True, timeout=60)
        check(r.returncode == 0 and r.stdout == data, "a 4 MiB channel node 2 -> node 1 echoed intact through traced meshd",
              r.stderr.decode(errors="replace")[-300:])
        for obj in ("node", "channels", "ports", "links", "metrics"):
            subprocess.run([meshctl, "-s", socks[1], obj], capture_output=True)
        # The metrics endpoint (cluster.metrics_listen) is part of what the unit must allow.
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{args.port + 2}/metrics", timeout=10) as resp:
                text = resp.read().decode()
        except OSError as e:
            text = repr(e)
        check('rdmamesh_link_up{peer="2"} 1' in text, "traced meshd 1 serves /metrics (a link UP in it)", text[-300:])
        # systemctl reload (ExecReload=kill -HUP): a reload that moves the metrics endpoint to another
        # port (a bind, the old listener closed) is traced too.
        with open(conf) as f:
            text = f.read()
        with open(conf + ".tmp", "w") as f:
            f.write(text.replace(f"127.0.0.1:{args.port + 2}", f"127.0.0.1:{args.port + 3}"))
        os.replace(conf + ".tmp", conf)
        os.kill(traced, signal.SIGHUP)
        gen = None
        for _ in range(100):
            r = subprocess.run([meshctl, "-s", socks[1], "-j", "node"], capture_output=True, text=True)
            gen = re.search(r'"config_generation":(\d+)', r.stdout)
            if gen and gen.group(1) == "2":
                break
            time.sleep(0.1)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{args.port + 3}/metrics", timeout=10) as resp:
                text = resp.read().decode()
        except OSError as e:
            text = repr(e)
        check(gen and gen.group(1) == "2" and "rdmamesh_link_up" in text,
              "traced meshd 1 reloads on SIGHUP (generation 2) and serves /metrics at the new port", text[-300:])
        # SIGTERM to meshd itself (strace's child), as systemd would send it: the shutdown path is traced too.
        os.kill(traced, signal.SIGTERM)
        procs[0].wait(timeout=20)
        traced = None
        check(procs[0].returncode == 0, "traced meshd exits 0 on SIGTERM", f"exit {procs[0].returncode}")
    finally:
        if traced:
            try:
                os.kill(traced, signal.SIGKILL)
            except OSError:
                pass
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # meshd 2, or strace and meshd 1 under it
                except OSError:
                    p.kill()
                p.wait()
    with open(trace) as f:
        lines = f.read().splitlines()
    called = set()
    families = set()
    wx = []
    for l in lines:
        m = re.match(r"^\d+\s+(?:<\.\.\. )?([a-z0-9_]+)[( ]", l)
        if not m:
            continue
        name = m.group(1)
        if "resumed>" in l and l.split()[1] == "<...":
            continue  # the call was counted where it started
        called.add(name)
        fm = re.match(r"^\d+\s+socket(?:pair)?\((AF_[A-Z0-9]+)", l)
        if fm:
            families.add(fm.group(1))
        if name in ("mmap", "mprotect", "pkey_mprotect") and "PROT_EXEC" in l and (
                name != "mmap" or "PROT_WRITE" in l):
            wx.append(l)
    allowed = syscall_set(unit_values(unit, "SystemCallFilter"))
    outside = sorted(called - allowed - {"execve"})  # execve is strace starting meshd, before the filter
    check(len(called) > 20 and not outside,
          f"all {len(called)} system calls meshd made are in SystemCallFilter= ({len(allowed)} allowed)",
          f"outside the filter: {outside}")
    print(f"     meshd's calls: {' '.join(sorted(called))}")
    af = set(unit_values(unit, "RestrictAddressFamilies"))
    check(families and families <= af, f"socket families {sorted(families)} within RestrictAddressFamilies= {sorted(af)}",
          f"outside: {sorted(families - af)}")
    check(not wx, "no writable+executable mapping, no mprotect to executable (MemoryDenyWriteExecute=)", wx[:3])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--port", type=int, default=17960)
    ap.add_argument("--max-score", type=float, default=3.0)
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    if not shutil.which("systemd-analyze"):
        print("skip: systemd-analyze is not installed (Debian package systemd)")
        return 77
    work = tempfile.mkdtemp(prefix="mesh-unit-")
    try:
        dest = os.path.join(work, "dest")
        r = subprocess.run(["cmake", "--install", args.build], env=dict(os.environ, DESTDIR=dest),
                           capture_output=True, text=True)
        if r.returncode:
            print(r.stdout + r.stderr)
            check(False, "cmake --install into a scratch DESTDIR")
            return 1
        cache = open(os.path.join(args.build, "CMakeCache.txt")).read()
        prefix = re.search(r"^CMAKE_INSTALL_PREFIX:PATH=(.*)$", cache, re.M).group(1)
        unitdir = re.search(r"^MESH_SYSTEMD_UNITDIR:STRING=(.*)$", cache, re.M).group(1)
        installed = os.path.join(dest + prefix, unitdir, "meshd@.service") if not os.path.isabs(unitdir) else \
            os.path.join(dest + unitdir, "meshd@.service")
        unit = open(installed).read()

        r = subprocess.run(["systemd-analyze", "security", "--offline=true", installed], capture_output=True,
                           text=True)
        m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout)
        score = float(m.group(1)) if m else None
        flagged = [l.split()[1] for l in r.stdout.splitlines() if l.startswith("✗")]
        check(score is not None and score <= args.max_score,
              f"systemd-analyze security --offline=true: exposure {score} <= {args.max_score}",
              (r.stdout + r.stderr)[-2000:])
        print(f"     still exposed: {' '.join(flagged)}")

        units = os.path.join(work, "units")
        os.mkdir(units)
        local = os.path.join(units, "meshd@1.service")
        exec_line = re.search(r"^ExecStart=(\S+)", unit, re.M).group(1)
        with open(local, "w") as f:
            f.write(unit.replace("ExecStart=" + exec_line, "ExecStart=" + dest + exec_line, 1))
        env = dict(os.environ, MANPATH=os.path.join(dest + prefix, "share", "man"))
        r = subprocess.run(["systemd-analyze", "verify", local], capture_output=True, text=True, env=env)
        check(r.returncode == 0 and not (r.stdout + r.stderr).strip(),
              "systemd-analyze verify meshd@1.service: clean (ExecStart in the scratch install)",
              (r.stdout + r.stderr).strip())

        instances_part(unit, work)
        if shutil.which("strace"):
            strace_part(args, work, unit)
        else:
            print("skip the strace part: strace is not installed (deploy/install-deps.sh installs it)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"unit: {'FAILED: ' + '; '.join(fails) if fails else 'all checks passed'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
