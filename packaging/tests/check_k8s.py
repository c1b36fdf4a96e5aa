#!/usr/bin/python3
"""Checks packaging/k8s/ against the real binaries: every YAML parses; each
container's flags are flags the binary's --help lists; $(VAR)s are defined;
probes, containerPort, scrape annotations and the PodMonitor all name the
--metrics-listen port; the socket, root, shared root and /dev/shm are node
paths (hostPath) that the example trainer mounts at the same places; the
coordinator Service's port is its --listen port and the one ckptd joins;
images carry the project version. Then `kubectl apply --dry-run=client` when
kubectl works without an API server (it does not here: it still asks one for
the REST mapping; that part is skipped with the reason).

Usage: check_k8s.py --manifests DIR --ckptd BIN --coordinator BIN --version V
Exit 0: all checks pass; 1: a check failed (each printed).
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tomllib

import yaml

errors = []


def check(cond, what):
    if not cond:
        errors.append(what)
    return cond


def help_flags(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out))


def flag_value(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return str(args[i + 1])
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def port_of(hostport):
    return int(hostport.rsplit(":", 1)[1])


def pod_spec(doc):
    return doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]


def volume_of(spec, container, mount_path):
    """The volume mounted at mount_path in container, or None."""
    for m in container.get("volumeMounts", []):
        if m["mountPath"] == mount_path:
            for v in spec.get("volumes", []):
                if v["name"] == m["name"]:
                    return v
            return {}
    return None


def mount_for(spec, container, path):
    """The (mountPath, volume) whose mountPath holds path (longest match)."""
    best = None
    for m in container.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best):
                best = mp
    return (best, volume_of(spec, container, best)) if best else (None, None)


def check_container(name, spec, c, flags, version, binary_name):
    check(c.get("image", "").endswith(":" + version), f"{name}: image {c.get('image')} is not tagged {version}")
    check(c.get("command", [None])[0] == "/usr/bin/" + binary_name, f"{name}: command is not /usr/bin/{binary_name}")
    args = [str(a) for a in c.get("args", [])]
    env = {e["name"] for e in c.get("env", [])}
    for a in args:
        if a.startswith("--"):
            flag = a.split("=", 1)[0]
            check(flag in flags, f"{name}: {flag} is not a flag of {binary_name}")
        for var in re.findall(r"\$\((\w+)\)", a):
            check(var in env, f"{name}: $({var}) in args but not in env")
    mounts = {m["name"] for m in c.get("volumeMounts", [])}
    vols = {v["name"] for v in spec.get("volumes", [])}
    claims = set()
    return args, mounts, vols, claims


def check_metrics(name, pod_meta, c, args):
    listen = flag_value(args, "--metrics-listen")
    if not check(listen is not None, f"{name}: no --metrics-listen"):
        return None
    port = port_of(listen)
    named = [p for p in c.get("ports", []) if p.get("name") == "metrics"]
    check(named and named[0]["containerPort"] == port, f"{name}: containerPort 'metrics' is not {port}")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in c:
            got = c[probe].get("httpGet", {})
            check(got.get("port") == port and got.get("path") == "/metrics",
                  f"{name}: {probe} is not GET /metrics on port {port}")
    check("livenessProbe" in c and "readinessProbe" in c, f"{name}: liveness and readiness probes")
    ann = pod_meta.get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == str(port)
          and ann.get("prometheus.io/path") == "/metrics", f"{name}: prometheus.io annotations do not name port {port}")
    return port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifests", required=True)
    ap.add_argument("--ckptd", required=True)
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--version", required=True)
    opts = ap.parse_args()

    docs = []
    files = sorted(glob.glob(os.path.join(opts.manifests, "*.yaml")))
    check(files, f"no YAML in {opts.manifests}")
    for f in files:
        with open(f) as fh:
            for d in yaml.safe_load_all(fh):  # raises on a syntax error
                if d is None:
                    continue
                for key in ("apiVersion", "kind", "metadata"):
                    check(key in d, f"{os.path.basename(f)}: no {key}")
                docs.append(d)
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    print(f"parsed {len(docs)} objects from {len(files)} files")

    ds = by.get(("DaemonSet", "ckptd"))
    sts = by.get(("StatefulSet", "ckpt-coordinator"))
    svc = by.get(("Service", "ckpt-coordinator"))
    pm = next((d for d in docs if d["kind"] == "PodMonitor"), None)
    trainer = next((d for d in docs if d["kind"] == "Pod"), None)
    for what, d in (("DaemonSet ckptd", ds), ("StatefulSet ckpt-coordinator", sts),
                    ("Service ckpt-coordinator", svc), ("PodMonitor", pm), ("a trainer Pod", trainer)):
        check(d is not None, f"missing {what}")
    if errors:
        return finish()

    # ckptd's DaemonSet.
    spec = pod_spec(ds)
    c = spec["containers"][0]
    args, mounts, vols, _ = check_container("ckptd", spec, c, help_flags(opts.ckptd), opts.version, "ckptd")
    check(ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items(),
          "ckptd: selector does not match the pod labels")
    check(mounts <= vols, f"ckptd: mounts without volumes: {mounts - vols}")
    check(spec.get("nodeSelector") and spec.get("tolerations"), "ckptd: no nodeSelector/tolerations for GPU nodes")
    check(spec.get("hostPID") is True, "ckptd: hostPID (peer pids of trainers in other pods)")
    check(c.get("resources", {}).get("requests"), "ckptd: no resource requests")
    check("memory" not in c.get("resources", {}).get("limits", {}), "ckptd: a memory limit (arena pages are charged to it)")
    ckptd_port = check_metrics("ckptd", ds["spec"]["template"]["metadata"], c, args)
    socket = flag_value(args, "--socket")
    root = flag_value(args, "--root")
    shared = flag_value(args, "--shared-root")
    config = flag_value(args, "--config")
    node_paths = {}
    for what, path in (("--socket", socket), ("--root", root), ("--shared-root", shared)):
        if not check(path, f"ckptd: no {what}"):
            continue
        mp, vol = mount_for(spec, c, path if what != "--socket" else os.path.dirname(path))
        ok = check(vol and "hostPath" in vol, f"ckptd: {what} {path} is not on a hostPath volume")
        if ok:
            check(vol["hostPath"]["path"] == mp, f"ckptd: {what}: hostPath {vol['hostPath']['path']} is mounted at {mp}")
            node_paths[what] = mp
    shm = volume_of(spec, c, "/dev/shm")
    check(shm and shm.get("hostPath", {}).get("path") == "/dev/shm", "ckptd: /dev/shm is not the node's (hostPath)")
    mp, vol = mount_for(spec, c, config or "")
    if check(vol and "configMap" in vol, f"ckptd: --config {config} is not on a ConfigMap"):
        cm = by.get(("ConfigMap", vol["configMap"]["name"]))
        key = os.path.relpath(config, mp)
        if check(cm and key in cm.get("data", {}), f"ckptd: ConfigMap has no {key}"):
            known = set(tomllib.load(open(os.path.join(os.path.dirname(opts.manifests), "ckptd.toml"), "rb")))
            commented = set(re.findall(r"^# ?([a-z_]+) =", open(os.path.join(os.path.dirname(opts.manifests), "ckptd.toml")).read(), re.M))
            for k in tomllib.loads(cm["data"][key]):
                check(k in known | commented, f"ckptd: config key {k} is not one of packaging/ckptd.toml's")

    # The coordinator.
    cspec = pod_spec(sts)
    cc = cspec["containers"][0]
    cargs, cmounts, cvols, _ = check_container("ckpt-coordinator", cspec, cc, help_flags(opts.coordinator),
                                               opts.version, "ckpt-coordinator")
    claim_names = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])}
    check(cmounts <= cvols | claim_names, f"ckpt-coordinator: mounts without volumes: {cmounts - cvols - claim_names}")
    check(sts["spec"].get("replicas") == 1, "ckpt-coordinator: replicas must be 1")
    check_metrics("ckpt-coordinator", sts["spec"]["template"]["metadata"], cc, cargs)
    listen_port = port_of(flag_value(cargs, "--listen") or ":0")
    svc_ports = {p["name"]: p for p in svc["spec"]["ports"]}
    check(svc_ports.get("grpc", {}).get("targetPort") == listen_port, "Service grpc targetPort is not --listen's port")
    check(svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items(),
          "Service selector does not match the coordinator pods")
    joined = flag_value(args, "--coordinator")
    want = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local:{svc_ports.get('grpc', {}).get('port')}"
    check(joined == want, f"ckptd --coordinator {joined} is not the Service ({want})")
    check(flag_value(cargs, "--shared-root") == shared, "coordinator and ckptd disagree on the shared root")

    # PodMonitor: selects both, on the port named metrics.
    sel = pm["spec"]["selector"]
    names = set()
    for e in sel.get("matchExpressions", []):
        if e["key"] == "app.kubernetes.io/name" and e["operator"] == "In":
            names |= set(e["values"])
    names |= {v for k, v in sel.get("matchLabels", {}).items() if k == "app.kubernetes.io/name"}
    check({"ckptd", "ckpt-coordinator"} <= names, "PodMonitor does not select ckptd and ckpt-coordinator")
    check(all(e.get("port") == "metrics" and e.get("path") == "/metrics" for e in pm["spec"]["podMetricsEndpoints"]),
          "PodMonitor does not scrape port 'metrics' at /metrics")

    # The trainer reaches the node's socket and arenas, and the shard paths.
    tspec = pod_spec(trainer)
    tc = tspec["containers"][0]
    env = {e["name"]: e.get("value") for e in tc.get("env", [])}
    check(env.get("CKPT_SOCKET") == socket, f"trainer: CKPT_SOCKET {env.get('CKPT_SOCKET')} is not ckptd's {socket}")
    tshm = volume_of(tspec, tc, "/dev/shm")
    check(tshm and tshm.get("hostPath", {}).get("path") == "/dev/shm", "trainer: /dev/shm is not the node's")
    for what, mp in node_paths.items():
        tv = volume_of(tspec, tc, mp)
        check(tv and tv.get("hostPath", {}).get("path") == mp, f"trainer: does not mount the node's {mp} ({what})")
    check(tc.get("command", [None])[0] == "/usr/bin/ckpt-worker", "trainer: not ckpt-worker")
    check(tspec.get("securityContext", {}).get("runAsUser", 0) != 0, "trainer: should run as a job's own uid")

    kubectl_dry_run(opts.manifests)
    return finish()


def kubectl_dry_run(manifests):
    kubectl = "/usr/bin/kubectl"
    if not os.access(kubectl, os.X_OK):
        print("kubectl: skipped (not installed)")
        return
    r = subprocess.run([kubectl, "apply", "--dry-run=client", "--validate=false", "-f", manifests],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "KUBECONFIG": "/dev/null"})
    if "connection refused" in r.stderr or "unable to recognize" in r.stderr or "couldn't get" in r.stderr:
        print("kubectl: skipped (kubectl apply --dry-run=client still asks an API server for the REST mapping; none here)")
        return
    check(r.returncode == 0, f"kubectl apply --dry-run=client: {r.stderr.strip()[:500]}")
    print(r.stdout.strip())


def finish():
    for e in errors:
        print("FAIL:", e)
    print("PASS" if not errors else f"{len(errors)} checks failed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
