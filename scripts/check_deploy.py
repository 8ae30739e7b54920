#!/usr/bin/env python3
"""Static checks of deploy/ (docs/deploy.md, "What is checked").

Docker, a Kubernetes cluster and systemd as PID 1 are not available where
the tests run, so nothing here builds an image or applies a manifest. What
is checked instead:

  yaml     every *.yml / *.yaml under deploy/ parses
  k8s      Kubernetes objects of deploy/k8s: apiVersion, kind, metadata.name;
           kustomization resources exist; Deployment/DaemonSet selectors
           match their template labels; every container has image, args,
           readiness and liveness probes, resources, runAsNonRoot (the
           agent: root with only the capabilities of ROOT_CAPABILITIES),
           no privilege escalation, drop ALL, no hostPID/IPC/Network;
           Services have named ports and select a workload; PVCs request
           storage; every Secret/ConfigMap/PVC a pod mounts is in the base;
           the coordinator ConfigMap obeys config.schema.json. The same
           checks run on the base with each kustomize Component under
           deploy/k8s applied (k8s/ha, docs/ha.md: its resources, its
           `$patch: delete` and JSON 6902 patches), plus, for coordinator
           replicas (--store=etcd://): 2+ replicas, no PVC, --advertise from
           the downward API, readiness on `meshctl health` but no liveness
           or startup probe on it (that would restart every standby), a
           shared --worker-token-key, a rollout that cannot stall
  compose  deploy/compose: Dockerfiles, bind-mounted files and secrets
           exist (or are made by gen-certs.sh); no --insecure anywhere;
           coordinator replicas (--store=etcd://, compose.ha.yaml) restart
           on failure (exit 3), set --advertise and a shared
           --worker-token-key, name etcd services of the file, and every
           agent's MESH_COORDINATOR lists every replica
  docker   Dockerfiles under deploy/docker: several FROM stages, and a final
           stage with a non-root USER and a HEALTHCHECK; those under
           deploy/compose (etcd.Dockerfile: nothing built, one stage): the
           non-root USER and the HEALTHCHECK
  systemd  `systemd-analyze verify` of deploy/systemd/*.service (ExecStart
           pointed at stub executables) and the `systemd-analyze security`
           exposure at or below 2.0 (mesh-agent.service: 4.0, MAX_EXPOSURE_BY_UNIT);
           exit 77 (skip) without systemd-analyze
  selftest each check above fails on a deliberately broken copy of deploy/

Usage: check_deploy.py [--root REPO] {yaml,k8s,compose,docker,systemd,selftest,all}
Exit: 0 ok, 1 problems found (listed on stderr), 77 skipped, 2 usage.
"""

import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:  # Debian: python3-yaml (scripts/install-deps.sh).
    print("check_deploy.py: SKIP: python3-yaml is not installed", file=sys.stderr)
    sys.exit(77)

SKIP = 77
MAX_EXPOSURE = 2.0
# The agent runs as root with the capabilities job isolation needs (workers
# as their owners' accounts, delegated cgroups, the eBPF device program;
# deploy/systemd/mesh-agent.service says which and why): its own ceiling.
MAX_EXPOSURE_BY_UNIT = {"mesh-agent.service": 4.0}


class Problems:
    def __init__(self):
        self.items = []

    def add(self, where, message):
        self.items.append(f"{where}: {message}")


def rel(root, path):
    return os.path.relpath(path, root)


def yaml_files(deploy):
    for base, _, files in os.walk(deploy):
        for name in sorted(files):
            if name.endswith((".yml", ".yaml")) and "/certs" not in base:
                yield os.path.join(base, name)


