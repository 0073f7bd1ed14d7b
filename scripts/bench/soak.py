#!/usr/bin/env python3
"""Soak: CYCLES ADD/DEL cycles of a CNI plugin by CLIENTS concurrent clients, each cycle a new
container ID in the client's own pod namespace (as kubelet does for a new pod), every call a real
plugin process. Run inside the node namespace (scripts/soak.sh sets everything up).

Samples, every SAMPLE cycles: the node's open file handles (/proc/sys/fs/file-nr), MemAvailable
and Slab (/proc/meminfo), cached dentries, links in the node namespace, files below the state
directories. (A plugin's own peak RSS is measured by scripts/bench.sh: the rusage of a child
forked from this Python process carries Python's RSS from before the exec.)
Prints one JSON object: ADD and DEL p50/p99 of the first and of the last 1,000 cycles, the
samples, failures, and what was left at the end (links, files, processes).

  soak.py --plugin BIN --conf FILE --pods NS1,NS2,... --cycles 10000 --state DIR[,DIR...]
"""
import argparse, json, os, statistics, subprocess, sys, threading, time

p = argparse.ArgumentParser()
p.add_argument("--plugin", required=True)
p.add_argument("--conf", required=True)
p.add_argument("--pods", required=True, help="pod namespace names (in /run/netns), one client each")
p.add_argument("--cycles", type=int, default=10000)
p.add_argument("--state", default="", help="directories whose file count must be back where it started")
p.add_argument("--sample", type=int, default=500)
a = p.parse_args()
conf = open(a.conf, "rb").read()
pods = a.pods.split(",")
path = os.path.dirname(os.path.abspath(a.plugin)) + ":/usr/lib/cni"
prefix = f"soak{os.getpid()}-"

lock = threading.Lock()
done = []        # (cycle index in completion order, add seconds, del seconds)
failures = []
samples = []
next_cycle = [0]


def call(verb, cid, netns):
    env = {"CNI_COMMAND": verb, "CNI_CONTAINERID": cid, "CNI_NETNS": f"/run/netns/{netns}",
           "CNI_IFNAME": "net1", "CNI_PATH": path, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
           "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={cid}"}
    if "PLEXUS_POLICY" in os.environ:
        env["PLEXUS_POLICY"] = os.environ["PLEXUS_POLICY"]
    t = time.perf_counter()
    r = subprocess.run([a.plugin], input=conf, env=env, capture_output=True)
    return time.perf_counter() - t, r.returncode, r.stdout


def files_below(dirs):
    n = 0
    for d in dirs:
        for _, _, fs in os.walk(d):
            n += len(fs)
    return n


def links():
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return len(out.splitlines())


def dentries():
    """Dentries the kernel caches (unique file names come and go every cycle: negative dentries)."""
    for l in open("/proc/slabinfo"):
        if l.startswith("dentry "):
            return int(l.split()[1])
    return None


def sample(cycle):
    meminfo = dict(l.split(":", 1) for l in open("/proc/meminfo"))
    kib = lambda k: int(meminfo[k].split()[0])
    samples.append({"cycle": cycle, "open_files": int(open("/proc/sys/fs/file-nr").read().split()[0]),
                    "mem_available_kib": kib("MemAvailable"), "slab_kib": kib("Slab"),
                    "dentries": dentries(),
                    "node_links": links(), "state_files": files_below(state_dirs)})


def client(netns):
    while True:
        with lock:
            if next_cycle[0] >= a.cycles:
                return
            i = next_cycle[0]
            next_cycle[0] += 1
        cid = f"{prefix}{i}"
        add_s, rc, out = call("ADD", cid, netns)
        if rc != 0:
            failures.append({"cycle": i, "verb": "ADD", "out": out.decode()[:300]})
        del_s, rc, out = call("DEL", cid, netns)
        if rc != 0:
            failures.append({"cycle": i, "verb": "DEL", "out": out.decode()[:300]})
        with lock:
            done.append((len(done), add_s, del_s))
            if len(done) % a.sample == 0:
                sample(len(done))


def pct(xs, q):
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] * 1000, 2)


def window(rows):
    adds = [r[1] for r in rows]
    dels = [r[2] for r in rows]
    return {"add_p50_ms": pct(adds, 0.5), "add_p99_ms": pct(adds, 0.99),
            "del_p50_ms": pct(dels, 0.5), "del_p99_ms": pct(dels, 0.99)}


state_dirs = [d for d in a.state.split(",") if d]
sample(0)
t0 = time.perf_counter()
threads = [threading.Thread(target=client, args=(ns,)) for ns in pods]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.perf_counter() - t0
sample(len(done))

left_pod_links = {}
for ns in pods:
    out = subprocess.run(["ip", "-n", ns, "-o", "link", "show"], capture_output=True, text=True).stdout
    extra = [l.split(":")[1].strip() for l in out.splitlines() if l.split(":")[1].strip() != "lo"]
    if extra:
        left_pod_links[ns] = extra
left_procs = 0
for pid in os.listdir("/proc"):
    try:
        if f"CNI_CONTAINERID={prefix}".encode() in open(f"/proc/{pid}/environ", "rb").read():
            left_procs += 1
    except OSError:
        pass
k = min(1000, len(done))
res = {"cycles": len(done), "clients": len(pods), "seconds": round(wall, 1),
       "cycles_per_s": round(len(done) / wall, 1),
       "first_1000": window(done[:k]), "last_1000": window(done[-k:]),
       "failures": len(failures), "first_failures": failures[:3],
       "left": {"node_links": samples[-1]["node_links"] - samples[0]["node_links"],
                "pod_links": left_pod_links,
                "state_files": samples[-1]["state_files"] - samples[0]["state_files"],
                "processes": left_procs},
       "samples": samples}
json.dump(res, sys.stdout, indent=1)
print()
