//! plexusctl: the cnitool-compatible runner interoperating with the real cnitool on one network in
//! one namespace, `--create-netns`, IPAM list/release, STATUS and GC, and `doctor`.

use std::path::{Path, PathBuf};
use std::process::Command;

use plexus_tests::runner::enter_netns;
use plexus_tests::{DataDir, Lab, plugin_bin, test_policy, tool_bin};
use serde_json::{Value, json};

struct Ctl {
    lab: Lab,
    dir: tempfile::TempDir,
    ipam: DataDir,
    ipam2: DataDir,
}

fn bin_dir() -> PathBuf {
    plugin_bin("plexusctl").parent().unwrap().to_path_buf()
}

impl Ctl {
    fn new(version: &str) -> Ctl {
        let lab = Lab::new();
        lab.add_nic("nic0", 9000);
        let c =
            Ctl { lab, dir: tempfile::tempdir().unwrap(), ipam: DataDir::new("ipam"), ipam2: DataDir::new("ipam2") };
        std::fs::create_dir_all(c.netconf()).unwrap();
        let list = json!({"cniVersion": version, "name": "roce", "plugins": [
            {"type": "plexus-macvlan", "master": "nic0",
             "ipam": {"type": "plexus-ipam", "range": "198.18.80.0/24", "dataDir": c.ipam, "nodeName": "node-a"}}]});
        std::fs::write(c.netconf().join("20-roce.conflist"), list.to_string()).unwrap();
        c
    }

    fn netconf(&self) -> PathBuf {
        self.dir.path().join("net.d")
    }

    fn cmd(&self, program: &Path, args: &[&str]) -> (bool, String, String) {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("NETCONFPATH", self.netconf())
            .env("CNI_PATH", bin_dir())
            .env("CNI_IFNAME", "net1")
            .env("CNI_CACHE_DIR", self.dir.path().join("cnicache"))
            .env("PLEXUS_POLICY", test_policy());
        enter_netns(&mut cmd, &self.lab.node.path());
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ctl(&self, args: &[&str]) -> (bool, String, String) {
        self.cmd(&plugin_bin("plexusctl"), args)
    }

    fn cnitool(&self, args: &[&str]) -> (bool, String, String) {
        self.cmd(&tool_bin("cnitool"), args)
    }

    fn held(&self) -> usize {
        std::fs::read_dir(self.ipam.path().join("default/ips")).map(|d| d.count()).unwrap_or(0)
    }
}

#[test]
fn plexusctl_runs_the_admins_meta_plugin_network_as_a_runtime_does_and_its_delegates_as_delegates() {
    let c = Ctl::new("1.0.0");
    // The admin's meta config in the conf dir, its network a NAD from a file: plexusctl is the
    // runtime here (as the kubelet's is), so the meta-plugin is what it runs, not a delegate.
    let nads = c.dir.path().join("nads");
    std::fs::create_dir_all(&nads).unwrap();
    let rail = json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
        "ipam": {"type": "plexus-ipam", "range": "198.18.83.0/24", "dataDir": c.ipam2}});
    std::fs::write(
        nads.join("rail0.yaml"),
        format!("apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: rail0\nspec:\n  config: '{rail}'\n"),
    )
    .unwrap();
    let meta = json!({"cniVersion": "1.0.0", "name": "meta", "type": "plexus", "nadDir": nads, "networks": "rail0",
        "cniDir": c.dir.path().join("cache"), "binDir": bin_dir()});
    std::fs::write(c.netconf().join("00-meta.conf"), meta.to_string()).unwrap();
    let pod = c.lab.pod.path();
    let (ok, out, err) = c.ctl(&["add", "meta", pod.to_str().unwrap()]);
    assert!(ok, "plexusctl add: {out}{err}");
    assert_eq!(c.lab.pod.addrs("net1")[0].cidr(), "198.18.83.1/24");
    // A network naming the meta-plugin as its IPAM is still refused: its delegates are delegates.
    let nested = json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
        "ipam": {"type": "plexus", "binDir": "/tmp"}});
    std::fs::write(
        nads.join("nested.yaml"),
        format!("apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: nested\nspec:\n  config: '{nested}'\n"),
    )
    .unwrap();
    let mut evil = meta.clone();
    evil["name"] = json!("evil");
    evil["networks"] = json!("nested");
    std::fs::write(c.netconf().join("10-evil.conf"), evil.to_string()).unwrap();
    let other = c.lab.another_pod();
    let (ok, out, err) = c.ctl(&["add", "evil", other.path().to_str().unwrap()]);
    assert!(!ok && format!("{out}{err}").contains("plugin type \"plexus\" is a meta-plugin"), "{out}{err}");
    let (ok, out, err) = c.ctl(&["del", "meta", pod.to_str().unwrap()]);
    assert!(ok, "plexusctl del: {out}{err}");
    assert_eq!(c.lab.pod.links().len(), 1, "only lo");
}

