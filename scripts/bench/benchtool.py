#!/usr/bin/env python3
"""The small steps the benchmark and check scripts need between their shell commands, one
subcommand each (they were Python embedded in bash before; here each is a function with a test in
test_benchtool.py, which the test command runs):

  rbac-docs MANIFEST               the ServiceAccount, ClusterRole and ClusterRoleBinding documents
  allocations                      addresses held in an IPPool list (kubectl get -o json, stdin)
  network-status STATUS PREFIX     a two-rail pod's network-status names PREFIX-rail0/1, in order
  elapsed T0 T1                    T1 - T0 seconds, rounded to ms
  free-port                        a free TCP port on 127.0.0.1
  ipam-k8s-summary OUT N           the plexus/whereabouts API-store run's results, merged
  soak-clean SOAK_JSON             exit 1 when the soak failed or left anything behind
  fleet DIR NADS PODS LOCAL KIB    a fleet's namespaces, NADs and pods as kubectl List files
  image-index OCI_DIR VERSION BIN.. the multi-arch image archive holds these binaries and nothing else
"""
import datetime
import gzip
import io
import json
import os
import re
import socket
import sys
import tarfile


def rbac_docs(manifest_text):
    """The ServiceAccount, ClusterRole and ClusterRoleBinding documents of a YAML stream."""
    out = []
    for doc in re.split(r"^---\s*$", manifest_text, flags=re.M):
        if re.search(r"^kind: (ServiceAccount|ClusterRole|ClusterRoleBinding)\s*$", doc, re.M):
            out.append("---\n" + doc.strip())
    return "\n".join(out)


def allocations(ippool_list):
    """How many addresses whereabouts' IPPools hold."""
    return sum(len(p["spec"].get("allocations") or {}) for p in ippool_list["items"])


def check_network_status(status, prefix):
    """A pod on PREFIX-rail0 and PREFIX-rail1 (after the cluster network): the networks in
    order, each with its rail's address. Raises ValueError saying what is wrong."""
    names = [e["name"] for e in status[1:]]
    want = [f"default/{prefix}-rail0", f"default/{prefix}-rail1"]
    if names != want:
        raise ValueError(f"network-status names {names}, not {want}")
    for entry, subnet in zip(status[1:], ("198.18.200.", "198.18.201.")):
        if not entry.get("ips") or not entry["ips"][0].startswith(subnet):
            raise ValueError(f"{entry['name']}: {entry.get('ips')} not in {subnet}0/24")


CNI_LINE = re.compile(r'time="([^"]+)".*msg="(?:begin cni setup|cni result)[^"]*".*podsandboxid=([0-9a-f]+)')


def instant(text):
    """A containerd or Kubernetes timestamp (nanoseconds cut to microseconds, for datetime)."""
    text = re.sub(r"(\.\d{6})\d*", r"\1", text.replace("Z", "+00:00"))
    return datetime.datetime.fromisoformat(text)


def spans_ms(lines, pattern, ends):
    """Milliseconds from each key's first line to the line that ends it: `pattern` finds a line's
    time and key (groups 1 and 2), `ends(line)` says the line ends its key's span."""
    begin, took = {}, []
    for line in lines:
        m = pattern.search(line)
        if not m:
            continue
        when, key = instant(m[1]), m[2]
        if not ends(line):
            begin.setdefault(key, when)
        elif key in begin:
            took.append((when - begin.pop(key)).total_seconds() * 1000)
    return took


def pct(values, q):
    """The q-quantile by nearest rank (P99 of fewer than 100 values is the largest)."""
    values = sorted(values)
    return values[min(len(values) - 1, max(0, -(-int(q * 1000) * len(values) // 1000) - 1))]


def cni_add_ms(lines):
    """Each sandbox's CNI ADD as containerd logs it at debug level: "begin cni setup" → "cni result"."""
    return spans_ms(lines, CNI_LINE, lambda line: 'msg="cni result' in line)


def elapsed(t0, t1):
    return round(float(t1) - float(t0), 3)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ipam_k8s_summary(out, n):
    """Each stack's load result with its API requests per allocation (ADD and DEL together),
    counted in the audit log of its run by the stack's user."""
    res = {}
    for who, user in (("px", "plexus"), ("wb", "whereabouts")):
        with open(f"{out}/ipam-k8s-{who}.json") as f:
            r = json.load(f)
        with open(f"{out}/ipam-k8s-{who}-audit.log") as f:
            reqs = sum(1 for line in f if json.loads(line)["user"]["username"].endswith(":" + user))
        r["api_requests_per_allocation"] = round(reqs / n, 1)
        res[who] = r
    return res


def soak_clean(report):
    """Whether a soak run (scripts/bench/soak.py's report) ended with no failure and nothing left."""
    left = report["left"]
    return not (report["failures"] or left["node_links"] or left["pod_links"] or left["state_files"]
                or left["processes"])


def fleet(nads, pods, local, pad_kib):
    """A training fleet's objects: 10 tenant namespaces (with their default ServiceAccounts), NADS
    macvlan+whereabouts NADs (each config padded to PAD_KIB KiB when given), PODS pods of 8 rails
    each, LOCAL of them on bench-node. Returned as kubectl List documents: the namespaces first,
    then 4 objects a file when padded (a request stays under the API server's limit), else 1000."""
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"tenant-{i}"}} for i in range(10)]
    # Their default ServiceAccounts (a stopped controller-manager would not make them).
    docs += [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": f"tenant-{i}"}}
             for i in range(10)]
    for i in range(nads):
        conf = {"cniVersion": "1.0.0", "name": f"rail{i}", "type": "macvlan", "master": f"ens{i % 8 + 1}f0np0",
                "mode": "bridge", "ipam": {"type": "whereabouts", "range": f"10.{i // 256 % 256}.{i % 256}.0/24"}}
        if pad_kib:
            conf["pad"] = "x" * (pad_kib * 1024 - len(json.dumps(conf)) - 10)
        docs.append({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                     "metadata": {"name": f"rail{i}", "namespace": f"tenant-{i % 10}",
                                  "annotations": {"k8s.v1.cni.cncf.io/resourceName": "nvidia.com/rdma_shared_device_a"}},
                     "spec": {"config": json.dumps(conf)}})
    for i in range(pods):
        node = "bench-node" if i < local else f"node-{i % 49}"
        nets = ",".join(f"rail{(i + r) % nads}" for r in range(0, 80, 10))
        docs.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"trainer-{i}", "namespace": f"tenant-{i % 10}",
                                  "labels": {"app": "trainer", "job": f"job-{i // 8}", "rank": str(i % 8)},
                                  "annotations": {"k8s.v1.cni.cncf.io/networks": nets}},
                     "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                              "containers": [{"name": "trainer", "image": "registry.example/trainer:1.0",
                                              "command": ["python", "train.py", "--rank", str(i % 8)],
                                              "env": [{"name": "NCCL_IB_HCA", "value": "mlx5"}],
                                              "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
    per_file = 4 if pad_kib else 1000
    lists = [docs[:20]] + [docs[n:n + per_file] for n in range(20, len(docs), per_file)]
    return [{"apiVersion": "v1", "kind": "List", "items": items} for items in lists]


