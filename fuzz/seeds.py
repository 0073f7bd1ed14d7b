#!/usr/bin/env python3
"""Seed corpora for the fuzz targets, from the project's own fixtures: every JSON document
written as a raw string in the tests and unit tests, the example manifests and conflists, plus
kernel messages built here field by field (rtnetlink and RDMA netlink, as the kernel sends them).

usage: seeds.py OUT_DIR   (writes OUT_DIR/<target>/<sha1>)
"""
import hashlib
import pathlib
import re
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = pathlib.Path(sys.argv[1])


def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()).write_bytes(data)


# JSON documents in the Rust sources: r#"{...}"# and r#"[...]"# literals (format! templates
# with their {{ }} undone as well).
json_docs = set()
for src in list(ROOT.glob("crates/*/src/**/*.rs")) + list(ROOT.glob("plugins/*/src/**/*.rs")) + list(
    ROOT.glob("tests/tests/*.rs")
):
    for m in re.finditer(r'r#"(.*?)"#', src.read_text(), re.S):
        s = m.group(1).strip()
        if s[:1] in "{[":
            json_docs.add(s)
            if "{{" in s:
                json_docs.add(s.replace("{{", "{").replace("}}", "}"))
for f in list(ROOT.glob("conf-examples/**/*.conflist")) + list(ROOT.glob("conf-examples/**/*.json")):
    json_docs.add(f.read_text())

for doc in json_docs:
    for target in ["netconf", "result", "policy", "device_info", "meta_cache", "host_state", "store_records",
                   "checkpoint", "nad"]:
        put(target, doc)

for f in ROOT.glob("conf-examples/**/*.yaml"):
    put("nad", f.read_text())

# Annotations, both forms, and CNI_ARGS, as the tests and Multus's docs write them.
for s in ["rail0", "rail0,rail1", "ns1/rail0@net9, rail1", "default / net1 @ eth9",
          '[{"name":"rail0","namespace":"ns1","interface":"net1","ips":["198.18.0.5/24"],'
          '"mac":"02:00:00:00:00:01","default-route":["198.18.0.1"],"cni-args":{"a":"b"},"deviceID":"0000:03:00.1"}]',
          '{"name":"rail0"}', ""]:
    put("selection", s)
for s in ["IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod;K8S_POD_INFRA_CONTAINER_ID=c1",
          "IP=198.18.0.5/24,2001:db8::5/64;MAC=02:00:00:00:00:01", "K8S_POD_UID=u", "a=b=c;;"]:
    put("cni_args", s)
put("checkpoint", '{"Data":{"PodDeviceEntries":[{"PodUID":"uid-1","ContainerName":"c","ResourceName":'
                  '"nvidia.com/rdma_shared","DeviceIDs":{"0":["0000:03:00.1","0000:03:00.0"]},"AllocResp":""}],'
                  '"RegisteredDevices":{}},"Checksum":1}')
put("checkpoint", '{"Data":{"PodDeviceEntries":[{"PodUID":"uid-1","ResourceName":"nvidia.com/rdma_shared",'
                  '"DeviceIDs":["b","a","a"]}]}}')
put("store_records", '{"metadata":{"annotations":{"ipam.plexus.io/next":"7"}},"spec":{"range":"198.18.0.0/24",'
                     '"allocations":{"5":{"id":"c1","podref":"ns/pod","ifname":"net1"},"9":{"id":"c2","podref":'
                     '"ns/b","ifname":"net1"}}}}')
put("store_records", '{"spec":{"containerid":"c1","podref":"ns/pod","ifname":"net1"}}')
put("store_records", '{"owner":{"containerID":"c1","ifname":"net1","podRef":"ns/pod","node":"n","network":"x"},'
                     '"ips":[{"ip":"198.18.0.5","range":"198.18.0.0/24"}]}')
put("store_records", '{"ip":"2001:db8::5","range":"2001:db8::/64","containerID":"c1","ifname":"net1","node":"n",'
                     '"network":"x"}')


# ---- netlink messages ----
def attr(kind, payload):
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * ((4 - n % 4) % 4)


def nlmsg(kind, body, flags=2):
    return struct.pack("=IHHII", 16 + len(body), kind, flags, 1, 0) + body


RTM_NEWLINK, RTM_NEWADDR, RTM_NEWROUTE, RTM_NEWRULE = 16, 20, 24, 32
ifinfo = struct.pack("=BxHiII", 0, 1, 7, 1, 0)  # family, type ether, index 7, IFF_UP
macvlan = attr(18, attr(1, b"macvlan\0") + attr(2, attr(1, struct.pack("=I", 4))))  # LINKINFO: kind, mode bridge
link = nlmsg(RTM_NEWLINK, ifinfo + attr(3, b"net1\0") + attr(4, struct.pack("=I", 9000))
             + attr(1, bytes.fromhex("020000000001")) + attr(5, struct.pack("=I", 3)) + attr(20, b"alias\0") + macvlan)
addr4 = nlmsg(RTM_NEWADDR, struct.pack("=BBBBI", 2, 24, 0x40, 0, 7) + attr(2, bytes([198, 18, 0, 5]))
              + attr(1, bytes([198, 18, 0, 5])) + attr(8, struct.pack("=I", 0x40)))
addr6 = nlmsg(RTM_NEWADDR, struct.pack("=BBBBI", 10, 64, 0, 0, 7)
              + attr(1, bytes.fromhex("20010db8000000000000000000000005")))
route = nlmsg(RTM_NEWROUTE, struct.pack("=BBBBBBBBI", 2, 24, 0, 0, 254, 4, 0, 1, 0)
              + attr(1, bytes([198, 18, 0, 0])) + attr(5, bytes([198, 18, 0, 1])) + attr(4, struct.pack("=I", 7))
              + attr(15, struct.pack("=I", 100)) + attr(6, struct.pack("=I", 10))
              + attr(8, attr(2, struct.pack("=I", 9000))))
rule = nlmsg(RTM_NEWRULE, struct.pack("=BBBBBBBBI", 2, 0, 32, 0, 100, 0, 0, 1, 0)
             + attr(2, bytes([198, 18, 0, 5])) + attr(15, struct.pack("=I", 100)) + attr(6, struct.pack("=I", 32765)))
for m in [link, addr4, addr6, route, rule, link + addr4 + route + rule]:
    put("rtnetlink", m)

# RDMA netlink: device dump answer (index, name), system mode answer, an error.
RDMA_NL_NLDEV = 5
def rdma(op, body):
    return nlmsg((RDMA_NL_NLDEV << 10) + op, body)
dev = rdma(1, attr(1, struct.pack("=I", 2)) + attr(2, b"mlx5_0\0"))
sys_ = rdma(6, attr(66, bytes([1])))
err = struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", -19) + b"\0" * 16
for m in [dev, sys_, err, dev + sys_]:
    put("rdma", m)
