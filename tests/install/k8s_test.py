#!/usr/bin/env python3
"""deploy/k8s without a cluster: the manifests parsed (python3-yaml) and the fields the README
promises asserted, and the entry point meshd-k8s-start run for real against the built meshd.

  * DaemonSet: hostNetwork; NODE_NAME from spec.nodeName; started by meshd-k8s-start; mesh.conf and
    node-ids from the ConfigMap at /etc/rdmamesh; an rdma/ resource (the RDMA shared device plugin);
    IPC_LOCK added, everything else dropped; /run/meshd a hostPath; liveness an HTTP GET of /metrics
    on the port of the ConfigMap's cluster.metrics_listen; the key from a Secret as a file.
  * ConfigMap: every node-ids line names an id of mesh.conf's nodes, once each.
  * Application pod: the same hostPath at /run/meshd, in socket_group's gid (supplementalGroups).
  * meshd-k8s-start: NODE_NAME=worker-b starts meshd as node 2 (meshctl node says so) under
    meshd-keeper; a changed ConfigMap is reloaded, a broken one refused; meshd killed inside the pod
    is started again by the keeper while the entry point runs on; an unlisted node, a doubled name and
    a non-numeric id are refused with their reason.
Skipped (77) without python3-yaml.
"""
import argparse
import json
import shutil
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

try:
    import yaml
except ImportError:
    print("skip: python3-yaml is not installed (deploy/install-deps.sh installs it)")
    sys.exit(77)

fails = []


def check(ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what + ("" if ok or not detail else f": {detail}"))
    if not ok:
        fails.append(what)


def load(k8s):
    docs = {}
    for name in sorted(os.listdir(k8s)):
        if name.endswith(".yaml"):
            with open(os.path.join(k8s, name)) as f:
                for d in yaml.safe_load_all(f):
                    if d:
                        docs[(d["kind"], d["metadata"]["name"])] = d
    return docs


def manifests(k8s):
    docs = load(k8s)
    print(f"     parsed: {', '.join(f'{k}/{n}' for k, n in docs)}")
    ds = docs.get(("DaemonSet", "meshd"))
    cm = docs.get(("ConfigMap", "rdmamesh-config"))
    pod = next((d for (k, _), d in docs.items() if k == "Pod"), None)
    check(ds and cm and pod, "a DaemonSet meshd, a ConfigMap rdmamesh-config and an application Pod")
    if not (ds and cm and pod):
        return
    conf, ids = cm["data"]["mesh.conf"], cm["data"]["node-ids"]
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    vols = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}

    check(spec.get("hostNetwork") is True, "DaemonSet: hostNetwork")
    ns = docs.get(("Namespace", "rdmamesh"), {}).get("metadata", {}).get("labels", {})
    check(ns.get("pod-security.kubernetes.io/enforce") == "privileged" and
          ns.get("pod-security.kubernetes.io/warn") == "baseline",
          "Namespace: Pod Security labels (enforce privileged: host network, hostPath, IPC_LOCK; warn baseline)", str(ns))
    check(all(p.get("securityContext", {}).get("seccompProfile", {}).get("type") == "RuntimeDefault"
              for p in (spec, pod["spec"])), "DaemonSet and application pod: seccompProfile RuntimeDefault")
    app = pod["spec"]["containers"][0]
    check(any(k.startswith("rdma/") for k in app.get("resources", {}).get("limits", {})) and
          "IPC_LOCK" in app["securityContext"]["capabilities"].get("add", []),
          "application pod: the RDMA device and IPC_LOCK for its own QP (cluster.app_send)")
    env = {e["name"]: e for e in c.get("env", [])}
    check(env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
          "DaemonSet: NODE_NAME from spec.nodeName")
    check(c["command"][0].endswith("meshd-k8s-start"), "DaemonSet: started by meshd-k8s-start (node name -> node id)")
    cfg = mounts.get("/etc/rdmamesh")
    check(cfg and vols[cfg["name"]].get("configMap", {}).get("name") == "rdmamesh-config",
          "DaemonSet: /etc/rdmamesh is the ConfigMap rdmamesh-config")
    rdma = [k for k in c["resources"]["limits"] if k.startswith("rdma/")]
    check(rdma and int(c["resources"]["limits"][rdma[0]]) >= 1,
          f"DaemonSet: the RDMA device from the shared device plugin ({rdma})")
    caps = c["securityContext"]["capabilities"]
    check(caps.get("add") == ["IPC_LOCK"] and caps.get("drop") == ["ALL"], "DaemonSet: IPC_LOCK added, ALL else dropped",
          str(caps))
    sock = mounts.get("/run/meshd")
    check(sock and vols[sock["name"]].get("hostPath", {}).get("path") == "/run/meshd",
          "DaemonSet: /run/meshd (the control socket) is a hostPath")
    key = [m for m in c["volumeMounts"] if "secret" in vols[m["name"]]]
    kf = re.search(r'key_file\s*=\s*"([^"]+)"', conf)
    check(key and kf and key[0]["mountPath"] == kf.group(1) and key[0].get("subPath"),
          "DaemonSet: the Secret's key mounted as a file (subPath) where mesh.conf's key_file says")
    ml = re.search(r'metrics_listen\s*=\s*"([^"]+):(\d+)"', conf)
    probe = c.get("livenessProbe", {}).get("httpGet", {})
    check(ml and probe.get("path") == "/metrics" and probe.get("port") == int(ml.group(2))
          and probe.get("host", ml.group(1)) == ml.group(1),
          f"DaemonSet: liveness GET /metrics on cluster.metrics_listen ({ml and ml.group(0)})", str(probe))

    node_ids = set(int(x) for x in re.findall(r"\{\s*id\s*=\s*(\d+)", conf))
    pairs = [l.split() for l in ids.splitlines() if l.strip() and not l.strip().startswith("#")]
    names = [p[0] for p in pairs]
    check(pairs and all(len(p) == 2 and p[1].isdigit() and int(p[1]) in node_ids for p in pairs)
          and len(set(names)) == len(names) and len(set(p[1] for p in pairs)) == len(pairs),
          f"ConfigMap: node-ids maps {len(pairs)} Kubernetes nodes to distinct ids of mesh.conf's nodes {sorted(node_ids)}")

    ps = pod["spec"]
    pvols = {v["name"]: v for v in ps["volumes"]}
    pm = [m for ct in ps["containers"] for m in ct.get("volumeMounts", []) if m["mountPath"] == "/run/meshd"]
    check(pm and pvols[pm[0]["name"]].get("hostPath", {}).get("path") == "/run/meshd",
          "application pod: mounts the hostPath /run/meshd")
    grp = re.search(r'socket_group\s*=\s*"(\d+)"', conf)
    check(grp and int(grp.group(1)) in ps.get("securityContext", {}).get("supplementalGroups", []),
          f"application pod: in socket_group's gid ({grp and grp.group(1)})")
    run_as_group = c["securityContext"].get("runAsGroup")
    check(grp and run_as_group == int(grp.group(1)), "DaemonSet: meshd runs with socket_group's gid (no CAP_CHOWN needed)")


