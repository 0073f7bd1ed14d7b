#!/usr/bin/env python3
"""Writes BENCHMARKS.md from the results scripts/bench.sh left in its work directory."""
import datetime, glob, json, os, platform, statistics, sys

work, runs = sys.argv[1], sys.argv[2]

def load(name):
    return json.load(open(os.path.join(work, name + ".json")))

def med(name):
    """Median (ms) of each command: from NAME.json, or pooled over the rounds NAME.r*.json."""
    rounds = sorted(glob.glob(os.path.join(work, name + ".r*.json")))
    if not rounds:
        return {r["command"]: r["median"] * 1000 for r in load(name)["results"]}
    times = {}
    for path in rounds:
        for r in json.load(open(path))["results"]:
            times.setdefault(r["command"], []).extend(r["times"])
    return {c: statistics.median(t) * 1000 for c, t in times.items()}

def table(rows):
    print("| what | plexus | against | theirs | ratio | target |")
    print("|---|---:|---|---:|---:|---|")
    for what, ours, against, theirs, unit, target in rows:
        print(f"| {what} | {ours:.2f} {unit} | {against} | {theirs:.2f} {unit} | {ours/theirs:.2f} | {target} |")
    print()

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print("# plexus benchmarks\n")
print(f"Written by `scripts/bench.sh` on {datetime.date.today()} — {os.cpu_count()} cores ({cpu}), kernel {platform.release()}.")
print(f"Medians of {runs} runs each unless said (`hyperfine -N`, stdin from `--input`); every plugin process runs")
print("inside a node network namespace; the reference plugins are Debian's containernetworking-plugins 1.1.1;")
print("plexus binaries are the shipped build (`scripts/build-release.sh`: release, statically linked).")
print("These machines are shared and noisy: read the ratios, not the absolute times.\n")

def has(name):
    """Whether this run measured the section whose results include NAME."""
    return os.path.exists(os.path.join(work, name + ".json")) or bool(glob.glob(os.path.join(work, name + ".r*.json")))

if has("macvlan-rss"):
    print("## plexus-macvlan (issue #3)\n")
    add, l2, dele, rss = med("macvlan-add-static"), med("macvlan-add-l2"), med("macvlan-del"), load("macvlan-rss")
    table([
        ("ADD, static IPAM", add["plexus-macvlan"], "reference macvlan", add["reference-macvlan"], "ms", "≤ 0.7"),
        ("ADD, L2 only", l2["plexus-macvlan"], "`ip -batch` floor, same netlink operations", l2["ip-batch-floor-same-ops"], "ms", "≤ 1.2"),
        ("ADD, L2 only", l2["plexus-macvlan"], "`ip -batch` floor, one request", l2["ip-batch-floor-one-request"], "ms", "—"),
        ("ADD, L2 only", l2["plexus-macvlan"], "reference macvlan", l2["reference-macvlan"], "ms", "—"),
        ("DEL, static IPAM", dele["plexus-macvlan"], "reference macvlan", dele["reference-macvlan"], "ms", "≤ 1.0"),
        ("peak RSS of one ADD", rss["ours"] / 1024, "reference macvlan", rss["reference"] / 1024, "MiB", "≤ 1.0"),
    ])
    print(f"Run in {len(glob.glob(os.path.join(work, 'macvlan-add-l2.r*.json')))} rounds with the commands' order rotated each round, times pooled: the machine's")
    print("speed drifts over minutes, and a command always measured first or last would carry that drift.")
    print("The floor the issue names does the plugin's netlink operations from one `ip -batch` process: it")
    print("creates the macvlan in the pod under a temporary name, then renames it and brings it up (from")
    print("inside the pod, naming the master by namespace and index). The rename is not free: the kernel")
    print("waits for an RCU grace period in it. The one-request floor creates the link named, sized and up")
    print("in a single request from the node namespace: less work than the issue asks the plugin to do. The")
    print("plugin also looks up the master and the new link and sets `arp_notify`. DEL is measured on a link")
    print("that has been up for 300 ms (the kernel's IPv6 start-up work settled), as in production; most of")
    print("a DEL is the kernel unregistering the link.\n")

