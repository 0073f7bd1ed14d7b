"""Tests of benchtool.py and scale.py (run by the test command: tests/tests/scripts.rs)."""
import gzip
import hashlib
import io
import json
import os
import socket
import tarfile
import tempfile
import unittest

import benchtool
import scale


class RbacDocs(unittest.TestCase):
    def test_keeps_the_account_and_its_cluster_roles_and_nothing_else(self):
        stream = "\n---\n".join([
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: multus}",
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: multus}",
            "kind: ClusterRole\nmetadata: {name: multus}",
            "kind: ClusterRoleBinding\nmetadata: {name: multus}",
            "kind: ConfigMap\ndata: {x: 'kind: ClusterRole'}",
        ])
        out = benchtool.rbac_docs(stream)
        self.assertEqual(out.count("---"), 3)
        self.assertNotIn("DaemonSet", out)
        self.assertNotIn("ConfigMap", out)


class ScaleDuplicates(unittest.TestCase):
    def test_an_address_on_two_pods_secondary_interfaces_is_a_duplicate_and_the_cluster_network_is_not_counted(self):
        status = lambda *ips: json.dumps([{"name": "cluster", "default": True, "ips": ["198.19.128.2"]}]
                                         + [{"name": f"scale/rail{i}", "ips": [ip]} for i, ip in enumerate(ips)])
        out = scale.duplicates({"a": status("198.18.0.1", "198.18.8.1"), "b": status("198.18.0.2", "198.18.8.1"),
                                "c": None})
        self.assertEqual((out["addresses"], out["duplicates"]), (3, 1))
        self.assertEqual(out["examples"], {"198.18.8.1": ["a", "b"]})

    def test_spread_is_nearest_rank_and_empty_is_none(self):
        self.assertEqual(scale.spread(list(range(1, 101))), {"n": 100, "p50": 50, "p99": 99, "max": 100})
        self.assertEqual(scale.spread([])["p99"], None)

    def test_a_stacks_nads_are_eight_rails_of_its_plugins_with_a_range_each(self):
        for stack, plugin, ipam in [("plexus", "plexus-macvlan", "plexus-ipam"), ("multus", "macvlan", "whereabouts"),
                                    ("nodeslice", "macvlan", "whereabouts")]:
            nads = scale.nads(stack, 0)
            confs = [json.loads(n["spec"]["config"]) for n in nads]
            self.assertEqual([n["metadata"]["name"] for n in nads], [f"rail{i}" for i in range(1, 9)])
            self.assertEqual({(c["type"], c["ipam"]["type"]) for c in confs}, {(plugin, ipam)})
            self.assertEqual(len({c["ipam"]["range"] for c in confs}), 8)
        # whereabouts finds its kubeconfig through the flat config file named.
        confs = [json.loads(n["spec"]["config"]) for n in scale.nads("multus", 0, "/x/whereabouts.conf")]
        self.assertEqual({c["ipam"]["configuration_path"] for c in confs}, {"/x/whereabouts.conf"})
        # In node-slice mode each network is named (its NodeSlicePool's name) and sliced per node.
        confs = [json.loads(n["spec"]["config"]) for n in scale.nads("nodeslice", 0)]
        self.assertEqual([c["ipam"]["network_name"] for c in confs], [f"rail{i}" for i in range(1, 9)])
        self.assertEqual({c["ipam"]["node_slice_size"] for c in confs}, {"/28"})

    def test_the_plot_draws_a_line_per_stack_on_both_panels_and_marks_failed_adds(self):
        import xml.etree.ElementTree as ET
        point = lambda stack, n, p99, per_pod, failed=0: {
            "stack": stack, "nodes": n, "api_requests_per_pod": per_pod,
            "cni_add_ms": {"p99": p99, "failed": failed}}
        svg = scale.plot([point("plexus", 16, 900, 7), point("plexus", 128, 1500, 7),
                          point("whereabouts", 16, 4000, 40), point("whereabouts", 64, 240000, 55, failed=31),
                          point("whereabouts", 128, None, 60, failed=900)])
        root = ET.fromstring(svg)
        ns = "{http://www.w3.org/2000/svg}"
        self.assertEqual(len(root.findall(f"{ns}polyline")), 4, "two stacks on two panels")
        hollow = [c for c in root.findall(f"{ns}circle") if c.get("fill") == "white"]
        self.assertEqual(len(hollow), 4, "the points with failed ADDs, on each panel")
        self.assertIn("31 ADDs failed", svg)
        self.assertIn("no ADD succeeded", svg)
        # The highest point is inside the panel: the axis is scaled to the largest value.
        ys = [float(c.get("cy")) for c in root.findall(f"{ns}circle")]
        self.assertTrue(all(20 < y < 260 for y in ys), ys)
        # A requests figure not measured is left off that panel, its ADD point kept.
        svg = scale.plot([point("plexus", 16, 900, 7), point("plexus", 32, 1500, None)])
        circles = ET.fromstring(svg).findall(f"{ns}circle")
        self.assertEqual(len(circles), 3, "two ADD points and one requests point")


