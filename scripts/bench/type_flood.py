#!/usr/bin/env python3
"""Send COUNT requests through the plexus shim to plexus-daemon, each a meta config whose one
network is a delegate of a type nobody installed, every type and network name distinct (what a
tenant who may write NADs can make a daemon see). Every request fails (no such plugin); what is
measured is what the daemon keeps of them. Prints one JSON object: how many were sent, how many
failed as expected, and the wall time.

  type_flood.py --shim BIN/plexus --socket SOCK --netns PATH --work DIR --count 10000 [--clients 8]
"""
import argparse, json, os, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor

p = argparse.ArgumentParser()
p.add_argument("--shim", required=True)
p.add_argument("--socket", required=True)
p.add_argument("--netns", required=True)
p.add_argument("--work", required=True)
p.add_argument("--count", type=int, default=10000)
p.add_argument("--clients", type=int, default=8)
a = p.parse_args()
bin_dir = os.path.dirname(os.path.abspath(a.shim))

def call(i):
    conf = {"cniVersion": "1.0.0", "name": "plexus", "type": "plexus", "daemonSocket": a.socket,
            "cniDir": os.path.join(a.work, "cache"), "binDir": bin_dir,
            "delegates": [{"cniVersion": "1.0.0", "name": f"tenant-net-{i}", "type": f"no-such-plugin-{i}"}]}
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": f"flood{i}", "CNI_NETNS": a.netns, "CNI_IFNAME": "eth0",
           "CNI_PATH": bin_dir, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    r = subprocess.run([a.shim], input=json.dumps(conf).encode(), env=env, capture_output=True)
    try:
        return json.loads(r.stdout).get("code")
    except ValueError:
        return None

t = time.perf_counter()
with ThreadPoolExecutor(a.clients) as ex:
    codes = list(ex.map(call, range(a.count)))
wall = time.perf_counter() - t
not_found = sum(1 for c in codes if c == 100)
if not_found != a.count:
    sys.exit(f"type_flood.py: {a.count - not_found} requests did not fail with code 100: {set(codes)}")
print(json.dumps({"requests": a.count, "not_found": not_found, "seconds": round(wall, 1)}))