if has("ipam-add") and has("ipam-curve-ours-90") and has("ipam-etcd"):  # sections ipam, fill and etcd
    print("## plexus-ipam (issue #4)\n")
    ours_add, hl_add = med("ipam-add")["plexus-ipam"], med("ipam-add-hl")["host-local"]
    co, ch = load("ipam-conc-ours"), load("ipam-conc-hl")
    def thru(r):
        return 2 * r["count"] / (r["add"]["seconds"] + r["del"]["seconds"])
    table([
        ("single ADD, /24", ours_add, "host-local", hl_add, "ms", "≤ 1.0"),
        ("512 ADD + 512 DEL, 16 clients: throughput", thru(co), "host-local", thru(ch), "ops/s", "≥ 2.0"),
        ("… ADD phase", co["count"] / co["add"]["seconds"], "host-local", ch["count"] / ch["add"]["seconds"], "ops/s", "—"),
        ("… DEL phase", co["count"] / co["del"]["seconds"], "host-local", ch["count"] / ch["del"]["seconds"], "ops/s", "—"),
    ])
    print(f"Distinct addresses from the 512 concurrent ADDs: plexus {co['distinct']}, host-local {ch['distinct']}.")
    print("The single ADD is timed with one resident attachment in each store, as on a node where other pods")
    print("hold addresses (plexus-ipam removes a store, or a domain, that holds nothing: the concurrent runs")
    print("start each phase from none).\n")
    print("Allocation time (median single ADD, 100 runs) as the pool fills — plexus-ipam on a /16 (65534")
    print("addresses), host-local on a /20 (4094: its ADD scans every allocation file, so a /16 is out of reach):\n")
    print("| fill | plexus-ipam, /16 (ms) | × its 10 % time | host-local, /20 (ms) | × its 10 % time |")
    print("|---:|---:|---:|---:|---:|")
    base_o, base_h = med("ipam-curve-ours-10")["ours"], med("ipam-curve-hl-10")["hl"]
    for pct in (10, 30, 50, 70, 90):
        o, h = med(f"ipam-curve-ours-{pct}")["ours"], med(f"ipam-curve-hl-{pct}")["hl"]
        print(f"| {pct} % | {o:.2f} | {o/base_o:.2f} | {h:.2f} | {h/base_h:.2f} |")
    print("\nTarget: plexus at 90 % ≤ 1.5 × its time at 10 %.\n")
    e = load("ipam-etcd")
    print("etcd store (a real etcd 3.4 on loopback in the node namespace), 1000 allocations from 16 concurrent")
    print("clients spread over 4 simulated nodes (`nodeName`), `blockSize` 16:\n")
    print(f"- distinct addresses: {e['distinct']} of {e['count']} (zero duplicates: {e['distinct'] == e['count']})")
    print(f"- ADD: {e['add']['seconds']} s in total, {e['add']['ops_per_s']} ADD/s, per-ADD median {e['add']['median_ms']} ms")
    print(f"- DEL: {e['del']['seconds']} s in total, {e['del']['ops_per_s']} DEL/s, per-DEL median {e['del']['median_ms']} ms")

if has("hostdev-cycle"):
    print("\n## plexus-host-device (issue #5)\n")
    hd, up = med("hostdev-cycle"), load("upstream")["version"]
    table([
        ("ADD+DEL cycle, static IPAM", hd["plexus-host-device"], f"upstream host-device ({up})", hd["upstream-host-device"], "ms", "≤ 0.6"),
        ("ADD+DEL cycle, static IPAM", hd["plexus-host-device"], "reference host-device (1.1.1)", hd["reference-host-device"], "ms", "—"),
        ("ADD+DEL cycle, static IPAM", hd["plexus-host-device"], "floor: one move each way by `ip`", hd["floor-one-move"], "ms", "—"),
    ])
    print("One timed command runs ADD then DEL (hyperfine's shell mode, which subtracts the shell's start-up).")
    print(f"The target is set against upstream's host-device, which moves the device twice each way through a")
    print(f"temporary namespace (plugins#1073): Debian unstable's build, {up}, fetched and verified by")
    print("`scripts/tools/fetch-upstream-plugins.sh`; both use Debian's `static` IPAM. Debian bookworm's 1.1.1")
    print("predates that change and moves once each way, as plexus does. A namespace move is one RTM_SETLINK")
    print("that spends 9–27 ms in the kernel (strace -T; it waits for RCU), so plexus and 1.1.1 both sit on the")
    print("one-move floor, which `ip` commands doing the same kernel work measure. plexus also restores MTU,")
    print("MAC, alias, addresses and admin state on DEL (the references rename the device back and leave it")
    print("down).\n")

