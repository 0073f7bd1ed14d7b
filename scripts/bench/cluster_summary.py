#!/usr/bin/env python3
"""Summarises scripts/bench/cluster.sh's raw files (OUT/cluster-<stack>-<n>-*) into one JSON."""
import collections, datetime, json, os, statistics, sys

from benchtool import cni_add_ms as cni_add_ms_of, instant

out, pods, nets = sys.argv[1], int(sys.argv[2]), [int(n) for n in sys.argv[3].split()]


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def spread(values, unit):
    return {"median": statistics.median(values), "p90": pct(values, 0.9), "max": max(values), "n": len(values), "unit": unit}


def cni_add_ms(path):
    with open(path) as f:
        return cni_add_ms_of(f)


def ready_s(path):
    took = []
    for pod in json.load(open(path))["items"]:
        created = instant(pod["metadata"]["creationTimestamp"])
        ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
        took.append((instant(ready["lastTransitionTime"]) - created).total_seconds())
    return took


def requests(path, run_pods):
    """Requests per pod of the run. Requests on other pods are left out: the kubelet's GC removes
    the sandboxes of an earlier run's deleted pods meanwhile, and the DEL it calls (under whichever
    stack's config is current) may read those pods."""
    by_user = collections.Counter()
    by_verb = collections.Counter()
    for line in open(path):
        e = json.loads(line)
        ref = e.get("objectRef", {})
        if ref.get("resource") == "pods" and not ref.get("name", "").startswith(run_pods):
            continue
        user = e["user"]["username"].rsplit(":", 1)[-1]
        by_user[user] += 1
        by_verb[f'{user} {e["verb"]} {ref.get("resource", "")}{"/" + ref["subresource"] if ref.get("subresource") else ""}'] += 1
    return {"per_pod": {u: c / pods for u, c in by_user.items()}, "total_per_pod": sum(by_user.values()) / pods,
            "by_verb": dict(sorted(by_verb.items()))}


runs = []
for n in nets:
    for stack in ("multus", "plexus"):
        base = os.path.join(out, f"cluster-{stack}-{n}")
        run = json.load(open(base + ".json"))
        run["cni_add"] = spread(cni_add_ms(base + "-cni.log"), "ms")
        run["ready"] = spread(ready_s(base + "-pods.json"), "s")
        run["api_add"] = requests(base + "-audit-add.log", f"b-{stack}-{n}-")
        run["api_del"] = requests(base + "-audit-del.log", f"b-{stack}-{n}-")
        runs.append(run)
print(json.dumps({"date": datetime.date.today().isoformat(), "pods": pods, "runs": runs}, indent=1))