class Allocations(unittest.TestCase):
    def test_counts_every_pools_allocations_and_a_pool_without_any(self):
        pools = {"items": [{"spec": {"allocations": {"1": {}, "2": {}}}}, {"spec": {"allocations": None}},
                           {"spec": {}}]}
        self.assertEqual(benchtool.allocations(pools), 2)


class NetworkStatus(unittest.TestCase):
    def status(self, first, second):
        return [{"name": "cbr0", "ips": ["10.1.0.5"]},
                {"name": "default/px-rail0", "ips": [first]}, {"name": "default/px-rail1", "ips": [second]}]

    def test_two_rails_in_order_with_their_addresses_pass(self):
        benchtool.check_network_status(self.status("198.18.200.7", "198.18.201.7"), "px")

    def test_rails_swapped_or_an_address_of_the_other_rail_fail(self):
        swapped = self.status("198.18.200.7", "198.18.201.7")
        swapped[1], swapped[2] = swapped[2], swapped[1]
        with self.assertRaisesRegex(ValueError, "names"):
            benchtool.check_network_status(swapped, "px")
        with self.assertRaisesRegex(ValueError, "198.18.201.0/24"):
            benchtool.check_network_status(self.status("198.18.200.7", "198.18.200.8"), "px")
        with self.assertRaisesRegex(ValueError, "names"):
            benchtool.check_network_status(self.status("198.18.200.7", "198.18.201.7"), "wb")