if has("meta-rss"):
    print("## plexus meta-plugin (issue #6)\n")
    direct, meta, mrss = med("meta-direct")["plexus-macvlan"], med("meta-nad")["plexus"], load("meta-rss")["meta"]
    print("| what | median (ms) |")
    print("|---|---:|")
    print(f"| plexus-macvlan called directly, L2-only ADD | {direct:.2f} |")
    print(f"| the same through plexus (NAD from `nadDir`, delegate cache written) | {meta:.2f} |")
    print(f"| **overhead of plexus, NAD from `nadDir`** (target ≤ 2 ms) | **{meta - direct:.2f}** |")
    api = med("meta-api-result")["plexus"]
    print(f"| the same through plexus with the Kubernetes API (fake API server, HTTPS: pod GET, NAD GET, status PATCH) | {api:.2f} |")
    print(f"| **overhead of plexus, Kubernetes API** (target ≤ 10 ms) | **{api - direct:.2f}** |")
    print(f"| peak RSS of one plexus ADD (`nadDir`) | {mrss/1024:.1f} MiB |")
    if has("meta-daemon-rss"):
        nad_d, api_d = med("meta-daemon-result")["plexus"], med("meta-api-daemon-result")["plexus"]
        print(f"| the same through the `plexus` shim and plexus-daemon (NAD from `nadDir`) | {nad_d:.2f} |")
        print(f"| **overhead through plexus-daemon, `nadDir`** | **{nad_d - direct:.2f}** |")
        print(f"| the same through the shim and plexus-daemon with the Kubernetes API (pod and NAD from its watch caches, plexus-macvlan in-process, network-status journaled and PATCHed after the answer) | {api_d:.2f} |")
        print(f"| **overhead through plexus-daemon, Kubernetes API** (issue #16 target ≤ 1 ms) | **{api_d - direct:.2f}** |")
        if has("meta-interleaved"):
            il = load("meta-interleaved")
            print(f"| the same two ADDs timed in alternation, run after run ({il['runs']} each): plexus-macvlan / through plexus-daemon | {il['median_ms']['plexus-macvlan']:.2f} / {il['median_ms']['plexus-daemon']:.2f} |")
            print(f"| **overhead through plexus-daemon, Kubernetes API, runs alternated** (median of the paired differences) | **{il['paired_difference_ms']:.2f}** |")
        print(f"| plexus-daemon's peak RSS after those runs (one NAD, one pod cached) | {load('meta-daemon-rss')['daemon']/1024:.1f} MiB |")
    if has("meta-thick-multus"):
        lo, multus, plexus = med("meta-loopback")["loopback"], med("meta-thick-multus")["multus-thick"], med("meta-thick-plexus-result")["plexus-daemon"]
        print("\nSide by side with Multus thick, same run, same fake API server: one pod with a cluster network")
        print("(the reference `loopback`, a conf file both read) and `rail0` (plexus-macvlan, from the pod's")
        print("annotation), through each daemon.\n")
        print("| what | median (ms) |")
        print("|---|---:|")
        print(f"| the two delegates called directly, one after the other (sum of the medians: loopback {lo:.2f} + plexus-macvlan {direct:.2f}) | {lo + direct:.2f} |")
        print(f"| multus-shim → multus-daemon v4.2.3 (pod from its informer, NAD GET, both delegates exec'd, network-status GET + PUT before the answer) | {multus:.2f} |")
        print(f"| plexus shim → plexus-daemon (pod and NAD from its caches, loopback exec'd, plexus-macvlan in-process, network-status after the answer) | {plexus:.2f} |")
        print(f"| overhead over the delegates: Multus thick / plexus-daemon | {multus - lo - direct:.2f} / {plexus - lo - direct:.2f} |")
        print(f"| **plexus-daemon / Multus thick** (time of the ADD) | **{plexus / multus:.2f}** |")
        print("\nThe sum of the direct calls counts plexus-macvlan's own process start (about as long as")
        print("`/bin/true`'s, 0.8 ms here), which plexus-daemon does not pay: it runs plexus-macvlan in-process.")
        print("Its overhead over the delegates can therefore come out below zero.")
    print("\nEach timed plexus ADD is a fresh pod's: the previous run's link and delegate cache are removed")
    print("before it (outside the timing), as DEL would; the cache is written once before the delegate and")
    print("the delegate's result appended to it.")
    if has("meta-daemon-rss"):
        print("\nThrough plexus-daemon the shim is still a process of its own (start, one socket round trip); what")
        print("daemon mode removes is the API client of every invocation (TLS handshake, pod and NAD GETs), the")
        print("delegate's own process (plexus's plugins of the daemon's build run in-process) and the wait for")
        print("the network-status PATCH (journaled before the answer, written after it).")
    print()

