#!/usr/bin/env python3
"""Drive a CNI plugin with concurrent clients: N ADDs, then N DELs, each a real plugin process.

Prints one JSON object: wall time and throughput of each phase, per-operation median, and how
many distinct addresses the ADDs returned (a duplicate shows as distinct < N).

  cni_load.py --plugin BIN --conf FILE[,FILE...] --count 512 --clients 16 [--netns PATH] [--phase add|del|both] [--pods] [--latencies]
Several --conf files are used round-robin (e.g. one per simulated node).
"""
import argparse, json, os, statistics, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor

p = argparse.ArgumentParser()
p.add_argument("--plugin", required=True)
p.add_argument("--conf", required=True)
p.add_argument("--count", type=int, default=512)
p.add_argument("--clients", type=int, default=16)
p.add_argument("--netns", default="/var/run/netns/none")
p.add_argument("--prefix", default="load")
p.add_argument("--phase", default="both", choices=["add", "del", "both"])
p.add_argument("--pods", action="store_true", help="name a pod per ADD in CNI_ARGS (K8S_POD_NAMESPACE/NAME), as kubelet does")
p.add_argument("--retries", type=int, default=0, help="a failed ADD is DELeted and tried again (as kubelet does), at most this often")
p.add_argument("--latencies", action="store_true", help="also each phase's start and end (epoch s) and every operation's ms, to merge runs on several nodes")
a = p.parse_args()
confs = [open(f, "rb").read() for f in a.conf.split(",")]
path = os.path.dirname(os.path.abspath(a.plugin)) + ":/usr/lib/cni"

def call(verb, i):
    env = {"CNI_COMMAND": verb, "CNI_CONTAINERID": f"{a.prefix}{i}", "CNI_NETNS": a.netns,
           "CNI_IFNAME": "net1", "CNI_PATH": path, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    if a.pods:
        env["CNI_ARGS"] = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={a.prefix}{i}"
    if "PLEXUS_POLICY" in os.environ:  # the node policy the runtime's environment names
        env["PLEXUS_POLICY"] = os.environ["PLEXUS_POLICY"]
    t = time.perf_counter()
    for attempt in range(a.retries + 1):
        r = subprocess.run([a.plugin], input=confs[i % len(confs)], env=env, capture_output=True)
        if r.returncode == 0 or verb != "ADD" or attempt == a.retries:
            break
        failed.append(i)
        subprocess.run([a.plugin], input=confs[i % len(confs)], env={**env, "CNI_COMMAND": "DEL"}, capture_output=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"{verb} {i} failed: {r.stdout.decode()} {r.stderr.decode()}")
    addr = json.loads(r.stdout)["ips"][0]["address"] if verb == "ADD" else None
    return dt, addr

def phase(verb):
    t, start = time.perf_counter(), time.time()
    with ThreadPoolExecutor(a.clients) as ex:
        out = list(ex.map(lambda i: call(verb, i), range(a.count)))
    wall = time.perf_counter() - t
    lat = [d for d, _ in out]
    res = {"seconds": round(wall, 3), "ops_per_s": round(a.count / wall, 1),
           "median_ms": round(statistics.median(lat) * 1000, 2),
           "p99_ms": round(sorted(lat)[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))] * 1000, 2)}
    if a.latencies:
        res.update(start=start, end=start + wall, ms=[round(d * 1000, 2) for d in lat])
    return res, [x for _, x in out]

failed = []
res = {"count": a.count, "clients": a.clients}
if a.phase in ("add", "both"):
    res["add"], addrs = phase("ADD")
    res["distinct"] = len(set(addrs))
    if a.latencies:
        res["addresses"] = addrs
    res["failed_attempts"] = len(failed)
if a.phase in ("del", "both"):
    res["del"], _ = phase("DEL")
print(json.dumps(res))