def load_all(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def check_yaml(root, problems):
    count = 0
    for path in yaml_files(os.path.join(root, "deploy")):
        try:
            load_all(path)
            count += 1
        except yaml.YAMLError as e:
            problems.add(rel(root, path), f"does not parse: {e}")
    if count == 0:
        problems.add("deploy/", "no YAML files found")


# ---- Kubernetes -------------------------------------------------------------

WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet")


def schema_problems(value, schema, where):
    """A small JSON Schema subset: type, enum, minimum/maximum,
    exclusiveMinimum, pattern, properties, additionalProperties."""
    out = []
    types = {"object": dict, "string": str, "boolean": bool, "array": list}
    t = schema.get("type")
    if t in ("integer", "number"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if t == "integer":
            ok = ok and isinstance(value, int)
        if not ok:
            return [f"{where}: {value!r} is not {t}"]
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{where}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{where}: {value} > maximum {schema['maximum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            out.append(f"{where}: {value} <= {schema['exclusiveMinimum']}")
    elif t in types and not isinstance(value, types[t]):
        return [f"{where}: {value!r} is not {t}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        out.append(f"{where}: {value!r} does not match {schema['pattern']}")
    if t == "object":
        props = schema.get("properties", {})
        for key, sub in value.items():
            if key in props:
                out += schema_problems(sub, props[key], f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{where}: unknown key '{key}'")
    return out


def pod_specs(obj):
    if obj.get("kind") in WORKLOADS:
        return [obj.get("spec", {}).get("template", {}).get("spec", {})]
    return []


# Workloads that may run as root, and the only capabilities they may add back
# after dropping ALL: the agent starts workers as their owners' accounts in
# cgroups of their own (deploy/k8s/agent-daemonset.yaml says why each).
ROOT_CAPABILITIES = {
    "mesh-agent": {"SETUID", "SETGID", "KILL", "CHOWN", "FOWNER", "DAC_OVERRIDE", "SYS_ADMIN"},
}


def check_container(where, c, pod, problems, workload=""):
    name = c.get("name", "?")
    w = f"{where} container {name}"
    for key in ("image", "args", "resources"):
        if not c.get(key):
            problems.add(w, f"has no {key}")
    for probe in ("readinessProbe", "livenessProbe"):
        p = c.get(probe)
        if not p or not any(k in p for k in ("exec", "httpGet", "grpc", "tcpSocket")):
            problems.add(w, f"has no {probe} with a handler")
    res = c.get("resources") or {}
    if not res.get("requests"):
        problems.add(w, "has no resources.requests")
    if not (res.get("limits") or {}).get("memory"):
        problems.add(w, "has no memory limit")
    sc = c.get("securityContext") or {}
    psc = pod.get("securityContext") or {}
    allowed = ROOT_CAPABILITIES.get(workload)
    if allowed is None and not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
        problems.add(w, "does not set securityContext.runAsNonRoot: true")
    if sc.get("allowPrivilegeEscalation") is not False:
        problems.add(w, "does not set allowPrivilegeEscalation: false")
    if sc.get("privileged"):
        problems.add(w, "is privileged")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        problems.add(w, "does not drop ALL capabilities")
    extra = sorted(set(caps.get("add") or []) - (allowed or set()))
    if extra:
        problems.add(w, f"adds capabilities {extra}")
    for key in ("hostPID", "hostIPC", "hostNetwork"):
        if pod.get(key):
            problems.add(w, f"sets {key}")
    mounts = {m.get("name") for m in c.get("volumeMounts") or []}
    volumes = {v.get("name") for v in pod.get("volumes") or []}
    for m in sorted(mounts - volumes):
        problems.add(w, f"mounts volume '{m}' that the pod does not define")


def check_k8s(root, problems):
    k8s = os.path.join(root, "deploy", "k8s")
    kfile = os.path.join(k8s, "kustomization.yaml")
    if not os.path.exists(kfile):
        problems.add("deploy/k8s", "no kustomization.yaml")
        return
    kust = load_all(kfile)[0]
    objects = []  # (file, object) of the base
    for res in kust.get("resources", []):
        path = os.path.join(k8s, res)
        if not os.path.exists(path):
            problems.add("deploy/k8s/kustomization.yaml", f"resource {res} does not exist")
            continue
        objects += [(rel(root, path), o) for o in load_all(path)]
    for path in yaml_files(os.path.join(k8s, "optional")):
        for o in load_all(path):
            if not all(o.get(k) for k in ("apiVersion", "kind")):
                problems.add(rel(root, path), "object without apiVersion/kind")
    check_k8s_objects(root, k8s, objects, problems)
    # Components (k8s/ha): the base with each applied, checked the same way.
    for name in sorted(os.listdir(k8s)):
        cfile = os.path.join(k8s, name, "kustomization.yaml")
        if not os.path.exists(cfile):
            continue
        comp = load_all(cfile)[0]
        if comp.get("kind") != "Component":
            problems.add(rel(root, cfile), "is not a kustomize Component (an overlay inside "
                                           "its base's folder is a cycle to kustomize)")
            continue
        rendered = apply_component(root, os.path.join(k8s, name), comp, objects, problems)
        if rendered is not None:
            label = f" (with deploy/k8s/{name})"
            check_k8s_objects(root, k8s, [(w + label, o) for w, o in rendered], problems)


def json_patch(doc, ops, where):
    """RFC 6902 add/remove/replace/test on `doc` (modified in place).
    Returns a problem message, or None."""
    for op in ops:
        path = op.get("path", "")
        keys = [k.replace("~1", "/").replace("~0", "~") for k in path.split("/")[1:]]
        parent = doc
        try:
            for k in keys[:-1]:
                parent = parent[int(k)] if isinstance(parent, list) else parent[k]
            last = keys[-1]
            kind = op.get("op")
            if isinstance(parent, list):
                index = len(parent) if last == "-" else int(last)
                if kind == "test" and parent[index] != op.get("value"):
                    return f"{where}: test {path} == {op.get('value')!r} fails: {parent[index]!r}"
                if kind == "remove":
                    del parent[index]
                elif kind == "replace":
                    parent[index] = copy.deepcopy(op["value"])
                elif kind == "add":
                    parent.insert(index, copy.deepcopy(op["value"]))
            else:
                if kind == "test" and parent.get(last, object()) != op.get("value"):
                    return f"{where}: test {path} == {op.get('value')!r} fails: " \
                           f"{parent.get(last)!r}"
                if kind == "remove":
                    del parent[last]
                elif kind == "replace":
                    if last not in parent:
                        return f"{where}: replace {path}: no such member"
                    parent[last] = copy.deepcopy(op["value"])
                elif kind == "add":
                    parent[last] = copy.deepcopy(op["value"])
            if kind not in ("add", "remove", "replace", "test"):
                return f"{where}: unsupported op {kind!r}"
        except (KeyError, IndexError, ValueError, TypeError) as e:
            return f"{where}: {op.get('op')} {path}: no such path ({e!r})"
    return None


def apply_component(root, cdir, comp, base, problems):
    """The base's objects with the Component in `cdir` applied, or None."""
    where = rel(root, os.path.join(cdir, "kustomization.yaml"))
    objects = [(w, copy.deepcopy(o)) for w, o in base]
    for res in comp.get("resources", []):
        path = os.path.join(cdir, res)
        if not os.path.exists(path):
            problems.add(where, f"resource {res} does not exist")
            return None
        objects += [(rel(root, path), o) for o in load_all(path)]
    for patch in comp.get("patches", []):
        path = os.path.join(cdir, patch.get("path", ""))
        if not os.path.isfile(path):
            problems.add(where, f"patch {patch.get('path')} does not exist")
            return None
        docs = load_all(path)
        target = patch.get("target")
        if target is None:  # Only `$patch: delete` of a whole object.
            for d in docs:
                if not isinstance(d, dict) or d.get("$patch") != "delete":
                    problems.add(rel(root, path), "a patch without target must be "
                                                  "`$patch: delete` here")
                    return None
                name = (d.get("metadata") or {}).get("name")
                kept = [(w, o) for w, o in objects if not (
                    o.get("kind") == d.get("kind") and o["metadata"].get("name") == name)]
                if len(kept) == len(objects):
                    problems.add(rel(root, path), f"deletes {d.get('kind')}/{name}, which the "
                                                  "base does not have")
                objects = kept
            continue
        ops = docs[0] if docs else []
        matched = [o for _, o in objects if o.get("kind") == target.get("kind")
                   and o["metadata"].get("name") == target.get("name")]
        if not matched:
            problems.add(where, f"patch target {target.get('kind')}/{target.get('name')} "
                                "is not in the base")
            return None
        for o in matched:
            bad = json_patch(o, ops, rel(root, path))
            if bad:
                problems.add(rel(root, path), bad)
                return None
    return objects


def flag_values(args, flag):
    return [a.split("=", 1)[1] for a in args or [] if isinstance(a, str)
            and a.startswith(flag + "=")]


def check_k8s_replicas(w, spec, pod, problems):
    """A coordinator Deployment on an etcd store (docs/ha.md)."""
    c = (pod.get("containers") or [{}])[0]
    args = c.get("args") or []
    if (spec.get("replicas") or 1) < 2:
        problems.add(w, "--store=etcd:// but fewer than 2 replicas")
    if any("persistentVolumeClaim" in v for v in pod.get("volumes") or []):
        problems.add(w, "--store=etcd:// keeps no state on a volume, but a PVC is mounted")
    advertise = flag_values(args, "--advertise")
    if not advertise:
        problems.add(w, "replicas need --advertise (the pod IP, from the downward API)")
    env = {e.get("name") for e in c.get("env") or []}
    for var in re.findall(r"\$\((\w+)\)", " ".join(advertise)):
        if var not in env:
            problems.add(w, f"--advertise uses $({var}), which the container's env lacks")
    ready = json.dumps(c.get("readinessProbe") or {})
    if "health" not in ready:
        problems.add(w, "readinessProbe does not run `meshctl health` (only the leader is "
                        "SERVING, so only it should be Ready)")
    for probe in ("livenessProbe", "startupProbe"):
        if "health" in json.dumps(c.get(probe) or {}):
            problems.add(w, f"{probe} runs `meshctl health`, which fails on every standby")
    if flag_values(args, "--auth-tokens") and not flag_values(args, "--worker-token-key"):
        problems.add(w, "replicas with tokens need one shared --worker-token-key")
    strategy = spec.get("strategy") or {}
    if strategy.get("type", "RollingUpdate") == "RollingUpdate":
        unavailable = (strategy.get("rollingUpdate") or {}).get("maxUnavailable", "25%")
        if unavailable != "100%" and not (isinstance(unavailable, int) and
                                          unavailable >= (spec.get("replicas") or 1)):
            problems.add(w, f"maxUnavailable {unavailable}: standbys are never Ready, so a "
                            "rolling update stalls; use 100%")


def check_k8s_objects(root, k8s, objects, problems):
    by_kind = {}
    for where, o in objects:
        for key in ("apiVersion", "kind"):
            if not o.get(key):
                problems.add(where, f"object without {key}")
        name = (o.get("metadata") or {}).get("name")
        if not name:
            problems.add(where, f"{o.get('kind')} without metadata.name")
        by_kind.setdefault(o.get("kind"), {})[name] = (where, o)

    for kind in WORKLOADS:
        for name, (where, o) in by_kind.get(kind, {}).items():
            w = f"{where} {kind}/{name}"
            spec = o.get("spec") or {}
            selector = (spec.get("selector") or {}).get("matchLabels") or {}
            labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
            if not selector:
                problems.add(w, "has no spec.selector.matchLabels")
            for k, v in selector.items():
                if labels.get(k) != v:
                    problems.add(w, f"selector {k}={v} does not match the template labels {labels}")
            pod = pod_specs(o)[0]
            if not pod.get("containers"):
                problems.add(w, "has no containers")
            for c in pod.get("containers") or []:
                check_container(w, c, pod, problems, workload=name)
            for v in pod.get("volumes") or []:
                for src, field, ref_kind in (("secret", "secretName", "Secret"),
                                             ("configMap", "name", "ConfigMap"),
                                             ("persistentVolumeClaim", "claimName",
                                              "PersistentVolumeClaim")):
                    if src in v:
                        ref = v[src].get(field)
                        if ref not in by_kind.get(ref_kind, {}):
                            problems.add(w, f"volume {v.get('name')} names {ref_kind} '{ref}', "
                                            "which is not in the base")
            if any(a.startswith("--store=etcd://") for c in pod.get("containers") or []
                   for a in c.get("args") or [] if isinstance(a, str)):
                check_k8s_replicas(w, spec, pod, problems)
            if kind == "Deployment" and (spec.get("replicas", 1) == 1 and any(
                    "persistentVolumeClaim" in v for v in pod.get("volumes") or [])):
                if (spec.get("strategy") or {}).get("type") != "Recreate":
                    problems.add(w, "has a ReadWriteOnce state volume but no Recreate strategy")

    workloads_labels = [((o.get("spec") or {}).get("template") or {}).get("metadata", {})
                        .get("labels") or {}
                        for kind in WORKLOADS for _, o in by_kind.get(kind, {}).values()]
    for name, (where, o) in by_kind.get("Service", {}).items():
        w = f"{where} Service/{name}"
        spec = o.get("spec") or {}
        ports = spec.get("ports") or []
        if not ports:
            problems.add(w, "has no ports")
        for p in ports:
            if not p.get("name") or not isinstance(p.get("port"), int):
                problems.add(w, f"port {p} needs a name and an integer port")
        sel = spec.get("selector") or {}
        if not any(all(l.get(k) == v for k, v in sel.items()) for l in workloads_labels):
            problems.add(w, f"selector {sel} matches no workload of the base")

    for name, (where, o) in by_kind.get("PersistentVolumeClaim", {}).items():
        storage = (((o.get("spec") or {}).get("resources") or {}).get("requests") or {}).get(
            "storage")
        if not storage:
            problems.add(f"{where} PersistentVolumeClaim/{name}", "requests no storage")

    for name, (where, o) in by_kind.get("Secret", {}).items():
        for key, value in (o.get("stringData") or {}).items():
            if "PRIVATE KEY-----" in str(value) and "REPLACE-ME" not in str(value):
                problems.add(f"{where} Secret/{name}", f"'{key}' holds a real private key")

    schema_path = os.path.join(k8s, "config.schema.json")
    cm = by_kind.get("ConfigMap", {}).get("mesh-coordinator-config")
    if cm is None:
        problems.add("deploy/k8s", "no ConfigMap mesh-coordinator-config")
    elif not os.path.exists(schema_path):
        problems.add("deploy/k8s", "no config.schema.json")
    else:
        with open(schema_path, encoding="utf-8") as f:
            schema = json.load(f)
        where, o = cm
        config = yaml.safe_load((o.get("data") or {}).get("coordinator.yaml", "")) or {}
        for p in schema_problems(config, schema, "coordinator.yaml"):
            problems.add(f"{where} ConfigMap/mesh-coordinator-config", p)


# ---- Compose ------------------------------------------------------------------


# Compose files that stand alone (the others are overlays of compose.yaml).
STANDALONE_COMPOSE = ("compose.yaml", "compose.ha.yaml")


def check_compose_replicas(where, doc, problems):
    """Coordinator replicas on an etcd store (compose.ha.yaml, docs/ha.md)."""
    services = doc.get("services") or {}
    replicas = {}
    for name, svc in services.items():
        cmd = svc.get("command") or []
        cmd = cmd.split() if isinstance(cmd, str) else cmd
        stores = flag_values(cmd, "--store")
        if not any(v.startswith("etcd://") for v in stores):
            continue
        replicas[svc.get("hostname", name)] = name
        w = f"{where} service {name}"
        if svc.get("restart") not in ("on-failure", "always", "unless-stopped"):
            problems.add(w, f"restart {svc.get('restart')!r}: a deposed leader exits 3 and "
                            "must be restarted (on-failure)")
        if not flag_values(cmd, "--advertise"):
            problems.add(w, "a replica needs --advertise (its service name)")
        if flag_values(cmd, "--auth-tokens") and not flag_values(cmd, "--worker-token-key"):
            problems.add(w, "replicas with tokens need one shared --worker-token-key")
        hosts = stores[0][len("etcd://"):].split("/", 1)[0].split(",")
        for h in hosts:
            if h.rsplit(":", 1)[0] not in services:
                problems.add(w, f"--store names {h}, which is no service of this file")
    if not replicas:
        return
    if len(replicas) < 2:
        problems.add(where, "--store=etcd:// with fewer than 2 coordinator replicas")
    for name, svc in services.items():
        env = svc.get("environment") or {}
        if isinstance(env, list):
            env = dict(e.split("=", 1) for e in env if "=" in e)
        if "MESH_COORDINATOR" not in env:
            continue
        named = {a.strip().rsplit(":", 1)[0] for a in str(env["MESH_COORDINATOR"]).split(",")}
        missing = sorted(set(replicas) - named)
        if missing:
            problems.add(f"{where} service {name}",
                         f"MESH_COORDINATOR does not list the replicas {missing}")


def check_compose(root, problems):
    cdir = os.path.join(root, "deploy", "compose")
    gen = os.path.join(cdir, "gen-certs.sh")
    generated = open(gen, encoding="utf-8").read() if os.path.exists(gen) else ""
    files = [p for p in yaml_files(cdir) if os.path.basename(p).startswith("compose")]
    if not files:
        problems.add("deploy/compose", "no compose file")
    for path in files:
        where = rel(root, path)
        doc = load_all(path)[0]
        text = open(path, encoding="utf-8").read()
        if re.search(r"^[^#\n]*--insecure", text, re.M):
            problems.add(where, "uses --insecure: the compose network must use TLS")
        declared = set((doc.get("secrets") or {}).keys())
        for name, spec in (doc.get("secrets") or {}).items():
            f = (spec or {}).get("file", "")
            full = os.path.normpath(os.path.join(cdir, f))
            stem = os.path.basename(f).split(".")[0]
            made = f.startswith("./certs/") and re.search(rf"\b{re.escape(stem)}\b", generated)
            if not os.path.exists(full) and not made:
                problems.add(where, f"secret {name}: {f} does not exist and gen-certs.sh "
                                    "does not make it")
        for sname, svc in (doc.get("services") or {}).items():
            w = f"{where} service {sname}"
            build = svc.get("build")
            if isinstance(build, dict):
                ctx = os.path.normpath(os.path.join(cdir, build.get("context", ".")))
                df = os.path.join(ctx, build.get("dockerfile", "Dockerfile"))
                if not os.path.exists(df):
                    problems.add(w, f"dockerfile {rel(root, df)} does not exist")
            for s in svc.get("secrets") or []:
                s = s if isinstance(s, str) else s.get("source")
                if os.path.basename(path) in STANDALONE_COMPOSE and s not in declared:
                    problems.add(w, f"secret {s} is not declared")
            for v in svc.get("volumes") or []:
                src = v.split(":")[0] if isinstance(v, str) else v.get("source", "")
                if src.startswith("."):
                    full = os.path.normpath(os.path.join(cdir, src))
                    if not os.path.exists(full):
                        problems.add(w, f"bind mount {src} does not exist")
            if "image" not in svc and "build" not in svc and \
                    os.path.basename(path) in STANDALONE_COMPOSE:
                problems.add(w, "has neither image nor build")
        check_compose_replicas(where, doc, problems)


# ---- Dockerfiles -----------------------------------------------------------------


def dockerfile_lines(path):
    """Instructions with continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in open(path, encoding="utf-8"):
        s = line.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        cur += " " + s.rstrip("\\").strip()
        if not s.endswith("\\"):
            out.append(cur.strip())
            cur = ""
    return out


def dockerfiles(folder):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder)
                  if f.endswith("Dockerfile")) if os.path.isdir(folder) else []


def check_docker(root, problems):
    ddir = os.path.join(root, "deploy", "docker")
    paths = dockerfiles(ddir)
    if not paths:
        problems.add("deploy/docker", "no Dockerfiles")
    # Mesh's images build it (several stages); compose's own (etcd) build nothing.
    for path in paths + dockerfiles(os.path.join(root, "deploy", "compose")):
        where = rel(root, path)
        lines = dockerfile_lines(path)
        froms = [i for i, l in enumerate(lines) if l.upper().startswith("FROM ")]
        if not froms:
            problems.add(where, "has no FROM")
            continue
        if len(froms) < 2 and path in paths:
            problems.add(where, "is not multi-stage (fewer than two FROM)")
            continue
        final = lines[froms[-1]:]
        users = [l.split(None, 1)[1] for l in final if l.upper().startswith("USER ")]
        if not users:
            problems.add(where, "final stage has no USER")
        elif users[-1].split(":")[0] in ("root", "0"):
            problems.add(where, f"final stage runs as {users[-1]}")
        if not any(l.upper().startswith("HEALTHCHECK ") and "NONE" not in l.upper()
                   for l in final):
            problems.add(where, "final stage has no HEALTHCHECK")
        for l in lines:
            if "--insecure" in l:
                problems.add(where, "uses --insecure")


# ---- systemd ---------------------------------------------------------------------


def check_systemd(root, problems):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        print("check_deploy.py: SKIP systemd: systemd-analyze not found", file=sys.stderr)
        return SKIP
    sdir = os.path.join(root, "deploy", "systemd")
    units = sorted(f for f in os.listdir(sdir) if f.endswith(".service"))
    if not units:
        problems.add("deploy/systemd", "no units")
    with tempfile.TemporaryDirectory() as tmp:
        for unit in units:
            text = open(os.path.join(sdir, unit), encoding="utf-8").read()
            for key in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "User=",
                        "NoNewPrivileges=yes", "ProtectSystem=strict"):
                if key not in text:
                    problems.add(f"deploy/systemd/{unit}", f"lacks {key}")
            # verify wants ExecStart to be executable: point it at stubs.
            for binary in set(re.findall(r"/usr/local/bin/([\w-]+)", text)):
                stub = os.path.join(tmp, binary)
                with open(stub, "w") as f:
                    f.write("#!/bin/sh\n")
                os.chmod(stub, 0o755)
            copy = os.path.join(tmp, unit)
            with open(copy, "w") as f:
                f.write(text.replace("/usr/local/bin/", tmp + "/"))
            r = subprocess.run([analyze, "verify", copy], capture_output=True, text=True,
                               timeout=60)
            if r.returncode != 0 or r.stderr.strip():
                problems.add(f"deploy/systemd/{unit}",
                             f"systemd-analyze verify: {(r.stderr or r.stdout).strip()}")
            r = subprocess.run([analyze, "security", "--offline=true", copy],
                               capture_output=True, text=True, timeout=60)
            m = re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout + r.stderr)
            if not m:
                problems.add(f"deploy/systemd/{unit}", "systemd-analyze security gave no score")
            else:
                score = float(m.group(1))
                print(f"check_deploy.py: {unit}: exposure {score}")
                ceiling = MAX_EXPOSURE_BY_UNIT.get(unit, MAX_EXPOSURE)
                if score > ceiling:
                    problems.add(f"deploy/systemd/{unit}",
                                 f"exposure {score} is above {ceiling}")
    return 0


# ---- Self-test -------------------------------------------------------------------

CHECKS = {"yaml": check_yaml, "k8s": check_k8s, "compose": check_compose,
          "docker": check_docker, "systemd": check_systemd}

# (check, file under deploy/, old text, new text): each must make `check` fail.
BREAKAGES = [
    ("yaml", "k8s/pvc.yaml", "accessModes: [ReadWriteOnce]", "accessModes: [ReadWriteOnce"),
    ("k8s", "k8s/coordinator-deployment.yaml", "      app.kubernetes.io/name: mesh-coordinator\n"
     "  template:", "      app.kubernetes.io/name: mesh-coordinatr\n  template:"),
    ("k8s", "k8s/agent-daemonset.yaml", "secretName: mesh-agent-tokens",
     "secretName: mesh-agent-tokenz"),
    ("k8s", "k8s/agent-daemonset.yaml", "          livenessProbe:", "          livenessProbX:"),
    ("k8s", "k8s/agent-daemonset.yaml", "DAC_OVERRIDE, SYS_ADMIN]",
     "DAC_OVERRIDE, SYS_ADMIN, SYS_PTRACE]"),
    ("k8s", "k8s/pvc.yaml", "storage: 10Gi", "storagee: 10Gi"),
    ("k8s", "k8s/configmap.yaml", "log-format: json", "log-format: xml"),
    ("k8s", "k8s/coordinator-deployment.yaml", "type: Recreate", "type: RollingUpdate"),
    ("compose", "compose/compose.yaml", "dockerfile: deploy/docker/agent.Dockerfile",
     "dockerfile: deploy/docker/agnt.Dockerfile"),
    ("compose", "compose/compose.yaml", "      - --port=7450", "      - --insecure"),
    ("compose", "compose/compose.yaml", "file: ./certs/probe.token", "file: ./certs/prob.token"),
    ("k8s", "k8s/ha/coordinator-patch.yaml", "{op: replace, path: /spec/replicas, value: 2}",
     "{op: replace, path: /spec/replicas, value: 1}"),
    ("k8s", "k8s/ha/coordinator-patch.yaml",
     "{op: test, path: /spec/template/spec/volumes/0/name, value: state}",
     "{op: test, path: /spec/template/spec/volumes/0/name, value: config}"),
    ("k8s", "k8s/ha/coordinator-patch.yaml", "    httpGet: {path: /metrics, port: metrics}",
     "    exec: {command: [meshctl, health]}"),
    ("k8s", "k8s/ha/coordinator-patch.yaml", "secretName: mesh-etcd-client,",
     "secretName: mesh-etcd-clients,"),
    ("k8s", "k8s/ha/coordinator-patch.yaml", "maxUnavailable: \"100%\"", "maxUnavailable: 1"),
    ("compose", "compose/compose.ha.yaml", "  restart: on-failure", "  restart: \"no\""),
    ("compose", "compose/compose.ha.yaml",
     "MESH_COORDINATOR: coordinator-1:7450,coordinator-2:7450",
     "MESH_COORDINATOR: coordinator-1:7450"),
    ("compose", "compose/compose.ha.yaml", "file: ./certs/etcd-client.key",
     "file: ./certs/etcd-clint.key"),
    ("docker", "docker/coordinator.Dockerfile", "USER 10001:10001", "USER root"),
    ("docker", "compose/etcd.Dockerfile", "USER etcd", "USER root"),
    ("docker", "docker/agent.Dockerfile", "HEALTHCHECK", "# HEALTHCHECK"),
    ("systemd", "systemd/mesh-agent.service", "Restart=on-failure", "Restart=sometimes"),
    ("systemd", "systemd/mesh-coordinator.service", "NoNewPrivileges=yes",
     "NoNewPrivileges=yes\nPrivateNetwork=maybe"),
]


def selftest(root):
    failures = []
    have_analyze = shutil.which("systemd-analyze") is not None
    for check, path, old, new in BREAKAGES:
        if check == "systemd" and not have_analyze:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(os.path.join(root, "deploy"), os.path.join(tmp, "deploy"),
                            ignore=shutil.ignore_patterns("certs"))
            target = os.path.join(tmp, "deploy", path)
            text = open(target, encoding="utf-8").read()
            if old not in text:
                failures.append(f"selftest: '{old}' not found in deploy/{path}")
                continue
            with open(target, "w", encoding="utf-8") as f:
                f.write(text.replace(old, new, 1))
            problems = Problems()
            try:
                CHECKS[check](tmp, problems)
            except Exception as e:  # A crash on a broken file also counts as caught.
                problems.add(path, f"check raised {e!r}")
            if not problems.items:
                failures.append(f"selftest: {check} did not notice '{old}' -> '{new}' in "
                                f"deploy/{path}")
            else:
                print(f"check_deploy.py: selftest ok: {check} caught deploy/{path}: "
                      f"{problems.items[0]}")
    for f in failures:
        print(f, file=sys.stderr)
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), help="repository root")
    parser.add_argument("check", choices=sorted(CHECKS) + ["selftest", "all"])
    args = parser.parse_args()
    if args.check == "selftest":
        return selftest(args.root)
    problems = Problems()
    skipped = False
    for name in (sorted(CHECKS) if args.check == "all" else [args.check]):
        if CHECKS[name](args.root, problems) == SKIP:
            skipped = True
    for p in problems.items:
        print(f"check_deploy.py: {p}", file=sys.stderr)
    if problems.items:
        return 1
    if skipped and args.check != "all":
        return SKIP
    print(f"check_deploy.py: {args.check}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