#[test]
fn cnitool_and_plexusctl_finish_each_others_attachments() {
    let c = Ctl::new("1.0.0");
    let pod = c.lab.pod.path();
    let pod = pod.to_str().unwrap();
    // cnitool adds; plexusctl checks and deletes with cnitool's cached result.
    let (ok, out, err) = c.cnitool(&["add", "roce", pod]);
    assert!(ok, "cnitool add: {out}{err}");
    assert_eq!(c.lab.pod.addrs("net1")[0].cidr(), "198.18.80.1/24");
    let cache_files: Vec<String> = std::fs::read_dir(Path::new("/var/lib/cni/results"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("roce-cnitool-"))
        .collect();
    assert!(!cache_files.is_empty(), "cnitool 1.1.2 caches in /var/lib/cni/results");
    // cnitool (libcni 1.1.2) ignores CNI_CACHE_DIR: point plexusctl at the same cache.
    let (ok, out, err) = Ctl::with_cache(&c, "/var/lib/cni", &["check", "roce", pod]);
    assert!(ok, "plexusctl check of cnitool's attachment: {out}{err}");
    let (ok, out, err) = Ctl::with_cache(&c, "/var/lib/cni", &["del", "roce", pod]);
    assert!(ok, "plexusctl del of cnitool's attachment: {out}{err}");
    assert!(c.lab.pod.link("net1").is_none());
    assert_eq!(c.held(), 0);
    for f in &cache_files {
        assert!(!Path::new("/var/lib/cni/results").join(f).exists(), "plexusctl removed libcni's cache entry {f}");
    }
    // plexusctl adds; cnitool checks and deletes.
    let (ok, out, err) = Ctl::with_cache(&c, "/var/lib/cni", &["add", "roce", pod]);
    assert!(ok, "plexusctl add: {out}{err}");
    let result: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(result["interfaces"][0]["name"], "net1");
    assert!(err.contains("roce attached to"), "{err}");
    let (ok, out, err) = c.cnitool(&["check", "roce", pod]);
    assert!(ok, "cnitool check of plexusctl's attachment: {out}{err}");
    let (ok, out, err) = c.cnitool(&["del", "roce", pod]);
    assert!(ok, "cnitool del of plexusctl's attachment: {out}{err}");
    assert!(c.lab.pod.link("net1").is_none());
    assert_eq!(c.held(), 0);
}

impl Ctl {
    fn with_cache(c: &Ctl, cache: &str, args: &[&str]) -> (bool, String, String) {
        let mut cmd = Command::new(plugin_bin("plexusctl"));
        cmd.args(args)
            .env("NETCONFPATH", c.netconf())
            .env("CNI_PATH", bin_dir())
            .env("CNI_IFNAME", "net1")
            .env("CNI_CACHE_DIR", cache)
            .env("PLEXUS_POLICY", test_policy());
        enter_netns(&mut cmd, &c.lab.node.path());
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// The namespace `plexusctl --create-netns` makes, removed when the test ends, also when it fails
/// before plexusctl's DEL removed it.
struct ThrowAway(String);

impl Drop for ThrowAway {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

#[test]
fn create_netns_ipam_list_and_release_status_and_gc() {
    let c = Ctl::new("1.1.0");
    let guard = ThrowAway(format!("plxctl{}", std::process::id()));
    let name = guard.0.clone();
    let (ok, out, err) = c.ctl(&["add", "roce", &name, "--create-netns"]);
    assert!(ok, "{out}{err}");
    assert!(Path::new("/run/netns").join(&name).exists());
    let (ok, out, err) = c.ctl(&["ipam", "list", "roce"]);
    assert!(ok, "{err}");
    assert!(out.contains("198.18.80.1") && out.contains("node-a") && out.contains("net1"), "{out}");
    let (ok, out, _) = c.ctl(&["ipam", "list", "roce", "--json"]);
    assert!(ok);
    let list: Value = serde_json::from_str(&out).unwrap();
    let cid = list[0]["containerID"].as_str().unwrap().to_string();
    assert!(cid.starts_with("cnitool-"));
    let (ok, out, err) = c.ctl(&["status", "roce", &name]);
    assert!(ok, "STATUS: {out}{err}");
    let (ok, out, err) = c.ctl(&["gc", "roce", &name]);
    assert!(ok, "GC: {out}{err}");
    assert_eq!(c.held(), 1, "GC keeps what libcni's cache still holds");
    let (ok, out, _) = c.ctl(&["ipam", "release", "roce", &cid, "net1"]);
    assert!(ok);
    assert!(out.contains("released 198.18.80.1"), "{out}");
    assert_eq!(c.held(), 0);
    let (ok, out, err) = c.ctl(&["del", "roce", &name, "--create-netns"]);
    assert!(ok, "{out}{err}");
    assert!(!Path::new("/run/netns").join(&name).exists(), "the throw-away namespace is gone");
    let (ok, _, err) = c.ctl(&["add", "nope", &name]);
    assert!(!ok);
    assert!(err.contains("no net configuration with name \"nope\""), "{err}");
}

/// A fake sysfs where `nic0` is PCI function 0000:3b:00.1, with or without an RDMA device.
fn fake_sysfs(dir: &Path, rdma: bool) -> PathBuf {
    let root = dir.join("sys");
    let pf = root.join("devices/pci0000:3a/0000:3b:00.1");
    std::fs::create_dir_all(&pf).unwrap();
    if rdma {
        std::fs::create_dir_all(pf.join("infiniband/mlx5_1")).unwrap();
    }
    std::fs::create_dir_all(root.join("class/net/nic0")).unwrap();
    std::os::unix::fs::symlink(&pf, root.join("class/net/nic0/device")).unwrap();
    root
}

fn doctor(c: &Ctl, sysfs: &Path, args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new(plugin_bin("plexusctl"));
    cmd.arg("doctor").args(args).env("PLEXUS_SYSFS_ROOT", sysfs);
    enter_netns(&mut cmd, &c.lab.node.path());
    let out = cmd.output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn doctor_reports_a_missing_parent_a_wrong_mtu_and_a_missing_rdma_device() {
    let c = Ctl::new("1.0.0");
    let bin = bin_dir();
    let bin = bin.to_str().unwrap();
    let with_rdma = fake_sysfs(&c.dir.path().join("a"), true);
    let without = fake_sysfs(&c.dir.path().join("b"), false);
    let (ok, out) = doctor(&c, &with_rdma, &["--parent", "gone0", "--bin-dir", bin]);
    assert!(!ok);
    assert!(out.contains("FAIL parent interface gone0 not found"), "{out}");
    c.lab.node.ip(&["link", "set", "nic0", "mtu", "1500"]);
    let (ok, out) = doctor(&c, &with_rdma, &["--parent", "nic0", "--mtu", "9000", "--bin-dir", bin]);
    assert!(!ok);
    assert!(
        out.contains("FAIL nic0 has MTU 1500, the fabric needs 9000") && out.contains("fix: ip link set nic0 mtu 9000"),
        "{out}"
    );
    c.lab.node.ip(&["link", "set", "nic0", "mtu", "9000"]);
    let (ok, out) = doctor(&c, &without, &["--parent", "nic0", "--mtu", "9000", "--bin-dir", bin]);
    assert!(!ok);
    assert!(out.contains("FAIL nic0 has no RDMA device") && out.contains("modprobe mlx5_ib"), "{out}");
    // Ready (the RDMA netns mode is unknown on this kernel: a warning, not a failure).
    let conf = c.dir.path().join("00-plexus.conf");
    std::fs::write(
        &conf,
        json!({"cniVersion": "1.0.0", "name": "plexus", "type": "plexus", "networks": "rail0"}).to_string(),
    )
    .unwrap();
    let (ok, out) = doctor(
        &c,
        &with_rdma,
        &["--parent", "nic0", "--mtu", "9000", "--bin-dir", bin, "--conf", conf.to_str().unwrap()],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("OK   nic0 is PCI device 0000:3b:00.1") && out.contains("OK   nic0 has RDMA device mlx5_1"),
        "{out}"
    );
    assert!(out.contains("parses"), "{out}");
    // Missing binaries fail too.
    let (ok, out) = doctor(&c, &with_rdma, &["--bin-dir", c.dir.path().to_str().unwrap()]);
    assert!(!ok);
    assert!(out.contains("plexus-host-device is missing"), "{out}");
}

#[test]
fn roce_prints_each_pod_addresss_gid_indexes_by_netns_and_by_pod_and_doctor_checks_the_ports_table() {
    let c = Ctl::new("1.0.0");
    // A pod attached through plexus (NAD from a file, its cache naming the pod): net1 gets
    // 198.18.82.1 on a macvlan of nic0.
    let nads = c.dir.path().join("nads");
    std::fs::create_dir_all(&nads).unwrap();
    let nad_conf = json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
        "ipam": {"type": "plexus-ipam", "range": "198.18.82.0/24", "dataDir": c.ipam2}});
    std::fs::write(
        nads.join("rail0.yaml"),
        format!(
            "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {{name: rail0, namespace: default}}\nspec:\n  config: '{nad_conf}'\n"
        ),
    )
    .unwrap();
    let cni_dir = c.dir.path().join("plexus-cache");
    let meta = json!({"cniVersion": "1.0.0", "name": "plexus", "type": "plexus", "nadDir": nads,
        "networks": "rail0", "cniDir": cni_dir, "binDir": bin_dir()});
    let run = |verb: &str| {
        plexus_tests::PluginRun::new(plugin_bin("plexus"), verb)
            .attachment("ctr-roce", &c.lab.pod.path(), "eth0", bin_dir().to_str().unwrap())
            .env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=trainer-0")
            .stdin(&meta)
            .in_netns(&c.lab.node)
            .run()
    };
    let added = run("ADD");
    assert!(added.success(), "{}", added.stdout);
    assert_eq!(c.lab.pod.addrs("net1")[0].cidr(), "198.18.82.1/24");
    // The parent's RDMA device and its GID table: link-local entries, the node's own address on
    // nic0 (v2 only), a hole, the pod's address (v1 and v2).
    c.lab.node.ip(&["addr", "add", "198.18.83.5/24", "dev", "nic0"]);
    let sys = fake_sysfs(c.dir.path(), true);
    let port = sys.join("class/infiniband/mlx5_1/ports/1");
    plexus_tests::gid_slot(&port, 0, "fe80:0000:0000:0000:0a5c:2bff:fe11:2233", Some("IB/RoCE v1"), "net1");
    plexus_tests::gid_slot(&port, 1, "fe80:0000:0000:0000:0a5c:2bff:fe11:2233", Some("RoCE v2"), "net1");
    plexus_tests::gid_slot(&port, 2, "0000:0000:0000:0000:0000:ffff:c612:5305", Some("RoCE v2"), "net1");
    plexus_tests::gid_slot(&port, 4, "0000:0000:0000:0000:0000:ffff:c612:5201", Some("IB/RoCE v1"), "net1");
    plexus_tests::gid_slot(&port, 5, "0000:0000:0000:0000:0000:ffff:c612:5201", Some("RoCE v2"), "net1");
    let roce = |args: &[&str]| {
        let mut cmd = Command::new(plugin_bin("plexusctl"));
        cmd.arg("roce").args(args).env("PLEXUS_SYSFS_ROOT", &sys);
        enter_netns(&mut cmd, &c.lab.node.path());
        let out = cmd.output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let rows = |out: &str| -> Vec<Vec<String>> {
        out.lines().skip(1).map(|l| l.split_whitespace().map(str::to_string).collect()).collect()
    };
    let want = vec![
        vec!["mlx5_1", "1", "4", "0000:0000:0000:0000:0000:ffff:c612:5201", "198.18.82.1", "v1", "net1"],
        vec!["mlx5_1", "1", "5", "0000:0000:0000:0000:0000:ffff:c612:5201", "198.18.82.1", "v2", "net1"],
    ];
    let (ok, out) = roce(&[c.lab.pod.path().to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.starts_with("DEV"), "{out}");
    assert_eq!(rows(&out), want, "the pod's entries only (not the node's nor the link-local ones):\n{out}");
    let (ok, out) = roce(&["--pod", "default/trainer-0", "--cni-dir", cni_dir.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert_eq!(rows(&out), want, "{out}");
    let (ok, _) = roce(&["--pod", "default/nobody", "--cni-dir", cni_dir.to_str().unwrap()]);
    assert!(!ok, "an unknown pod is an error");
    // doctor: the port's table (entries per type) and a RoCE v2 GID for the port's address.
    let bin = bin_dir();
    let (ok, out) = doctor(&c, &sys, &["--parent", "nic0", "--bin-dir", bin.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("OK   mlx5_1 GID table: 3 RoCE v2 and 2 IB/RoCE v1 entries"), "{out}");
    assert!(out.contains("OK   nic0 address 198.18.83.5: RoCE v2 GID at mlx5_1 port 1 index 2"), "{out}");
    c.lab.node.ip(&["addr", "add", "198.18.84.5/24", "dev", "nic0"]);
    let (_, out) = doctor(&c, &sys, &["--parent", "nic0", "--bin-dir", bin.to_str().unwrap()]);
    assert!(out.contains("WARN nic0 address 198.18.84.5 has no RoCE v2 GID in mlx5_1's table"), "{out}");
    assert!(run("DEL").success());
}