if has("rails-macvlan") and has("rails-hostdev"):
    print("\n## An 8-network pod: attachments in parallel (issue #16)\n")
    print("| rails | `\"parallel\": true` (ms) | `\"parallel\": false` (ms) | ratio | target |")
    print("|---|---:|---:|---:|---|")
    for kind, what, target in (("macvlan", "8 × plexus-macvlan + plexus-ipam", "≤ 0.7"),
                               ("hostdev", "8 × plexus-host-device + plexus-ipam", "≤ 0.9")):
        m = med("rails-" + kind)
        par, seq = m["parallel"], m["one-after-another"]
        print(f"| {what} | {par:.1f} | {seq:.1f} | **{par / seq:.2f}** | {target} |")
    rounds = sorted(glob.glob(os.path.join(work, "rails-macvlan.r*.json")))
    timed = sum(len(r["times"]) for p in rounds for r in json.load(open(p))["results"] if r["command"] == "parallel")
    print(f"\nThe pod's CNI ADD alone through plexus (NADs from `nadDir`, no cluster network): medians of {timed} runs")
    print(f"per config, pooled over {len(rounds)} rounds with the two configs' order rotated (hyperfine's shell mode, its")
    print("start-up subtracted); before each timed ADD, plexus's DEL undoes the previous one outside the")
    print("timing. Each macvlan rail is on its own port, each host-device rail moves its own device; all")
    print("sixteen ranges share one plexus-ipam data dir. The kernel serialises namespace moves (RTNL), so")
    print("only the work around them can overlap for host-device.")

if has("daemon-rss"):
    d = load("daemon-rss")
    print("\n## plexus-daemon's memory against Multus thick (issue #16)\n")
    print(f"`scripts/bench/daemon-rss.sh` on the real node of `scripts/cluster.sh`: {d['nads']:,} NADs (10 namespaces)")
    print(f"and {d['pods']:,} pods created through the real kube-apiserver, {d['local']} of them bound to the daemons'")
    print("node and the rest to 49 other node names (every pod names 8 NADs in its networks annotation). Each")
    print("daemon runs alone on the node with its own ServiceAccount, watching with its own node filter; RSS from")
    print(f"/proc {d['settle_s']} s after it started. Multus thick: multus-daemon v4.2.3 (informers of every NAD and of")
    print("the node's pods, full objects); plexus-daemon: reflectors of every NAD and of the node's pods")
    print("(metadata only), trimmed to what plexus reads.\n")
    print("| daemon | RSS | peak RSS | cached | target |")
    print("|---|---:|---:|---|---|")
    p, m = d["plexus"], d["multus"]
    print(f"| plexus-daemon | {p['rss_kib']/1024:.1f} MiB | {p['hwm_kib']/1024:.1f} MiB | {d['plexus_cached']['nads']:,} NADs, "
          f"{d['plexus_cached']['pods']} pods (synced in {d['plexus_synced_s']:.1f} s) | ≤ 25 MiB |")
    print(f"| Multus thick (multus-daemon) | {m['rss_kib']/1024:.1f} MiB | {m['hwm_kib']/1024:.1f} MiB | the same objects | |")
    print(f"| **plexus / Multus thick** | **{p['rss_kib']/m['rss_kib']:.2f}** | {p['hwm_kib']/m['hwm_kib']:.2f} | | |")

