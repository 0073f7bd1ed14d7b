#!/usr/bin/env python3
"""scripts/bench/dra.sh's helpers.

  dra_summary.py devices DRIVER NODE < resourceslices.json   # devices DRIVER offers on NODE
  dra_summary.py summary OUT PODS NICS ROUNDS                 # OUT/<driver>-<round>.* -> JSON
  dra_summary.py table dra.json                               # the Markdown table
"""
import json, os, re, sys

from benchtool import cni_add_ms, pct, spans_ms

DRIVERS = ("plexus", "floor", "dranet")
# klog: "RunPodSandbox Pod default/dra-dranet-1-3 UID 1a2b... took 123.4ms"
NRI = re.compile(r"RunPodSandbox Pod (\S+) UID \S+ took (\S+)$")
UNITS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0, "h": 3600000.0}


def go_duration_ms(text):
    """A Go time.Duration's String() ("1.5s", "2m3.4s", "850.2µs") in milliseconds."""
    parts = re.findall(r"([0-9.]+)(ns|µs|us|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Go duration: {text!r}")
    return sum(float(n) * UNITS[u] for n, u in parts)


SANDBOX = re.compile(r'time="([^"]+)".*msg="RunPodSandbox for &PodSandboxMetadata\{Name:([^,]+),')


def sandbox_ms(lines):
    """Each pod's CRI RunPodSandbox, from the request to the sandbox's ID returned."""
    return spans_ms(lines, SANDBOX, lambda line: "returns sandbox id" in line)


def nri_ms(lines):
    return [go_duration_ms(m[2]) for m in (NRI.search(line.strip()) for line in lines) if m]


def ready_s(t0, lines):
    """Each pod's first Ready after t0, in seconds."""
    first = {}
    for line in lines:
        name, when = line.split()
        first.setdefault(name, float(when))
    return [when - t0 for when in first.values()]


def spread(values):
    return {"p50": pct(values, 0.5), "p99": pct(values, 0.99), "max": max(values), "n": len(values)} if values else None


def slice_devices(slices, driver, node):
    return sum(len(s["spec"].get("devices") or []) for s in slices["items"]
               if s["spec"]["driver"] == driver and s["spec"].get("nodeName") == node)


def summary(out, pods, nics, rounds):
    result = {"pods": pods, "nics": nics, "rounds": rounds, "drivers": {}}
    for driver in DRIVERS:
        ready, cni, nri, sandbox = [], [], [], []
        for r in range(1, rounds + 1):
            base = os.path.join(out, f"{driver}-{r}")
            with open(base + ".t0") as f:
                t0 = float(f.read())
            with open(base + ".ready") as f:
                got = ready_s(t0, f)
            if len(got) != pods:
                raise ValueError(f"{driver} round {r}: {len(got)} of {pods} pods Ready")
            ready += got
            with open(base + ".cni") as f:
                lines = f.readlines()
            cni += cni_add_ms(lines)
            sandbox += sandbox_ms(lines)
            with open(base + ".nri") as f:
                nri += nri_ms(f)
        result["drivers"][driver] = {"ready_s": spread(ready), "run_pod_sandbox_ms": spread(sandbox),
                                     "cni_add_ms": spread(cni), "nri_run_pod_sandbox_ms": spread(nri)}
    p, d = result["drivers"]["plexus"]["ready_s"], result["drivers"]["dranet"]["ready_s"]
    result["ratio"] = {"p50": p["p50"] / d["p50"], "p99": p["p99"] / d["p99"]}
    return result


def table(s):
    rows = [f"{s['pods']} pods at once, {s['nics']} whole ports each, {s['rounds']} rounds each (alternated); "
            "floor: the same pods without a claim", "",
            "| | plexus | dranet v1.0.1 | floor | plexus / dranet | (plexus − floor) / (dranet − floor) |",
            "|---|---:|---:|---:|---:|---:|"]
    p, d, f = (s["drivers"][k] for k in ("plexus", "dranet", "floor"))
    for key, label in (("p50", "P50"), ("p99", "P99")):
        pr, dr, fr = p["ready_s"][key], d["ready_s"][key], f["ready_s"][key]
        rows.append(f"| pod creation → Ready, {label} (s) | {pr:.2f} | {dr:.2f} | {fr:.2f} | {pr / dr:.2f} | "
                    f"{(pr - fr) / (dr - fr) if dr != fr else float('nan'):.2f} |")
    for key, label in (("p50", "P50"), ("p99", "P99")):
        ps, ds, fs = p["run_pod_sandbox_ms"][key], d["run_pod_sandbox_ms"][key], f["run_pod_sandbox_ms"][key]
        rows.append(f"| CRI RunPodSandbox, {label} (ms) | {ps:.0f} | {ds:.0f} | {fs:.0f} | {ps / ds:.2f} | "
                    f"{(ps - fs) / (ds - fs) if ds != fs else float('nan'):.2f} |")
    for key, label in (("p50", "P50"), ("p99", "P99")):
        pc, dc, fc = p["cni_add_ms"][key], d["cni_add_ms"][key], f["cni_add_ms"][key]
        nri = d["nri_run_pod_sandbox_ms"][key] if d["nri_run_pod_sandbox_ms"] else float("nan")
        rows.append(f"| network setup per sandbox, {label} (ms): CNI ADD (+ dranet's NRI RunPodSandbox) | "
                    f"{pc:.0f} | {dc:.0f} + {nri:.0f} | {fc:.0f} | {pc / (dc + nri):.2f} | "
                    f"{(pc - fc) / (dc + nri - fc) if dc + nri != fc else float('nan'):.2f} |")
    return "\n".join(rows)


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "devices":
        print(slice_devices(json.load(sys.stdin), args[0], args[1]))
    elif cmd == "summary":
        print(json.dumps(summary(args[0], int(args[1]), int(args[2]), int(args[3])), indent=1))
    elif cmd == "table":
        with open(args[0]) as f:
            print(table(json.load(f)))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