class Small(unittest.TestCase):
    def test_elapsed_is_in_seconds_to_the_millisecond(self):
        self.assertEqual(benchtool.elapsed("1733400000.1000", "1733400002.5556"), 2.456)

    def test_a_free_port_can_be_bound(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", benchtool.free_port()))

    def test_a_soak_is_clean_only_without_failures_and_with_nothing_left(self):
        clean = {"failures": 0, "left": {"node_links": [], "pod_links": [], "state_files": 0, "processes": []}}
        self.assertTrue(benchtool.soak_clean(clean))
        for key, value in [("node_links", ["macvlan0"]), ("state_files", 1), ("processes", [42])]:
            dirty = json.loads(json.dumps(clean))
            dirty["left"][key] = value
            self.assertFalse(benchtool.soak_clean(dirty), key)
        self.assertFalse(benchtool.soak_clean(dict(clean, failures=1)))


class IpamSummary(unittest.TestCase):
    def test_api_requests_per_allocation_count_only_the_stacks_own_user(self):
        with tempfile.TemporaryDirectory() as d:
            for who, user in (("px", "plexus"), ("wb", "whereabouts")):
                with open(f"{d}/ipam-k8s-{who}.json", "w") as f:
                    json.dump({"per_s": 10}, f)
                with open(f"{d}/ipam-k8s-{who}-audit.log", "w") as f:
                    for u in [user] * 5 + ["kubelet"] * 3:
                        f.write(json.dumps({"user": {"username": f"system:serviceaccount:kube-system:{u}"}}) + "\n")
            res = benchtool.ipam_k8s_summary(d, 2)
        self.assertEqual(res["px"], {"per_s": 10, "api_requests_per_allocation": 2.5})
        self.assertEqual(res["wb"]["api_requests_per_allocation"], 2.5)


class Fleet(unittest.TestCase):
    def test_namespaces_come_first_then_nads_and_pods_in_files_the_api_server_takes(self):
        lists = benchtool.fleet(nads=30, pods=12, local=3, pad_kib=0)
        self.assertEqual([o["kind"] for o in lists[0]["items"]], ["Namespace"] * 10 + ["ServiceAccount"] * 10)
        objs = [o for lst in lists[1:] for o in lst["items"]]
        self.assertEqual(sum(o["kind"] == "NetworkAttachmentDefinition" for o in objs), 30)
        pods = [o for o in objs if o["kind"] == "Pod"]
        self.assertEqual(len(pods), 12)
        self.assertEqual(sum(p["spec"]["nodeName"] == "bench-node" for p in pods), 3)
        nets = pods[0]["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"].split(",")
        self.assertEqual(len(nets), 8)

    def test_padded_nads_are_the_size_asked_and_four_to_a_file(self):
        lists = benchtool.fleet(nads=9, pods=0, local=0, pad_kib=16)
        self.assertEqual([len(lst["items"]) for lst in lists[1:]], [4, 4, 1])
        conf = lists[1]["items"][0]["spec"]["config"]
        self.assertLessEqual(abs(len(conf) - 16 * 1024), 16)


def write_blob(root, data):
    digest = hashlib.sha256(data).hexdigest()
    with open(f"{root}/blobs/sha256/{digest}", "wb") as f:
        f.write(data)
    return f"sha256:{digest}"


def oci_archive(root, files_of, version="0.1.0", entrypoint=("/plexus/bin/plexusctl", "install")):
    """An OCI layout like podman's: an index pointing at an image index of one image per arch."""
    os.makedirs(f"{root}/blobs/sha256")
    manifests = []
    for arch, files in files_of.items():
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        layer = write_blob(root, gzip.compress(buf.getvalue()))
        config = write_blob(root, json.dumps({"architecture": arch, "config": {
            "Entrypoint": list(entrypoint),
            "Labels": {"org.opencontainers.image.version": version, "org.opencontainers.image.revision": "abc"}}}).encode())
        manifest = write_blob(root, json.dumps({"config": {"digest": config}, "layers": [{"digest": layer}]}).encode())
        manifests.append({"digest": manifest, "platform": {"architecture": arch, "os": "linux"}})
    index = write_blob(root, json.dumps({"manifests": manifests}).encode())
    with open(f"{root}/index.json", "w") as f:
        json.dump({"manifests": [{"digest": index}]}, f)


def elf(machine):
    return b"\x7fELF" + bytes(14) + machine.to_bytes(2, "little") + bytes(10)


SHIPPED = ["plexus", "plexus-macvlan", "plexusctl"]


class ImageIndex(unittest.TestCase):
    def shipped(self, arch):
        return {f"./plexus/bin/{b}": elf(benchtool.ELF_MACHINE[arch]) for b in SHIPPED}

    def test_both_architectures_with_their_own_binaries_pass(self):
        with tempfile.TemporaryDirectory() as d:
            oci_archive(d, {"amd64": self.shipped("amd64"), "arm64": self.shipped("arm64")})
            lines = benchtool.image_index(d, "0.1.0", SHIPPED)
        self.assertEqual(len(lines), 2)
        self.assertIn("image linux/arm64: 3 static binaries", lines[1])

    def test_a_shell_an_amd64_binary_in_the_arm64_image_or_a_wrong_version_fail(self):
        cases = {
            "no shell": {"amd64": dict(self.shipped("amd64"), **{"./bin/sh": elf(62)}), "arm64": self.shipped("arm64")},
            "not an ELF binary of arm64": {"amd64": self.shipped("amd64"), "arm64": self.shipped("amd64")},
            "platforms": {"amd64": self.shipped("amd64")},
        }
        for want, files_of in cases.items():
            with tempfile.TemporaryDirectory() as d:
                oci_archive(d, files_of)
                with self.assertRaisesRegex(ValueError, want):
                    benchtool.image_index(d, "0.1.0", SHIPPED)
        with tempfile.TemporaryDirectory() as d:
            oci_archive(d, {"amd64": self.shipped("amd64"), "arm64": self.shipped("arm64")}, version="0.0.9")
            with self.assertRaisesRegex(ValueError, "labels"):
                benchtool.image_index(d, "0.1.0", SHIPPED)


if __name__ == "__main__":
    unittest.main()


class DraSummary(unittest.TestCase):
    """scripts/bench/dra_summary.py, the DRA comparison's reader."""

    def test_go_durations_are_read_in_milliseconds_and_anything_else_refused(self):
        import dra_summary
        self.assertEqual(dra_summary.go_duration_ms("1.5s"), 1500.0)
        self.assertAlmostEqual(dra_summary.go_duration_ms("850.2µs"), 0.8502)
        self.assertEqual(dra_summary.go_duration_ms("2m3.4s"), 123400.0)
        with self.assertRaises(ValueError):
            dra_summary.go_duration_ms("12 ms")

    def test_dranets_hook_lines_and_containerds_cni_lines_give_one_time_per_sandbox(self):
        import dra_summary
        nri = ["I1206 07:30:00.1 1 nri_hooks.go:111] RunPodSandbox Pod default/p-0 UID 9f took 12.5ms",
               "I1206 07:30:00.1 1 nri_hooks.go:106] RunPodSandbox Pod default/p-0 UID 9f"]
        self.assertEqual(dra_summary.nri_ms(nri), [12.5])
        cni = ['time="2026-12-06T07:30:00.100000000Z" level=debug msg="begin cni setup" podsandboxid=ab',
               'time="2026-12-06T07:30:00.100000000Z" level=debug msg="begin cni setup" podsandboxid=cd',
               'time="2026-12-06T07:30:00.350000000Z" level=debug msg="cni result: {}" podsandboxid=ab']
        self.assertEqual([round(ms) for ms in dra_summary.cni_add_ms(cni)], [250])

    def test_each_pod_counts_once_from_its_first_ready_and_p99_of_few_is_the_largest(self):
        import dra_summary
        got = sorted(dra_summary.ready_s(100.0, ["a 101.5", "b 102.0", "a 103.0"]))
        self.assertEqual(got, [1.5, 2.0])
        self.assertEqual(benchtool.pct([3, 1, 2, 4], 0.5), 2)
        self.assertEqual(benchtool.pct(list(range(1, 49)), 0.99), 48)

    def test_devices_are_counted_over_the_drivers_slices_on_the_node(self):
        import dra_summary
        slices = {"items": [
            {"spec": {"driver": "plexus.dev", "nodeName": "n1", "devices": [{}] * 128}},
            {"spec": {"driver": "plexus.dev", "nodeName": "n1", "devices": [{}] * 32}},
            {"spec": {"driver": "dra.net", "nodeName": "n1", "devices": [{}] * 5}},
            {"spec": {"driver": "plexus.dev", "nodeName": "n2", "devices": [{}]}}]}
        self.assertEqual(dra_summary.slice_devices(slices, "plexus.dev", "n1"), 160)

    def test_a_sandbox_counts_from_containerds_request_to_its_id_returned(self):
        import dra_summary
        lines = ['time="2026-12-06T07:23:19.617388242Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:p-0,Uid:79,Namespace:default,Attempt:0,}"',
                 'time="2026-12-06T07:23:19.618Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:p-1,Uid:06,Namespace:default,Attempt:0,}"',
                 'time="2026-12-06T07:23:20.288388Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:p-0,Uid:79,Namespace:default,Attempt:0,} returns sandbox id \\"f48f\\""']
        self.assertEqual([round(ms) for ms in dra_summary.sandbox_ms(lines)], [671])


class CniAdd(unittest.TestCase):
    def test_each_sandbox_counts_from_begin_to_its_result_and_nanoseconds_are_read(self):
        lines = ['time="2026-12-06T07:30:00.100000123Z" level=debug msg="begin cni setup" podsandboxid=ab',
                 'time="2026-12-06T07:30:00.350000999Z" level=debug msg="cni result: {}" podsandboxid=ab',
                 'time="2026-12-06T07:30:00.400000000Z" level=debug msg="cni result: {}" podsandboxid=cd']
        self.assertEqual([round(ms) for ms in benchtool.cni_add_ms(lines)], [250])


class TwoNodesSummary(unittest.TestCase):
    def test_two_nodes_make_one_run_spanning_both_with_every_operation_in_its_quantiles(self):
        import two_nodes_summary
        with tempfile.TemporaryDirectory() as d:
            runs = [{"count": 2, "clients": 1, "failed_attempts": 1, "addresses": ["a", "b"],
                     "add": {"start": 100.0, "end": 101.0, "ms": [10, 20]}},
                    {"count": 2, "clients": 1, "del": {"start": 102.0, "end": 103.0, "ms": [5, 5]}},
                    {"count": 2, "clients": 1, "failed_attempts": 0, "addresses": ["c", "a"],
                     "add": {"start": 100.5, "end": 102.0, "ms": [30, 400]}},
                    {"count": 2, "clients": 1, "del": {"start": 102.0, "end": 104.0, "ms": [5, 6]}}]
            paths = []
            for i, r in enumerate(runs):
                paths.append(os.path.join(d, f"{i}.json"))
                with open(paths[-1], "w") as f:
                    json.dump(r, f)
            got = two_nodes_summary.ipam(paths)
        self.assertEqual(got["add"], {"ops_per_s": 2.0, "p50_ms": 25.0, "p99_ms": 400})
        self.assertEqual(got["del"]["ops_per_s"], 2.0)
        self.assertEqual((got["count"], got["distinct"], got["failed_attempts"]), (4, 3, 1))