if has("ab"):
    ab = load("ab")
    print(f"\n## What the bounds cost: this build against {ab['old']} (issue 35)\n")
    print(f"`SECTIONS=ab AB_OLD={ab['old']} scripts/bench.sh` (`scripts/bench/ab.sh`): both builds' single ADDs on the same")
    print("node, timed in alternation run after run (a drift of the machine falls on both alike); the paired")
    print(f"difference is the median of new minus old over the {load('ab-meta')['runs']} pairs.\n")
    print(f"| request | {ab['old']} (ms) | {ab['new']} (ms) | new / old | paired difference (ms) |")
    print("|---|---:|---:|---:|---:|")
    for case, what in [("macvlan-l2", "plexus-macvlan, L2 only"),
                       ("macvlan-static", "plexus-macvlan + reference static IPAM (a delegate process)"),
                       ("ipam", "plexus-ipam, file store (one resident attachment)"),
                       ("meta", "plexus, a plexus-macvlan NAD from nadDir"),
                       ("daemon", "plexus shim + plexus-daemon, the same NAD (delegate in-process)"),
                       ("daemon-del8", "DEL of an 8-network pod through plexus-daemon (in parallel, in-process)")]:
        if not has(f"ab-{case}"):
            continue
        r = load(f"ab-{case}")
        o, n = r["median_ms"]["old"], r["median_ms"]["new"]
        print(f"| {what} | {o:.2f} | {n:.2f} | {n / o:.2f} | {r['paired_difference_ms']:+.2f} |")

if has("daemon-hostile"):
    d = load("daemon-hostile")
    p, m, f = d["plexus"], d["multus"], d["flood"]
    mib = lambda kib: f"{kib / 1024:.1f} MiB"
    print("\n## plexus-daemon under what tenants may write (issue 35)\n")
    print(f"`scripts/bench/daemon-rss.sh` with `NADS={d['nads']} NAD_KIB={d['nad_kib']} FLOOD={f['sent']['requests']}`: {d['nads']} NADs")
    print(f"whose configs are {d['nad_kib']:,} KiB each (just under etcd's request limit; {d['nads'] * d['nad_kib'] / 1024:.0f} MiB in all),")
    print("created through the real kube-apiserver of `scripts/cluster.sh`, each daemon alone on the node as in")
    print("the section above. plexus-daemon keeps no config above the policy's `limits.nadConfigBytes` (64 KiB):")
    print("it drops one while decoding it and lists NADs 10 at a time. Then")
    print(f"{f['sent']['requests']:,} requests through the `plexus` shim, each naming a delegate type nobody installed, every")
    print(f"type and network name distinct (`scripts/bench/type_flood.py`, {f['sent']['seconds']:.0f} s; every one failed with")
    print("code 100, as it should): delegate types are labels only as installed plugins, networks up to 512.\n")
    print("| | RSS | peak RSS | the DaemonSet's limit |")
    print("|---|---:|---:|---:|")
    print(f"| plexus-daemon, {d['nads']} NADs of {d['nad_kib']:,} KiB cached ({d['plexus_cached']['nads']} NADs, synced in {d['plexus_synced_s']:.1f} s) | **{mib(p['rss_kib'])}** | {mib(p['hwm_kib'])} | {d['limit_mib']} MiB |")
    print(f"| plexus-daemon after {f['sent']['requests']:,} requests of distinct unknown types ({f['delegate_series']} delegate latency series) | **{mib(f['after']['rss_kib'])}** | {mib(f['after']['hwm_kib'])} | {d['limit_mib']} MiB |")
    print(f"| Multus thick (multus-daemon), the same {d['nads']} NADs | {mib(m['rss_kib'])} | {mib(m['hwm_kib'])} | |")
    print(f"| **plexus / Multus thick, the NADs** | **{p['rss_kib'] / m['rss_kib']:.2f}** | {p['hwm_kib'] / m['hwm_kib']:.2f} | |")