def entry_point(k8s, build, port):
    meshd = os.path.join(build, "node", "meshd")
    meshctl = os.path.join(build, "node", "meshctl")
    script = os.path.join(k8s, "meshd-k8s-start")
    work = tempfile.mkdtemp(prefix="mesh-k8s-")
    # mesh.conf as kubelet mounts a ConfigMap: a link into ..data, itself a link to the current
    # version's directory, swapped by a rename when the ConfigMap changes.
    cm = os.path.join(work, "config")
    os.mkdir(cm)
    conf = os.path.join(cm, "mesh.conf")

    def configmap(version, extra):
        d = os.path.join(cm, f"..v{version}")
        os.mkdir(d)
        with open(os.path.join(d, "mesh.conf"), "w") as f:
            f.write(f'cluster = {{ name = "k8s"; transport = "tcp"; {extra} }};\n'
                    f'nodes = (\n  {{ id = 1; addr = "127.0.0.1"; port = {port}; }},\n'
                    f'  {{ id = 2; addr = "127.0.0.1"; port = {port + 1}; }}\n);\n')
        os.symlink(f"..v{version}", os.path.join(cm, "..data_tmp"))
        os.replace(os.path.join(cm, "..data_tmp"), os.path.join(cm, "..data"))
        if not os.path.islink(conf):
            os.symlink("..data/mesh.conf", conf)

    configmap(1, 'log_level = "info";')
    ids = os.path.join(work, "node-ids")
    sock = os.path.join(work, "meshd.sock")
    env = dict(os.environ, MESH_CONFIG=conf, MESH_NODE_IDS=ids, MESH_SOCKET=sock, MESHD=meshd,
               MESHCTL=meshctl, MESH_RELOAD_POLL_S="1",
               MESH_KEEPER=os.path.join(os.path.dirname(meshd), "meshd-keeper"))

    def node_info():
        r = subprocess.run([meshctl, "-s", sock, "-j", "node"], capture_output=True, text=True)
        return json.loads(r.stdout) if r.returncode == 0 else {}

    def until(pred, secs):
        for _ in range(int(secs * 10)):
            v = pred()
            if v:
                return v
            time.sleep(0.1)
        return pred()

    def run(text, node, wait):
        with open(ids, "w") as f:
            f.write(text)
        p = subprocess.Popen(["sh", script], env=dict(env, NODE_NAME=node), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        if not wait:
            return p
        out, _ = p.communicate(timeout=10)
        return p.returncode, out

    p = run("# name id\nworker-a 1\nworker-b 2\n", "worker-b", False)
    try:
        node = None
        for _ in range(100):
            r = subprocess.run([meshctl, "-s", sock, "-j", "node"], capture_output=True, text=True)
            if r.returncode == 0:
                node = json.loads(r.stdout).get("id")
                break
            time.sleep(0.1)
        check(node == 2, "meshd-k8s-start: NODE_NAME=worker-b runs meshd as node 2 (meshctl node)", f"node {node}")
        # The ConfigMap changes: kubelet's swap of ..data, and meshd reloads without a restart.
        configmap(2, 'log_level = "debug";')
        n = until(lambda: node_info().get("config_generation") == 2 and node_info(), 20) or {}
        check(n.get("log_level") == "debug" and n.get("pid") == node_info().get("pid"),
              "a changed ConfigMap reaches meshd without a restart (meshctl reload: generation 2, log_level debug)",
              str({k: n.get(k) for k in ("config_generation", "log_level", "config_error")}))
        configmap(3, 'log_level = loud;')
        n = until(lambda: node_info().get("config_refused") == 1 and node_info(), 20) or {}
        check(n.get("config_generation") == 2 and "syntax error" in n.get("config_error", ""),
              "a broken ConfigMap is refused: meshd keeps generation 2 and says why (config_error)",
              str({k: n.get(k) for k in ("config_generation", "config_refused", "config_error")}))
        # meshd crashes inside the pod: meshd-keeper starts it again (its channels kept), the entry
        # point runs on. (From a good ConfigMap: a new meshd refuses a broken one, and its keeper
        # does not start it again.)
        configmap(4, 'log_level = "info";')
        until(lambda: node_info().get("config_generation") == 3, 20)
        pid0 = node_info().get("pid")
        if pid0:
            os.kill(pid0, signal.SIGKILL)
        n = until(lambda: node_info().get("pid") not in (None, pid0) and node_info(), 20) or {}
        check(pid0 and n.get("id") == 2 and p.poll() is None,
              "meshd killed inside the pod is started again by meshd-keeper (a new pid, node 2), the entry point "
              "runs on", f"pid {pid0} -> {n.get('pid')}, entry point {p.poll()}")
    finally:
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=10)
    out = p.stdout.read()
    check(rc == 0 and "changed: meshctl reload" in out and "kept its configuration" in out,
          "meshd-k8s-start passes SIGTERM to meshd and exits with its status (0), having said each reload",
          f"exit {rc}: {out[-600:]}")
    # A meshd that ends at once on SIGTERM: the script's wait returns early for the trapped signal
    # and meshd is gone before the script looks, so it must wait once more for meshd's own status
    # (it exited 143, the signal's, in 9 runs of 20 before). A stand-in meshd exiting 3.
    fake = os.path.join(work, "fake-meshd")
    with open(fake, "w") as f:
        f.write("#!/usr/bin/perl\n$SIG{TERM} = sub { exit 3 };\nsleep 1000;\n")
    os.chmod(fake, 0o755)
    with open(ids, "w") as f:
        f.write("worker-a 1\n")
    codes = []
    for _ in range(20):
        q = subprocess.Popen(["sh", script], env=dict(env, NODE_NAME="worker-a", MESHD=fake, MESH_KEEPER="",
                                                      MESH_RELOAD_POLL_S="0"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.2)
        q.send_signal(signal.SIGTERM)
        codes.append(q.wait(timeout=10))
    check(codes == [3] * 20, "meshd-k8s-start exits with meshd's own status when meshd ends at once on SIGTERM "
          "(20 times)", f"exit codes {codes}")
    for text, name, want in (("worker-a 1\n", "worker-z", 'no line for Kubernetes node "worker-z"'),
                             ("worker-a 1\nworker-a 2\n", "worker-a", "listed 2 times"),
                             ("worker-a one\n", "worker-a", "is not a number"),
                             ("worker-a 7\n", "worker-a", "node id 7 is not in nodes")):
        rc, out = run(text, name, True)
        check(rc != 0 and want in out, f"meshd-k8s-start refuses: {want}", f"exit {rc}: {out.strip()}")
    shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k8s", default="deploy/k8s")
    ap.add_argument("--build", default="build")
    ap.add_argument("--port", type=int, default=17980)
    args = ap.parse_args()
    manifests(args.k8s)
    entry_point(os.path.abspath(args.k8s), os.path.abspath(args.build), args.port)
    print(f"k8s: {'FAILED: ' + '; '.join(fails) if fails else 'all checks passed'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