ELF_MACHINE = {"amd64": 62, "arm64": 183}  # e_machine: x86-64, AArch64


def image_index(root, version, shipped):
    """The OCI archive (extracted at ROOT) of scripts/build-image.sh: an index of linux/amd64 and
    linux/arm64, each image the SHIPPED binaries (scripts/lib/shipped.sh) of its architecture and
    nothing else, its
    entrypoint `plexusctl install`, labelled with the workspace's version and a revision. Returns
    one line per image; raises ValueError on the first thing wrong."""
    def blob(digest):
        with open(f"{root}/blobs/sha256/{digest.split(':')[1]}", "rb") as f:
            return f.read()

    def need(ok, what):
        if not ok:
            raise ValueError(what)

    with open(f"{root}/index.json") as f:
        index = json.loads(blob(json.load(f)["manifests"][0]["digest"]))
    platforms = sorted(m["platform"]["architecture"] for m in index["manifests"])
    need(platforms == ["amd64", "arm64"], f"platforms {platforms}")
    lines = []
    for m in index["manifests"]:
        arch = m["platform"]["architecture"]
        manifest = json.loads(blob(m["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        need(config["architecture"] == arch, f"{arch}: config says {config['architecture']}")
        need(config["config"]["Entrypoint"] == ["/plexus/bin/plexusctl", "install"],
             f"{arch}: entrypoint {config['config']['Entrypoint']}")
        labels = config["config"]["Labels"]
        need(labels["org.opencontainers.image.version"] == version, f"{arch}: labels {labels}")
        need(labels["org.opencontainers.image.revision"] not in ("", "unknown"), f"{arch}: labels {labels}")
        heads = {}
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(layer["digest"])))) as t:
                for member in t.getmembers():
                    if member.isfile():
                        heads[member.name.removeprefix("./")] = t.extractfile(member).read(20)
        names = sorted(heads)
        need(names == sorted(f"plexus/bin/{b}" for b in shipped), f"{arch}: {names} (no shell, nothing else)")
        for name, head in heads.items():
            need(head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == ELF_MACHINE[arch],
                 f"{arch}: {name} is not an ELF binary of {arch}")
        lines.append(f"image linux/{arch}: {len(names)} static binaries of its architecture, "
                     f"entrypoint plexusctl install, version {version}")
    return lines


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "rbac-docs":
        with open(args[0]) as f:
            print(rbac_docs(f.read()))
    elif cmd == "allocations":
        print(allocations(json.load(sys.stdin)))
    elif cmd == "network-status":
        try:
            check_network_status(json.loads(args[0]), args[1])
        except ValueError as e:
            print(f"benchtool: {e}", file=sys.stderr)
            return 1
    elif cmd == "elapsed":
        print(elapsed(args[0], args[1]))
    elif cmd == "free-port":
        print(free_port())
    elif cmd == "ipam-k8s-summary":
        print(json.dumps(ipam_k8s_summary(args[0], int(args[1]))))
    elif cmd == "soak-clean":
        with open(args[0]) as f:
            return 0 if soak_clean(json.load(f)) else 1
    elif cmd == "fleet":
        d = args[0]
        os.makedirs(d)
        for i, doc in enumerate(fleet(int(args[1]), int(args[2]), int(args[3]), int(args[4]))):
            with open(os.path.join(d, f"{i:05}.json"), "w") as f:
                json.dump(doc, f)
    elif cmd == "image-index":
        try:
            print("\n".join(image_index(args[0], args[1], args[2:])))
        except ValueError as e:
            print(f"benchtool: image index: {e}", file=sys.stderr)
            return 1
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