if has("daemon-burst"):
    b = load("daemon-burst")
    print("\n## A burst through plexus-daemon under the DaemonSet's memory limit (issue #16)\n")
    print(f"`scripts/bench/daemon-burst.sh`: {b['pods']} pods at once, each with {b['rails']} networks (plexus-macvlan +")
    print("plexus-ipam, file store, NADs from `nadDir`), one `plexus` shim each, sent to one plexus-daemon run with")
    print(f"the daemon-mode DaemonSet's flags (`conf-examples/deploy/daemon/plexus.yaml`) (`--max-concurrent {b['max_concurrent']} --max-queued {b['max_queued']}`)")
    print(f"in a memory cgroup with its limit ({b['limit_mib']} MiB). The daemon runs plexus-macvlan and plexus-ipam")
    print("in-process (the binaries in `CNI_PATH` are of its build), so the burst's delegates are threads of the")
    print("daemon, all in the cgroup as in the DaemonSet's container; the page cache is dropped before the daemon")
    print("starts, so the binaries' pages are charged to it too. The cgroup's charge is what the limit counts")
    print("(RSS and page cache).\n")
    print("| | MiB |")
    print("|---|---:|")
    print(f"| cgroup, daemon idle before the burst | {b['idle_mib']:.1f} |")
    print(f"| **cgroup peak, {b['pods']} pod ADDs at once ({b['pods'] * b['rails']} attachments, {b['add_seconds']:.2f} s)** | **{b['add_peak_mib']:.1f}** |")
    print(f"| cgroup after the ADDs | {b['after_add_mib']:.1f} |")
    print(f"| cgroup peak, their DELs at once ({b['del_seconds']:.2f} s) | {b['del_peak_mib']:.1f} |")
    print(f"| plexus-daemon's own peak RSS | {b['daemon_hwm_mib']:.1f} |")
    print(f"| the limit | {b['limit_mib']} (hit {b['limit_hits']} times) |")
    print(f"\nRequests the daemon did not take (run by the shim itself): {b['ran_by_shim']['add']} ADDs,"
          f" {b['ran_by_shim']['del']} DELs. Every pod had its")
    print(f"{b['rails']} interfaces after the ADDs and none after the DELs.")
    print("What stays charged after the ADDs is mostly page cache (the binaries, the pods' delegate caches and")
    print("IPAM files): it grows with the pods on the node, and the cgroup reclaims it before it would OOM-kill.")
    print("What a burst adds is bounded by `--max-concurrent` requests at work (each with its attachments'")
    print("threads): past it requests queue in the daemon.")

