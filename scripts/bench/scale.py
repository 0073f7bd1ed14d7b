#!/usr/bin/env python3
"""The pods of the scale benchmark (scripts/bench/scale.sh), driven over the Kubernetes API with
the admin's token: the 8 NADs of one stack, then P pods per hollow node created at once (16
clients), each pod's Ready seen on a watch (its time in ms from the moment its create was sent),
then all of them deleted at once and each one's disappearance seen on the watch. Writes a JSON
report; nothing here is a verdict.

  scale.py burst  API TOKEN_FILE CA NODES PODS_PER_NODE NADS_JSON OUT_JSON
  scale.py nads   STACK RANGES_BASE [WB_CONF] the 8 NADs of a stack (plexus, multus, nodeslice), as a
                                             JSON list (stdout); WB_CONF: whereabouts' flat config file
  scale.py slices API TOKEN_FILE CA NADS_JSON NODES  the NADs made, then waits until whereabouts'
                                             controller gave each of NODES nodes a slice of each
  scale.py churn  API TOKEN_FILE CA NODES PODS_PER_NODE NADS_JSON SECONDS RATE OUT_JSON
                                             a steady churn (churn()), RATE pods replaced a second
  scale.py plot   SCALE_JSON OUT_SVG         p99 CNI ADD and API requests per pod against N
  scale.py many-nads API TOKEN_FILE CA COUNT COUNT NADs no pod uses, in namespace scale-nads

A pod keeps the default grace period: deleted, it goes once its node released it (the hollow
nodes' kubelet stand-in ran its DEL), as on a real node.
"""
import collections
import json
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

NAMESPACE = "scale"
RAILS = 8


def now_ms():
    return time.time() * 1000.0


class Api:
    def __init__(self, base, token, ca):
        self.base, self.token = base.rstrip("/"), token
        self.ctx = ssl.create_default_context(cafile=ca)

    def call(self, method, path, body=None, content_type="application/json", timeout=60):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def stream(self, path):
        """The lines of a watch."""
        req = urllib.request.Request(self.base + path)
        req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, context=self.ctx, timeout=3600) as r:
            for line in r:
                yield json.loads(line)


def nads(stack, base, whereabouts_conf=None):
    """The 8 RoCE networks of a stack: a macvlan on each rail's port, addresses from one /21 per
    rail starting at 198.18.BASE.0, in the stack's IPAM on the Kubernetes API (plexus: plexus-ipam's
    Kubernetes store; multus: whereabouts, its kubeconfig in the flat config file named; nodeslice:
    the same in whereabouts' node-slice mode, a /28 of the rail's range per node)."""
    # whereabouts' node-slice controller makes each NAD the owner of its NodeSlicePool, which lives
    # in whereabouts' namespace (kube-system): an owner in another namespace is no owner to the
    # garbage collector, which deletes the pool at once. Its NADs are in kube-system too.
    nad_namespace = "kube-system" if stack == "nodeslice" else NAMESPACE
    out = []
    for i in range(RAILS):
        subnet = f"198.18.{base + 8 * i}.0/21"
        if stack == "plexus":
            conf = {"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": f"ens{i + 1}f0np0", "mode": "bridge",
                    "ipam": {"type": "plexus-ipam", "range": subnet, "store": "kubernetes"}}
        elif stack == "blocks":
            conf = {"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": f"ens{i + 1}f0np0", "mode": "bridge",
                    "ipam": {"type": "plexus-ipam", "poolName": f"rail{i + 1}"}}
        else:
            conf = {"cniVersion": "1.0.0", "type": "macvlan", "master": f"ens{i + 1}f0np0", "mode": "bridge",
                    "ipam": {"type": "whereabouts", "range": subnet}}
            if whereabouts_conf:
                conf["ipam"]["configuration_path"] = whereabouts_conf
            if stack == "nodeslice":
                # Each network's NodeSlicePool is named after its network_name, which node slices
                # require (unnamed, every NAD is taken for one network: "IPAM conf mismatch").
                conf["name"] = f"rail{i + 1}"
                conf["ipam"]["network_name"] = f"rail{i + 1}"
                conf["ipam"]["node_slice_size"] = "/28"
        out.append({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                    "metadata": {"name": f"rail{i + 1}", "namespace": nad_namespace},
                    "spec": {"config": json.dumps(conf)}})
    return out


