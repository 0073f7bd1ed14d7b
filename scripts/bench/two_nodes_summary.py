#!/usr/bin/env python3
"""scripts/bench/two-nodes.sh's results, merged.

  two_nodes_summary.py ipam N1_ADD N1_DEL N2_ADD N2_DEL   one allocator's two nodes as one run
  two_nodes_summary.py all OUT ROUNDS               every part: transfers and the three allocators

A run of both nodes: throughput is every ADD (DEL) of both nodes over the span from the first
node's start to the last node's end; p50 and p99 are over every operation of both nodes.
"""
import json
import statistics
import sys

from benchtool import pct


def ipam(paths):
    """Each node's ADD phase and DEL phase (cni_load.py --phase add|del --latencies), in any order."""
    runs = [json.load(open(p)) for p in paths]
    adds = [r for r in runs if "add" in r]
    res = {"count": sum(r["count"] for r in adds), "clients": sum(r["clients"] for r in adds)}
    for verb in ("add", "del"):
        phase = [r[verb] for r in runs if verb in r]
        ms = [x for p in phase for x in p["ms"]]
        span = max(p["end"] for p in phase) - min(p["start"] for p in phase)
        res[verb] = {"ops_per_s": round(len(ms) / span, 1), "p50_ms": round(statistics.median(ms), 1),
                     "p99_ms": round(pct(ms, 0.99), 1)}
    addrs = [a for r in adds for a in r["addresses"]]
    res["distinct"] = len(set(addrs))
    res["failed_attempts"] = sum(r["failed_attempts"] for r in adds)
    return res


def all_parts(out, rounds):
    res = {"transfer_gbit_s": {}}
    for name in ("floor", "macvlan", "host-device"):
        g = [json.load(open(f"{out}/transfer-{name}-{i}.json"))["end"]["sum_received"]["bits_per_second"] / 1e9
             for i in range(1, rounds + 1)]
        res["transfer_gbit_s"][name] = {"median": round(statistics.median(g), 2), "runs": [round(x, 2) for x in g]}
    floor = res["transfer_gbit_s"]["floor"]["median"]
    for name in ("macvlan", "host-device"):
        res["transfer_gbit_s"][name]["of_floor"] = round(res["transfer_gbit_s"][name]["median"] / floor, 2)
    res["ipam"] = {who: ipam([f"{out}/ipam-{who}-{n}-{verb}.json" for n in (1, 2) for verb in ("add", "del")])
                   for who in ("wb", "px-k8s", "px-etcd")}
    wb = res["ipam"]["wb"]
    for who in ("px-k8s", "px-etcd"):
        r = res["ipam"][who]
        r["add_vs_whereabouts"] = round(r["add"]["ops_per_s"] / wb["add"]["ops_per_s"], 2)
        r["del_vs_whereabouts"] = round(r["del"]["ops_per_s"] / wb["del"]["ops_per_s"], 2)
    return res


def main(argv):
    if argv[1] == "ipam":
        print(json.dumps(ipam(argv[2:])))
    elif argv[1] == "all":
        print(json.dumps(all_parts(argv[2], int(argv[3])), indent=1))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