if os.path.exists(os.path.join(work, "cluster.json")):
    c = load("cluster")
    print("\n## A real node: plexus against Multus + macvlan + whereabouts (issue #13)\n")
    print(f"`scripts/bench/cluster.sh` on the single-node cluster of `scripts/cluster.sh` (kubelet, containerd,")
    print(f"kube-apiserver built from their modules; {c['date']}). Per run, {c['pods']} pods created at once, each with N")
    print("macvlan RoCE networks on N ports; the stacks swap the CNI config file between runs, and both first")
    print("pass the same functional check (a 2-network pod Ready, its addresses in the pod and in")
    print("network-status, everything released on delete). Today's stack: Multus thin v4.2.3 + reference")
    print("macvlan v1.9.1 + whereabouts v0.9.2 on its Kubernetes store (IPPool, OverlappingRangeIPReservation,")
    print("its Lease). plexus: plexus + plexus-macvlan + plexus-ipam on its default node-local file store (the")
    print("Kubernetes store on whereabouts' objects is issue #15's). CNI ADD = containerd's debug log, \"begin")
    print("cni setup\" → \"cni result\", per sandbox (the bootstrap cluster network, a bridge, included for both).")
    print("API requests = the apiserver's audit log for the plugins' service accounts, per pod. The 20")
    print("sandboxes start at once on 2 cores: each ADD's time includes waiting for the CPU and, for")
    print("whereabouts, for its cluster-wide Lease.\n")
    print("| networks | stack | CNI ADD median (p90) | all pods Ready | API requests per pod, ADD / DEL |")
    print("|---:|---|---:|---:|---:|")
    by = {(r["stack"], r["networks"]): r for r in c["runs"]}
    for n in sorted({r["networks"] for r in c["runs"]}):
        for stack, label in (("multus", "Multus + macvlan + whereabouts"), ("plexus", "plexus")):
            r = by[(stack, n)]
            print(f"| {n} | {label} | {r['cni_add']['median']:.0f} ms ({r['cni_add']['p90']:.0f} ms) | {r['wall_s']:.1f} s "
                  f"| {r['api_add']['total_per_pod']:.1f} / {r['api_del']['total_per_pod']:.1f} |")
    print("\n| networks | plexus CNI ADD / theirs (median) | target |")
    print("|---:|---:|---|")
    for n in sorted({r["networks"] for r in c["runs"]}):
        ratio = by[("plexus", n)]["cni_add"]["median"] / by[("multus", n)]["cni_add"]["median"]
        print(f"| {n} | {ratio:.3f} | {'≤ 0.5' if n == 8 else '—'} |")
    n = max(r["networks"] for r in c["runs"])
    print(f"\nAPI requests per pod with {n} networks, by verb (ADD):\n")
    for stack in ("multus", "plexus"):
        verbs = by[(stack, n)]["api_add"]["by_verb"]
        print(f"- {stack}: " + ", ".join(f"{k} {v / c['pods']:.1f}" for k, v in verbs.items()))
    print("\nplexus's DEL reads nothing from the API (its cache holds what DEL needs); Multus reads the pod and")
    print("whereabouts takes its Lease for every address it frees.")

if os.path.exists(os.path.join(work, "ipam-k8s.json")):
    k = load("ipam-k8s")
    px, wb = k["px"], k["wb"]
    print("\n## plexus-ipam on the Kubernetes API against whereabouts (issue #15)\n")
    print(f"On the same node and API server (`scripts/bench/cluster.sh`, part 2): {px['count']} allocations by")
    print(f"{px['clients']} concurrent clients, then their release, each allocator on a range of its own; a plugin")
    print("process per ADD/DEL with a pod named in `CNI_ARGS`, as a runtime runs them. plexus-ipam: `\"store\":")
    print("\"kubernetes\"` (whereabouts' objects, no cluster-wide lock; a node's own writers take turns, and the")
    print("writer whose turn it is serves every ADD and DEL waiting in the pool's spool in its one patch: group commit);")
    print("whereabouts v0.9.2 with its cluster-wide Lease. A failed ADD is DELeted and retried, as the kubelet would.\n")
    print("| | plexus-ipam | whereabouts | ratio |")
    print("|---|---:|---:|---:|")
    print(f"| ADD throughput | {px['add']['ops_per_s']:.1f}/s | {wb['add']['ops_per_s']:.1f}/s | **{px['add']['ops_per_s'] / wb['add']['ops_per_s']:.2f}×** (target ≥ 10×) |")
    print(f"| DEL throughput | {px['del']['ops_per_s']:.1f}/s | {wb['del']['ops_per_s']:.1f}/s | {px['del']['ops_per_s'] / wb['del']['ops_per_s']:.1f}× |")
    print(f"| ADD p50 / p99 | {px['add']['median_ms']:.0f} / {px['add']['p99_ms']:.0f} ms | {wb['add']['median_ms']:.0f} / {wb['add']['p99_ms']:.0f} ms | |")
    print(f"| DEL p50 / p99 | {px['del']['median_ms']:.0f} / {px['del']['p99_ms']:.0f} ms | {wb['del']['median_ms']:.0f} / {wb['del']['p99_ms']:.0f} ms | |")
    print(f"| API requests per address (ADD + DEL) | {px['api_requests_per_allocation']} | {wb['api_requests_per_allocation']} | |")
    print(f"| failed ADD attempts (retried) | {px['failed_attempts']} | {wb['failed_attempts']} | |")
    print(f"| distinct addresses | {px['distinct']} | {wb['distinct']} | |")
    print("\nEvery write rewrites the whole IPPool (whereabouts' format: one object per range, here 1,000")
    print("entries), and the API server applies writes to one object one at a time, so writes per address")
    print("set a pool's throughput. whereabouts writes once per address behind its Lease; plexus-ipam's ADDs")
    print("and DELs on one node share a write (group commit) and create or delete their reservations")
    print("concurrently, outside the node's turn. Each of its writes also clears the pool's `managedFields`")
    print("(otherwise the API server keeps a field set listing every entry again: 64 of 143 KB of a")
    print("1,000-entry pool) and takes only the metadata back. Both allocators' figures swing by up to 2×")
    print("between runs on these shared machines (whereabouts' ADD 3.3–7.0/s over the last runs): read the")
    print("same-run ratio.")