def ippools(base, block_size):
    """The blocks stack's pools: nv-ipam IPPools in kube-system, one /21 per rail as the NADs of
    the other stacks have, blocks of BLOCK_SIZE addresses per node."""
    return {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "nv-ipam.nvidia.com/v1alpha1", "kind": "IPPool",
         "metadata": {"name": f"rail{i + 1}", "namespace": "kube-system"},
         "spec": {"subnet": f"198.18.{base + 8 * i}.0/21", "perNodeBlockSize": block_size}}
        for i in range(RAILS)]}


def pod(name, node, nad_list):
    networks = ",".join(f"{n['metadata']['namespace']}/{n['metadata']['name']}" for n in nad_list)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE,
                         "annotations": {"k8s.v1.cni.cncf.io/networks": networks}},
            "spec": {"nodeName": node, "tolerations": [{"key": "plexus.dev/hollow", "operator": "Exists"}],
                     "containers": [{"name": "c", "image": "localhost/plexus-busybox:test"}]}}


def ready(p):
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or [])


class Watch:
    """Every pod of the namespace as the watch reports it: when each was first seen Ready, when
    each was deleted."""

    def __init__(self, api):
        self.api, self.ready, self.gone, self.lock = api, {}, {}, threading.Lock()
        status, lst = api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1")
        self.rv = lst["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while True:
            try:
                for ev in self.api.stream(f"/api/v1/namespaces/{NAMESPACE}/pods?watch=1&allowWatchBookmarks=true"
                                          f"&resourceVersion={self.rv}&timeoutSeconds=3000"):
                    obj, t = ev["object"], now_ms()
                    self.rv = obj["metadata"].get("resourceVersion", self.rv)
                    name = obj["metadata"].get("name")
                    with self.lock:
                        if ev["type"] in ("ADDED", "MODIFIED") and ready(obj) and name not in self.ready:
                            self.ready[name] = t
                        if ev["type"] == "DELETED":
                            self.gone[name] = t
            except Exception as e:  # a watch that ended (timeout, EOF) is opened again
                print(f"scale.py: watch: {e}", file=sys.stderr)
                time.sleep(0.2)

    def wait(self, what, names, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.lock:
                missing = [n for n in names if n not in what]
            if not missing:
                return []
            time.sleep(0.2)
        return missing


def ensure_namespace(api, nad_list):
    api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for n in nad_list:
        ns = n["metadata"]["namespace"]
        s, b = api.call("POST", f"/apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions", n)
        if s not in (201, 409):
            raise SystemExit(f"scale.py: NAD {n['metadata']['name']}: {s} {b}")


def pct(values, q):
    values = sorted(values)
    if not values:
        return None
    return round(values[min(len(values) - 1, max(0, -(-int(q * 1000) * len(values) // 1000) - 1))], 1)


def spread(values):
    return {"n": len(values), "p50": pct(values, 0.5), "p99": pct(values, 0.99), "max": pct(values, 1.0)}


def burst(api, nodes, per_node, nad_list, timeout=None):
    # How long the pods are waited for to be Ready, then to be gone (BURST_TIMEOUT seconds, 900):
    # a stack that does not make it is a result, reported with what it left not Ready.
    timeout = timeout or int(os.environ.get("BURST_TIMEOUT", "900"))
    ensure_namespace(api, nad_list)
    watch = Watch(api)
    names = [(f"p{k}-{j}", f"plexus-hollow-{k}") for k in range(1, nodes + 1) for j in range(per_node)]
    sent, errors = {}, []

    def create(item):
        name, node = item
        sent[name] = now_ms()
        s, b = api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod(name, node, nad_list))
        if s != 201:
            errors.append(f"create {name}: {s} {b and b.get('message')}")

    t0 = now_ms()
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(create, names))
    created_s = (now_ms() - t0) / 1000
    missing = watch.wait(watch.ready, [n for n, _ in names], timeout)
    all_ready_s = (now_ms() - t0) / 1000
    ready_ms = [watch.ready[n] - sent[n] for n, _ in names if n in watch.ready]
    statuses = {}
    s, lst = api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
    for p in lst["items"]:
        statuses[p["metadata"]["name"]] = (p["metadata"].get("annotations") or {}).get("k8s.v1.cni.cncf.io/network-status")

    deleted = {}

    def delete(item):
        name, _ = item
        deleted[name] = now_ms()
        s, b = api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        if s not in (200, 202, 404):
            errors.append(f"delete {name}: {s}")

    t1 = now_ms()
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(delete, names))
    not_gone = watch.wait(watch.gone, [n for n, _ in names], timeout)
    gone_ms = [watch.gone[n] - deleted[n] for n, _ in names if n in watch.gone]
    return {
        "pods": len(names), "errors": errors[:20], "error_count": len(errors),
        "created_s": round(created_s, 2), "all_ready_s": round(all_ready_s, 2),
        "not_ready": missing[:20], "not_ready_count": len(missing),
        "ready_ms": spread(ready_ms), "gone_ms": spread(gone_ms),
        "not_gone_count": len(not_gone), "all_gone_s": round((now_ms() - t1) / 1000, 2),
        "duplicates": duplicates(statuses),
    }


def live_statuses(api):
    """The network-status of each pod not being deleted (a deleted pod's addresses may be taken
    again once its DEL ran, before its object goes)."""
    s, lst = api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
    return {p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get("k8s.v1.cni.cncf.io/network-status")
            for p in lst["items"] if not p["metadata"].get("deletionTimestamp")}


def churn(api, nodes, per_node, nad_list, seconds, rate, timeout=None):
    """A steady churn: PER_NODE/2 pods on each node (at once, waited Ready), then for SECONDS,
    RATE times a second, the oldest pod deleted and a new one created on its node (16 clients);
    each new pod's time from its create to Ready. Every 5 s the live pods' addresses are compared
    (duplicates); at the end every pod is deleted and waited gone."""
    timeout = timeout or int(os.environ.get("BURST_TIMEOUT", "900"))
    ensure_namespace(api, nad_list)
    watch = Watch(api)
    lock, sent, errors, seq = threading.Lock(), {}, [], [0]
    alive = collections.deque()

    def create(node):
        with lock:
            seq[0] += 1
            name = f"c{node.rsplit('-', 1)[1]}-{seq[0]}"
            sent[name] = now_ms()
            alive.append((name, node))
        s, b = api.call("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod(name, node, nad_list))
        if s != 201:
            errors.append(f"create {name}: {s} {b and b.get('message')}")
        return name

    def delete(name):
        s, _ = api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        if s not in (200, 202, 404):
            errors.append(f"delete {name}: {s}")

    deleted = set()

    def replace():
        with lock:
            name, node = alive.popleft()
            deleted.add(name)
        delete(name)
        return create(node)

    first = [f"plexus-hollow-{k}" for k in range(1, nodes + 1) for _ in range(max(1, per_node // 2))]
    with ThreadPoolExecutor(16) as ex:
        base = list(ex.map(create, first))
    missing = watch.wait(watch.ready, base, timeout)
    if missing:
        # The stack did not bring up the pods the churn keeps: there is no steady state to churn.
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(delete, base))
        not_gone = watch.wait(watch.gone, base, timeout)
        return {"pods_kept": len(first), "first_not_ready": len(missing), "not_gone_count": len(not_gone),
                "skipped": "the pods it keeps were not all Ready", "started_ms": round(now_ms()),
                "errors": errors[:20], "error_count": len(errors)}
    dups, checks, churned = {}, 0, []
    t0 = time.time()
    started_ms = now_ms()
    with ThreadPoolExecutor(16) as ex:
        futures, k, last_check = [], 0, t0
        while time.time() < t0 + seconds:
            futures.append(ex.submit(replace))
            k += 1
            if time.time() - last_check >= 5:
                dups.update({ip: h for ip, h in holders(live_statuses(api)).items() if len(h) > 1})
                checks += 1
                last_check = time.time()
            time.sleep(max(0.0, t0 + k / rate - time.time()))
        churned = [f.result() for f in futures]
    # A pod replaced before it was Ready (the churn outran the stack) is never waited for.
    not_ready = watch.wait(watch.ready, [n for n in churned if n not in deleted], timeout)
    dups.update({ip: h for ip, h in holders(live_statuses(api)).items() if len(h) > 1})
    ready_ms = [watch.ready[n] - sent[n] for n in churned if n in watch.ready]
    with lock:
        rest = [n for n, _ in alive]
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(delete, rest))
    not_gone = watch.wait(watch.gone, rest + [n for n in base + churned], timeout)
    return {
        "pods_kept": len(first), "seconds": seconds, "rate_per_s": rate, "replaced": len(churned),
        "started_ms": round(started_ms),
        "first_not_ready": len(missing), "errors": errors[:20], "error_count": len(errors),
        "ready_ms": spread(ready_ms), "not_ready_count": len(not_ready), "not_gone_count": len(not_gone),
        "replaced_before_ready": sum(1 for n in deleted if n not in watch.ready),
        "duplicate_checks": checks + 1, "duplicates": len(dups), "duplicate_examples": dict(list(dups.items())[:5]),
    }


def holders(statuses):
    """Each address of the pods' secondary interfaces (from network-status): the pods holding it."""
    held = {}
    for pod_name, status in statuses.items():
        for net in json.loads(status or "[]"):
            if net.get("default"):
                continue
            for ip in net.get("ips") or []:
                held.setdefault(ip, []).append(pod_name)
    return held


def duplicates(statuses):
    """Addresses given to more than one pod's secondary interfaces."""
    held = holders(statuses)
    dups = {ip: h for ip, h in held.items() if len(h) > 1}
    return {"addresses": len(held), "duplicates": len(dups), "examples": dict(list(dups.items())[:5])}


COLOURS = {"plexus": "#1f77b4", "multus+whereabouts": "#d62728", "multus+whereabouts node slices": "#2ca02c"}


def plot(results):
    """An SVG of two panels against the number of nodes, a line per stack: p99 CNI ADD (s) and
    API requests per pod. A point whose ADDs failed is drawn hollow and its failures named; one
    where none succeeded (no p99) is drawn hollow at the top of its panel."""
    width, height, pad = 360, 260, 48
    stacks = {}
    for r in results:
        stacks.setdefault(r.get("stack", "plexus"), []).append(r)
    nodes = sorted({r["nodes"] for r in results})
    panels = [("p99 CNI ADD (s)", lambda r: None if r["cni_add_ms"].get("p99") is None else r["cni_add_ms"]["p99"] / 1000),
              ("API requests per pod", lambda r: r["api_requests_per_pod"])]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * width}" height="{height + 30}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{2 * width}" height="{height + 30}" fill="white"/>']
    for i, (title, value) in enumerate(panels):
        x0 = i * width
        top = max([value(r) for r in results if value(r) is not None] + [1e-9]) * 1.15

        def px(n):
            return x0 + pad + (nodes.index(n) if len(nodes) > 1 else 0.5) * (width - 2 * pad) / max(1, len(nodes) - 1)

        def py(v):
            return height - pad + 10 - (top if v is None else v) / top * (height - 2 * pad)
        out.append(f'<text x="{x0 + width / 2}" y="16" text-anchor="middle" font-weight="bold">{title}</text>')
        out.append(f'<line x1="{x0 + pad}" y1="{py(0)}" x2="{x0 + width - pad}" y2="{py(0)}" stroke="black"/>')
        out.append(f'<line x1="{x0 + pad}" y1="{py(0)}" x2="{x0 + pad}" y2="{py(top)}" stroke="black"/>')
        for n in nodes:
            out.append(f'<text x="{px(n)}" y="{py(0) + 14}" text-anchor="middle">{n}</text>')
        out.append(f'<text x="{x0 + width / 2}" y="{py(0) + 28}" text-anchor="middle">hollow nodes (8 rails each)</text>')
        for k in range(5):
            v = top / 1.15 * k / 4
            out.append(f'<text x="{x0 + pad - 4}" y="{py(v) + 4}" text-anchor="end">{v:.3g}</text>')
        for j, (stack, rs) in enumerate(sorted(stacks.items())):
            colour = COLOURS.get(stack, "#555")
            # A figure not measured (None) on the requests panel is left out; on the ADD panel
            # None means no ADD succeeded, drawn at the top.
            rs = sorted((r for r in rs if i == 0 or value(r) is not None), key=lambda r: r["nodes"])
            points = " ".join(f"{px(r['nodes']):.1f},{py(value(r)):.1f}" for r in rs)
            out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
            for r in rs:
                failed = r["cni_add_ms"].get("failed", 0)
                fill = "white" if failed or value(r) is None else colour
                x, y = px(r["nodes"]), py(value(r))
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{fill}" stroke="{colour}"/>')
                if i == 0 and (failed or value(r) is None):
                    what = "no ADD succeeded" if value(r) is None else f"{failed} ADDs failed"
                    out.append(f'<text x="{x - 6:.1f}" y="{y + 16:.1f}" text-anchor="end" fill="{colour}">{what}</text>')
            out.append(f'<text x="{x0 + pad + 8}" y="{py(top) + 14 * (j + 1)}" fill="{colour}">{stack}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def slices(api, nad_list, nodes, timeout=120):
    """The NADs made, then each one's NodeSlicePool waited for until every one of the NODES hollow
    nodes has its slice (whereabouts' controller assigns them as it sees nodes and NADs); the
    seconds it took. A pod's ADD on a node without its slice fails: the burst starts after."""
    ensure_namespace(api, nad_list)
    t0, want = time.time(), {f"plexus-hollow-{k}" for k in range(1, nodes + 1)}
    names = {json.loads(n["spec"]["config"])["ipam"]["network_name"] for n in nad_list}
    while time.time() < t0 + timeout:
        s, lst = api.call("GET", "/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/kube-system/nodeslicepools")
        given = {p["metadata"]["name"]: {a.get("nodeName") for a in (p.get("status") or {}).get("allocations") or []}
                 for p in (lst or {}).get("items", [])}
        if all(want <= given.get(n, set()) for n in names):
            return round(time.time() - t0, 1)
        time.sleep(0.5)
    raise SystemExit(f"scale.py: not every node has its slices after {timeout} s")


def many_nads(api, count):
    """COUNT NADs in namespace scale-nads (16 clients), as a cluster of many tenants has: every
    node's daemon watches them all. The number created."""
    ns = "scale-nads"
    api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    config = nads("plexus", 0)[0]["spec"]["config"]

    def create(i):
        nad = {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
               "metadata": {"name": f"tenant-{i}", "namespace": ns}, "spec": {"config": config}}
        s, _ = api.call("POST", f"/apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions", nad)
        return s in (201, 409)

    with ThreadPoolExecutor(16) as ex:
        return sum(ex.map(create, range(count)))


def main(argv):
    if argv[1] == "nads":
        json.dump(nads(argv[2], int(argv[3]), argv[4] if len(argv) > 4 else None), sys.stdout)
        return
    if argv[1] == "ippools":
        json.dump(ippools(int(argv[2]), int(argv[3])), sys.stdout)
        return
    if argv[1] == "plot":
        with open(argv[3], "w") as f:
            f.write(plot(json.load(open(argv[2]))))
        return
    api = Api(argv[2], open(argv[3]).read().strip(), argv[4])
    if argv[1] == "churn":
        nodes, per_node, seconds, rate = int(argv[5]), int(argv[6]), int(argv[8]), float(argv[9])
        report = churn(api, nodes, per_node, json.load(open(argv[7])), seconds, rate)
        json.dump(report, open(argv[10], "w"), indent=1)
        print(json.dumps(report))
        return
    if argv[1] == "slices":
        print(slices(api, json.load(open(argv[5])), int(argv[6])))
        return
    if argv[1] == "many-nads":
        print(many_nads(api, int(argv[5])))
        return
    if argv[1] == "burst":
        nodes, per_node = int(argv[5]), int(argv[6])
        report = burst(api, nodes, per_node, json.load(open(argv[7])))
        json.dump(report, open(argv[8], "w"), indent=1)
        print(json.dumps(report))
    else:
        raise SystemExit(f"scale.py: no subcommand {argv[1]}")


if __name__ == "__main__":
    main(sys.argv)