if os.path.exists(os.path.join(work, "soak.json")):
    print("\n## Soak (issue #19)")
    s = load("soak")
    f, l = s["first_1000"], s["last_1000"]
    first, last = s["samples"][0], s["samples"][-1]
    print(f"\nSoak (`scripts/soak.sh`): {s['cycles']:,} ADD/DEL cycles through `plexus` with two delegates (two")
    print(f"plexus-macvlan rails with plexus-ipam, NADs from files), {s['clients']} concurrent clients each with its own")
    print(f"pod namespace, a new container ID per cycle; {s['seconds']:.0f} s, {s['cycles_per_s']:.1f} cycles/s.\n")
    print("| | first 1,000 cycles | last 1,000 cycles |")
    print("|---|---:|---:|")
    print(f"| ADD p50 / p99 | {f['add_p50_ms']:.1f} / {f['add_p99_ms']:.1f} ms | {l['add_p50_ms']:.1f} / {l['add_p99_ms']:.1f} ms |")
    print(f"| DEL p50 / p99 | {f['del_p50_ms']:.1f} / {f['del_p99_ms']:.1f} ms | {l['del_p50_ms']:.1f} / {l['del_p99_ms']:.1f} ms |")
    left = s["left"]
    print(f"\nFailures: {s['failures']}. Left at the end: {left['node_links']} node links, "
          f"{sum(len(v) for v in left['pod_links'].values())} pod links, {left['state_files']} IPAM/cache files, "
          f"{left['processes']} processes.")
    print(f"Node-wide open files {first['open_files']} before, {last['open_files']} after; "
          f"MemAvailable {first['mem_available_kib'] // 1024} → {last['mem_available_kib'] // 1024} MiB, "
          f"slab {first['slab_kib'] // 1024} → {last['slab_kib'] // 1024} MiB, cached dentries {first['dentries']:,} → "
          f"{last['dentries']:,}")
    print("(every call is a process of its own: nothing of plexus lives between cycles; the slab grows by the")
    print("kernel's cache of names that came and went, one container ID per cycle, which it reclaims under pressure).")
if os.path.exists(os.path.join(work, "fuzz.txt")):
    print("\n## Fuzzing (issue #19)")
    print("\nFuzzing (`scripts/fuzz.sh`, cargo-fuzz/libFuzzer, optimised with debug assertions): each target")
    print("from the seeds of the test fixtures and the corpus earlier runs grew.\n")
    print("```")
    print(open(os.path.join(work, "fuzz.txt")).read().rstrip())
    print("```")
