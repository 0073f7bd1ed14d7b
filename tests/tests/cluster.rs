//! plexus under a real kubelet: `scripts/cluster.sh up` brings a single-node Kubernetes (real
//! etcd, kube-apiserver, controller-manager, scheduler, containerd CRI, kubelet) into a network
//! namespace of its own, `scripts/cluster-install.sh` installs plexus from the image
//! `scripts/build-image.sh` builds, through the plain manifests (conf-examples/deploy: CRD,
//! ServiceAccount, least RBAC, ConfigMap, DaemonSet) or the Helm chart (deploy/helm/plexus), and
//! from then on kubelet → containerd → plexus sets up every pod's networks.
//!
//! Each test brings up a cluster of its own in a slot ([`plexus_tests::cluster`]).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use plexus_tests::cluster::{Cluster, Interrupt, repo, wait_until};
use serde_json::Value;

#[test]
fn kubelet_runs_a_pod_on_two_plexus_networks_and_a_missing_nad_fails_cleanly() {
    let c = Cluster::up("");
    c.apply(
        &(c.macvlan_nad("default", "rail0", "ens1f0np0", "198.18.240.0/24")
            + &c.hostdev_nad("default", "hostdev", "ens2f0np0", "198.18.241.0/24")),
    );
    c.apply(&c.pod("default", "trainer", "rail0,hostdev"));
    c.wait_ready("default", "pod/trainer", "90s");
    let addrs = c.pod_addrs("default", "trainer");
    assert_eq!(addrs, BTreeSet::from(["net1 198.18.240.1/24".into(), "net2 198.18.241.1/24".into()]));
    assert!(!c.node_link_up("ens2f0np0"), "the host device is in the pod");
    assert_eq!(c.reservations(), 2);
    // network-status, read back from the API server: plexus wrote it with the DaemonSet's
    // service account (the RBAC of conf-examples/deploy is enough).
    let status = c.network_status("default", "trainer");
    let names: Vec<&str> = status.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["bootstrap", "default/rail0", "default/hostdev"]);
    assert_eq!(status[1]["ips"][0], "198.18.240.1");
    assert_eq!(status[2]["ips"][0], "198.18.241.1");
    // The pod is told, as Multus tells it (events.k8s.io, the DaemonSet's RBAC): kubectl
    // describe shows an AddedInterface for each interface.
    for added in ["Add net1 [198.18.240.1/24] from default/rail0", "Add net2 [198.18.241.1/24] from default/hostdev"] {
        c.wait_event("default", "trainer", added);
    }
    let (_, described) = c.kubectl(&["-n", "default", "describe", "pod", "trainer"], None);
    assert!(described.contains("AddedInterface") && described.contains("plexus"), "{described}");
    // Deleting the pod: both addresses released, the device back with its host state.
    c.delete("default", &["pod", "trainer"]);
    wait_until("addresses released", Duration::from_secs(30), || c.reservations() == 0);
    wait_until("device back on the node", Duration::from_secs(30), || c.node_link_up("ens2f0np0"));
    // The cache file goes last, after every delegate's DEL: the kubelet's DEL may still be
    // finishing when the device is back.
    c.wait_no_state_or_cache();
    // A NAD that does not exist: the pod's events carry plexus's error, nothing leaks.
    c.apply(&c.pod("default", "orphan", "nosuch"));
    c.wait_event("default", "orphan", "cannot find a network-attachment-definition (nosuch) in namespace (default)");
    let (_, described) = c.kubectl(&["-n", "default", "describe", "pod", "orphan"], None);
    assert!(described.contains("FailedAddInterface"), "plexus's own warning:\n{described}");
    assert_eq!(c.reservations(), 0);
    c.delete("default", &["pod", "orphan"]);
    wait_until("no cache left", Duration::from_secs(30), || c.data_files("meta") == 0);
    // Uninstalled as README says for the plain manifests (the DaemonSet in the foreground, then
    // the rest): its pod removed plexus from the node on its way out; the cluster network stays.
    c.uninstall_leaving_nothing("manifests", false);
}

#[test]
fn with_helm_plexus_installs_upgrades_under_a_running_pod_and_uninstalls_leaving_nothing_on_the_node() {
    let c = Cluster::up_installed_with("", None, true, "helm");
    let (ok, out) =
        c.peer("helm", &["--kubeconfig", c.var("KUBECONFIG"), "-n", "kube-system", "status", "plexus"], None);
    assert!(ok && out.contains("STATUS: deployed"), "{out}");
    c.apply(
        &(c.macvlan_nad("default", "rail0", "ens1f0np0", "198.18.236.0/24") + &c.pod("default", "steady", "rail0")),
    );
    c.wait_ready("default", "pod/steady", "90s");
    let addrs = c.pod_addrs("default", "steady");
    assert_eq!(addrs, BTreeSet::from(["net1 198.18.236.1/24".to_string()]));
    let sandbox = c.sandbox("default", "steady");
    let adds = c.cni_adds();
    let daemon_pod = || {
        let (_, pods) =
            c.kubectl(&["-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=plexus", "-o", "name"], None);
        pods.trim().to_string()
    };
    let before = daemon_pod();
    // An upgrade that changes the pod template (the daemon's concurrency): the DaemonSet rolls its
    // pod; the old one ends with the DaemonSet still there, so plexus stays on the node throughout.
    let chart = repo().join("deploy/helm/plexus");
    let (ok, out) = c.peer(
        "helm",
        &[
            "--kubeconfig",
            c.var("KUBECONFIG"),
            "-n",
            "kube-system",
            "upgrade",
            "plexus",
            chart.to_str().unwrap(),
            "--reuse-values",
            "--set",
            "daemon.maxConcurrent=8",
            "--wait",
            "--timeout",
            "180s",
        ],
        None,
    );
    assert!(ok, "helm upgrade: {out}");
    wait_until("the DaemonSet's new pod ready", Duration::from_secs(120), || {
        let now = daemon_pod();
        !now.is_empty()
            && now != before
            && c.kubectl(&["-n", "kube-system", "rollout", "status", "daemonset/plexus", "--timeout=1s"], None).0
    });
    let (_, ds) = c.kubectl(&["-n", "kube-system", "get", "daemonset", "plexus", "-o", "json"], None);
    assert!(ds.contains("--max-concurrent=8"), "the upgrade's template");
    // The pod on the plexus network stayed up: same sandbox, same address, no CNI ADD since.
    assert_eq!(c.sandbox("default", "steady"), sandbox);
    assert_eq!(c.pod_addrs("default", "steady"), addrs);
    assert_eq!(c.cni_adds(), adds);
    // And a pod after the upgrade gets its network from the new daemon.
    c.apply(&c.pod("default", "after", "rail0"));
    c.wait_ready("default", "pod/after", "90s");
    assert_eq!(c.pod_addrs("default", "after"), BTreeSet::from(["net1 198.18.236.2/24".to_string()]));
    c.delete("default", &["pod", "steady", "after"]);
    wait_until("every address released", Duration::from_secs(60), || c.reservations() == 0);
    c.wait_no_state_or_cache();
    // helm uninstall: the chart's pre-delete hook deletes the DaemonSet in the foreground, its pod
    // removes plexus from the node; then the release's objects go.
    c.uninstall_leaving_nothing("helm", true);
    let (_, left) =
        c.kubectl(&["-n", "kube-system", "get", "all,configmap,serviceaccount,role,rolebinding", "-o", "name"], None);
    assert!(!left.contains("plexus"), "{left}");
}

#[test]
fn pods_keep_their_networks_across_kubelet_and_containerd_restarts_and_del_needs_no_api_server() {
    let c = Cluster::up("");
    c.apply(
        &(c.macvlan_nad("default", "rail0", "ens1f0np0", "198.18.240.0/24")
            + &c.hostdev_nad("default", "hostdev", "ens2f0np0", "198.18.241.0/24")),
    );
    c.apply(&c.pod("default", "steady", "rail0,hostdev"));
    c.wait_ready("default", "pod/steady", "90s");
    let sandbox = c.sandbox("default", "steady").expect("a ready sandbox");
    let addrs = c.pod_addrs("default", "steady");
    let status = c.network_status("default", "steady");
    let adds = c.cni_adds();
    assert_eq!(addrs.len(), 2, "{addrs:?}");

    // Restarts: the same sandbox keeps its interfaces, addresses, reservations and status; no
    // new CNI ADD, no container restart.
    for daemon in ["kubelet", "containerd"] {
        c.daemon("restart", daemon);
        c.wait_ready("default", "pod/steady", "90s");
        // The kubelet's first sync after a restart comes within seconds: give it time to act.
        std::thread::sleep(Duration::from_secs(15));
        assert_eq!(c.sandbox("default", "steady").as_deref(), Some(sandbox.as_str()), "after {daemon} restart");
        assert_eq!(c.pod_addrs("default", "steady"), addrs, "after {daemon} restart");
        assert_eq!(c.network_status("default", "steady"), status, "after {daemon} restart");
        assert_eq!(c.pod_json("default", "steady")["status"]["containerStatuses"][0]["restartCount"], 0);
        assert_eq!((c.cni_adds(), c.reservations()), (adds, 2), "after {daemon} restart");
        assert!(!c.node_link_up("ens2f0np0"), "the host device stays in the pod");
    }

    // The API server down while the sandbox is removed: DEL runs from plexus's cache and releases
    // everything; the kubelet's attempts to recreate the sandbox meanwhile fail without holding
    // anything (plexus cannot read the pod).
    c.daemon("stop", "kube-apiserver");
    let (ok, out) = c.crictl(&["stopp", &sandbox]);
    assert!(ok, "crictl stopp: {out}");
    let (ok, out) = c.crictl(&["rmp", &sandbox]);
    assert!(ok, "crictl rmp: {out}");
    assert_eq!(c.reservations(), 0, "addresses released with the API server down");
    wait_until("device back on the node", Duration::from_secs(10), || c.node_link_up("ens2f0np0"));
    assert_eq!((c.data_files("hd"), c.data_files("meta")), (0, 0), "no state or cache left");

    // API server back: the kubelet gives the pod a new sandbox with both networks again.
    c.daemon("start", "kube-apiserver");
    wait_until("a new sandbox", Duration::from_secs(180), || {
        c.sandbox("default", "steady").is_some_and(|s| s != sandbox) && c.reservations() == 2
    });
    c.wait_ready("default", "pod/steady", "120s");
    assert_eq!(c.pod_addrs("default", "steady").len(), 2);
    c.delete("default", &["pod", "steady"]);
    wait_until("addresses released", Duration::from_secs(30), || c.reservations() == 0);
    wait_until("device back on the node", Duration::from_secs(30), || c.node_link_up("ens2f0np0"));
    // The cache file goes last, after every delegate's DEL: the kubelet's DEL may still be
    // finishing when the device is back.
    c.wait_no_state_or_cache();
}

#[test]
fn an_eight_rail_pod_is_attached_in_parallel_and_network_status_keeps_annotation_order() {
    let c = Cluster::up("");
    let nads: String = (0..8)
        .map(|i| {
            c.macvlan_nad(
                "default",
                &format!("rail{i}"),
                &format!("ens{}f0np0", i + 1),
                &format!("198.19.{}.0/24", 240 + i),
            )
        })
        .collect();
    c.apply(&nads);
    let before = c.node_state();
    let selection: Vec<String> = (0..8).map(|i| format!("rail{i}")).collect();
    c.apply(&c.pod("default", "gpu-node", &selection.join(",")));
    c.wait_ready("default", "pod/gpu-node", "120s");
    // The eight ADDs ran at once (plexus's default); whatever order they finished in, the pod's
    // interfaces, addresses and network-status follow the annotation.
    let expected: BTreeSet<String> = (0..8).map(|i| format!("net{} 198.19.{}.1/24", i + 1, 240 + i)).collect();
    assert_eq!(c.pod_addrs("default", "gpu-node"), expected);
    let status = c.network_status("default", "gpu-node");
    assert_eq!(status.len(), 9, "the cluster network and eight rails: {status:?}");
    for (i, s) in status[1..].iter().enumerate() {
        assert_eq!(s["name"], format!("default/rail{i}"), "{status:?}");
        assert_eq!(s["interface"], format!("net{}", i + 1), "{status:?}");
        assert_eq!(s["ips"][0], format!("198.19.{}.1", 240 + i), "{status:?}");
    }
    assert_eq!((c.reservations(), c.data_files("meta")), (8, 1));
    c.delete("default", &["pod", "gpu-node"]);
    wait_until("every address released", Duration::from_secs(60), || c.reservations() == 0);
    c.wait_no_state_or_cache();
    assert_eq!(c.node_state(), before, "the node's links and addresses are as before");
}

#[test]
fn fifty_pods_on_two_networks_come_and_go_leaving_nothing_behind() {
    const PODS: usize = 50;
    let c = Cluster::up("");
    c.apply(
        &(c.macvlan_nad("default", "rail0", "ens1f0np0", "198.18.240.0/24")
            + &c.macvlan_nad("default", "rail1", "ens3f0np0", "198.18.242.0/24")),
    );
    let before = c.node_state();
    let pods: String = (0..PODS).map(|i| c.pod("default", &format!("churn-{i}"), "rail0,rail1")).collect();
    c.apply(&pods);
    let (ok, out) = c.kubectl(
        &["-n", "default", "wait", "--for=condition=Ready", "pod", "-l", "app=plexus-test", "--timeout=600s"],
        None,
    );
    assert!(ok, "not every pod became Ready: {out}");
    let mut seen = BTreeSet::new();
    for i in 0..PODS {
        let status = c.network_status("default", &format!("churn-{i}"));
        assert_eq!(status.len(), 3, "churn-{i}: {status:?}");
        for s in &status[1..] {
            assert!(seen.insert(s["ips"][0].as_str().unwrap().to_string()), "duplicate address: {s}");
        }
    }
    assert_eq!((seen.len(), c.reservations(), c.data_files("meta")), (2 * PODS, 2 * PODS, PODS));
    c.delete("default", &["pod", "-l", "app=plexus-test"]);
    wait_until("every address released", Duration::from_secs(120), || c.reservations() == 0);
    wait_until("every cache entry removed", Duration::from_secs(60), || c.data_files("meta") == 0);
    assert_eq!(c.node_state(), before, "the node's links and addresses are as before");
    // Sandboxes of deleted pods are stopped (CNI DEL) at once and removed later by the kubelet's GC.
    let (ok, out) = c.crictl(&["pods", "--namespace", "default", "--state", "ready", "-q"]);
    assert!(ok && out.lines().all(|l| l.starts_with("time=")), "sandboxes still running: {out}");
}

#[test]
fn namespace_isolation_and_the_policys_tenant_rules_hold_with_the_api_servers_objects() {
    let c = Cluster::up(r#""namespaceIsolation": true"#);
    // The admin's node policy: pods of tenant-a may put macvlans only on ens4f0np0.
    let policy = format!(
        r#"{{"dataRoots": ["{}"], "deviceInfoDir": "{}", "allow": {{"namespaces": {{"tenant-a": {{"parents": ["ens4f0np0"]}}}}}}}}"#,
        c.data().display(),
        c.state().join("devinfo").display()
    );
    std::fs::write(c.var("PLEXUS_POLICY"), policy).unwrap();
    for ns in ["tenant-a", "tenant-b"] {
        let (ok, out) = c.kubectl(&["create", "namespace", ns], None);
        assert!(ok, "{out}");
        wait_until(&format!("{ns}'s service account"), Duration::from_secs(60), || {
            c.kubectl(&["-n", ns, "get", "serviceaccount", "default"], None).0
        });
    }
    c.apply(
        &(c.macvlan_nad("tenant-a", "own", "ens4f0np0", "198.18.243.0/24")
            + &c.macvlan_nad("tenant-a", "elsewhere", "ens5f0np0", "198.18.244.0/24")
            + &c.macvlan_nad("tenant-b", "theirs", "ens6f0np0", "198.18.245.0/24")
            + &c.macvlan_nad("default", "shared", "ens1f0np0", "198.18.246.0/24")),
    );
    let before = c.node_state();
    c.apply(
        &(c.pod("tenant-a", "ok", "own")
            + &c.pod("tenant-b", "free", "theirs")
            + &c.pod("tenant-a", "crossns", "tenant-b/theirs")
            + &c.pod("tenant-a", "wrongport", "elsewhere")
            + &c.pod("tenant-a", "viadefault", "default/shared")),
    );
    // Allowed: a tenant's own NAD on its port; a namespace without rules.
    c.wait_ready("tenant-a", "pod/ok", "90s");
    c.wait_ready("tenant-b", "pod/free", "90s");
    assert_eq!(c.pod_addrs("tenant-a", "ok"), BTreeSet::from(["net1 198.18.243.1/24".to_string()]));
    assert_eq!(c.pod_addrs("tenant-b", "free"), BTreeSet::from(["net1 198.18.245.1/24".to_string()]));
    // Refused: another tenant's NAD (isolation), a port the policy does not give tenant-a, also
    // through a NAD of the global namespace.
    c.wait_event(
        "tenant-a",
        "crossns",
        "namespace isolation: pod tenant-a/crossns may not use network-attachment-definition tenant-b/theirs",
    );
    c.wait_event("tenant-a", "wrongport", r#"master "ens5f0np0" is not allowed by the node policy"#);
    c.wait_event("tenant-a", "viadefault", r#"master "ens1f0np0" is not allowed by the node policy"#);
    for refused in ["crossns", "wrongport", "viadefault"] {
        let phase = &c.pod_json("tenant-a", refused)["status"]["phase"];
        assert_eq!(phase, "Pending", "{refused}");
    }
    // Nothing held for the refused pods: the two running pods' addresses and cache entries only,
    // and no macvlan left on the node.
    assert_eq!((c.reservations(), c.data_files("meta")), (2, 2));
    assert_eq!(c.node_state(), before);
    c.delete("tenant-a", &["pod", "--all"]);
    c.delete("tenant-b", &["pod", "--all"]);
    wait_until("every address released", Duration::from_secs(60), || c.reservations() == 0);
    wait_until("every cache entry removed", Duration::from_secs(60), || c.data_files("meta") == 0);
}

#[test]
fn a_pod_learns_its_roce_v2_gid_index_from_network_status_through_the_downward_api() {
    // This kernel has no RDMA: the plugins read a fake sysfs in which ens3f0np0 is a ConnectX
    // port (PCI 0000:3b:00.0, RDMA device mlx5_0) whose GID table lists the pod's address
    // (198.18.247.1, the range's first) after its link-local entries and two empty slots.
    let sys = tempfile::tempdir().unwrap();
    let pf = sys.path().join("devices/pci0000:3a/0000:3b:00.0");
    std::fs::create_dir_all(pf.join("infiniband/mlx5_0")).unwrap();
    std::fs::create_dir_all(sys.path().join("class/net/ens3f0np0")).unwrap();
    std::os::unix::fs::symlink(&pf, sys.path().join("class/net/ens3f0np0/device")).unwrap();
    let port = sys.path().join("class/infiniband/mlx5_0/ports/1");
    let slot = |i: u32, gid: &str, kind: Option<&str>| plexus_tests::gid_slot(&port, i, gid, kind, "net1");
    slot(0, "fe80:0000:0000:0000:0a5c:2bff:fe11:2233", Some("IB/RoCE v1"));
    slot(1, "fe80:0000:0000:0000:0a5c:2bff:fe11:2233", Some("RoCE v2"));
    slot(2, "0000:0000:0000:0000:0000:0000:0000:0000", None);
    slot(3, "0000:0000:0000:0000:0000:0000:0000:0000", None);
    slot(4, "0000:0000:0000:0000:0000:ffff:c612:f701", Some("IB/RoCE v1"));
    slot(5, "0000:0000:0000:0000:0000:ffff:c612:f701", Some("RoCE v2"));
    let c = Cluster::up_with("", Some(sys.path()), false);
    // The documented example (conf-examples/nccl-gid-index), with this node's data dir and image.
    let example = repo().join("conf-examples/nccl-gid-index");
    let nad = std::fs::read_to_string(example.join("rail0.yaml")).unwrap().replace(
        r#""range": "198.18.247.0/24"}"#,
        &format!(r#""range": "198.18.247.0/24", "dataDir": "{}/ipam"}}"#, c.data().display()),
    );
    let pod = std::fs::read_to_string(example.join("pod.yaml"))
        .unwrap()
        .replace("image: busybox:1.36", &format!("image: {}\n    imagePullPolicy: Never", c.var("TEST_IMAGE")));
    c.apply(&nad);
    c.apply(&pod);
    c.wait_ready("default", "pod/nccl-worker", "90s");
    let status = c.network_status("default", "nccl-worker");
    assert_eq!(
        status[1]["device-info"]["pci"]["roce-gids"],
        serde_json::json!([
            {"port": 1, "index": 4, "gid": "0000:0000:0000:0000:0000:ffff:c612:f701", "type": "IB/RoCE v1"},
            {"port": 1, "index": 5, "gid": "0000:0000:0000:0000:0000:ffff:c612:f701", "type": "RoCE v2"}
        ]),
        "{status:?}"
    );
    wait_until("the pod's NCCL_IB_GID_INDEX", Duration::from_secs(120), || {
        c.kubectl(&["logs", "nccl-worker"], None).1.contains("NCCL_IB_GID_INDEX=5")
    });
    c.delete("default", &["pod", "nccl-worker"]);
    wait_until("address released", Duration::from_secs(30), || c.reservations() == 0);
    c.wait_no_state_or_cache();
    assert_eq!(std::fs::read_dir(c.state().join("devinfo")).map(|d| d.count()).unwrap_or(0), 0, "device-info removed");
}

/// The test device plugin (tests/peers/deviceplugin), registered with the cluster's kubelet;
/// stopped on drop.
struct DevicePlugin(std::process::Child);

impl DevicePlugin {
    fn start(c: &Cluster, resource: &str, devices: &str) -> DevicePlugin {
        let dir = c.state().join("kubelet/device-plugins");
        let log = std::fs::File::create(c.state().join("log/device-plugin.log")).unwrap();
        let child = Command::new(Path::new(c.var("PEERS_BIN")).join("plexus-test-device-plugin"))
            .args(["-dir", dir.to_str().unwrap(), "-resource", resource, "-devices", devices])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        DevicePlugin(child)
    }
}

impl Drop for DevicePlugin {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), nix::sys::signal::SIGTERM);
        let _ = self.0.wait();
    }
}

#[test]
fn resource_nads_get_the_kubelets_devices_through_the_pod_resources_api_by_get_and_by_list() {
    // Two "ConnectX VFs" for the device plugin to advertise: PCI 0000:3b:00.2 is the node's
    // ens2f0np0, 0000:3b:00.3 its ens5f0np0 (a fake sysfs: no PCI NICs in this kernel).
    let sys = tempfile::tempdir().unwrap();
    for (pci, netdev) in [("0000:3b:00.2", "ens2f0np0"), ("0000:3b:00.3", "ens5f0np0")] {
        let dev = sys.path().join("devices/pci0000:3a").join(pci);
        std::fs::create_dir_all(dev.join("net").join(netdev)).unwrap();
        std::fs::create_dir_all(sys.path().join("bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(&dev, sys.path().join("bus/pci/devices").join(pci)).unwrap();
        std::fs::create_dir_all(sys.path().join("class/net").join(netdev)).unwrap();
        std::os::unix::fs::symlink(&dev, sys.path().join("class/net").join(netdev).join("device")).unwrap();
    }
    // plexus's meta config points at no checkpoint: the devices can only come from the
    // pod-resources API.
    let c =
        Cluster::up_with(r#""kubeletCheckpoint": "/nonexistent/kubelet_internal_checkpoint""#, Some(sys.path()), false);
    let plugin = DevicePlugin::start(&c, "example.com/roce", "0000:3b:00.2,0000:3b:00.3");
    let allocatable = |n: &str| {
        let (_, out) = c.kubectl(
            &["get", "node", c.var("NODE_NAME"), "-o", r#"jsonpath={.status.allocatable.example\.com/roce}"#],
            None,
        );
        out.trim() == n
    };
    wait_until("the node advertising example.com/roce", Duration::from_secs(60), || allocatable("2"));
    let data = c.data();
    let nad = format!(
        r#"apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: vf-pool
  namespace: default
  annotations: {{k8s.v1.cni.cncf.io/resourceName: example.com/roce}}
spec:
  config: '{{"cniVersion": "1.0.0", "type": "plexus-host-device", "dataDir": "{d}/hd", "ipam": {{"type": "plexus-ipam", "range": "198.18.248.0/24", "dataDir": "{d}/ipam"}}}}'
"#,
        d = data.display()
    );
    c.apply(&nad);
    let pod = |name: &str| {
        c.pod("default", name, "vf-pool").replace(
            "command: [\"/bin/sh\", \"-c\", \"sleep 3600\"]}",
            "command: [\"/bin/sh\", \"-c\", \"sleep 3600\"], resources: {limits: {example.com/roce: 1}}}",
        )
    };
    let plexus_log = || std::fs::read_to_string(c.state().join("log/plexus.log")).unwrap_or_default();
    let device_of = |name: &str| -> String {
        let status = c.network_status("default", name);
        status[1]["device-info"]["pci"]["pci-address"].as_str().unwrap_or_else(|| panic!("{status:?}")).to_string()
    };
    // Get (beta, on by default in 1.34).
    c.apply(&pod("vf-a"));
    c.wait_ready("default", "pod/vf-a", "90s");
    let first = device_of("vf-a");
    assert!(["0000:3b:00.2", "0000:3b:00.3"].contains(&first.as_str()), "{first}");
    assert_eq!(c.pod_addrs("default", "vf-a"), BTreeSet::from(["net1 198.18.248.1/24".to_string()]));
    assert!(plexus_log().contains("source=Get"), "plexus did not use pod-resources Get:\n{}", plexus_log());
    // List: the kubelet restarted with Get disabled (the device plugin registers again).
    drop(plugin);
    std::fs::write(c.state().join("kubelet-flags"), "--feature-gates=KubeletPodResourcesGet=false\n").unwrap();
    c.daemon("restart", "kubelet");
    let _plugin = DevicePlugin::start(&c, "example.com/roce", "0000:3b:00.2,0000:3b:00.3");
    wait_until("the node advertising example.com/roce again", Duration::from_secs(60), || allocatable("2"));
    c.apply(&pod("vf-b"));
    c.wait_ready("default", "pod/vf-b", "90s");
    let second = device_of("vf-b");
    assert!(["0000:3b:00.2", "0000:3b:00.3"].contains(&second.as_str()) && second != first, "{first} {second}");
    assert!(plexus_log().contains("source=List"), "plexus did not fall back to List:\n{}", plexus_log());
    // Deleting both returns both devices.
    c.delete("default", &["pod", "vf-a", "vf-b"]);
    wait_until("devices back on the node", Duration::from_secs(60), || {
        c.node_link_up("ens2f0np0") && c.node_link_up("ens5f0np0")
    });
    wait_until("addresses released", Duration::from_secs(30), || c.reservations() == 0);
}

/// One run of an IPAM plugin in the node's namespace, as a runtime would run it for pod `pod`.
fn ipam_run(c: &Cluster, bin: &Path, verb: &str, cid: &str, pod: &str, conf: &Value) -> (bool, Value) {
    c.ipam_run_on(1, bin, verb, cid, pod, conf, Interrupt::Fault(""))
}

/// `n` ADDs (attachment `i` by `tool(i)`: its binary, config and container-ID prefix) by
/// `clients` concurrent clients; each attachment's address (without its prefix length). A failed
/// whereabouts ADD (its Lease under contention: it gives up waiting) is DELeted and tried again,
/// as the kubelet does, at most 10 times; plexus-ipam must never need that.
fn concurrent_adds<'a>(
    c: &Cluster,
    clients: usize,
    n: usize,
    tool: &(dyn Fn(usize) -> (&'a Path, &'a Value, &'static str) + Sync),
) -> Vec<(usize, String)> {
    std::thread::scope(|s| {
        let clients: Vec<_> = (0..clients)
            .map(|client| {
                s.spawn(move || {
                    (client..n)
                        .step_by(clients)
                        .map(|i| {
                            let (bin, conf, who) = tool(i);
                            let (cid, pod) = (format!("{who}-c{i}"), format!("pod-{i}"));
                            let mut attempt = 0;
                            let r = loop {
                                let (ok, r) = ipam_run(c, bin, "ADD", &cid, &pod, conf);
                                if ok {
                                    break r;
                                }
                                assert!(who == "wb" && attempt < 10, "{who} ADD {i}: {r}");
                                eprintln!("whereabouts ADD {i} failed, retried: {r}");
                                assert!(ipam_run(c, bin, "DEL", &cid, &pod, conf).0);
                                attempt += 1;
                            };
                            (i, r["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        clients.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn plexus_ipam_and_whereabouts_share_one_pool_on_the_api_server_without_duplicates() {
    use serde_json::json;
    let c = Cluster::up("");
    c.use_kubernetes_ipam_store();
    let flat = c.whereabouts_flat_conf();
    let wb_conf = json!({"cniVersion": "1.0.0", "name": "shared",
        "ipam": {"type": "whereabouts", "range": "198.18.160.0/23", "configuration_path": flat}});
    let px_conf = json!({"cniVersion": "1.0.0", "name": "shared",
        "ipam": {"type": "plexus-ipam", "range": "198.18.160.0/23", "store": "kubernetes"}});
    let wb = Path::new(c.var("PEERS_BIN")).join("whereabouts");
    let px = plexus_tests::plugin_bin("plexus-ipam");
    let tool = |i: usize| -> (&Path, &Value, &'static str) {
        if i % 32 < 16 { (&wb, &wb_conf, "wb") } else { (&px, &px_conf, "px") }
    };

    // 500 addresses, 16 clients of each allocator at once.
    const N: usize = 500;
    let results = concurrent_adds(&c, 32, N, &tool);
    let distinct: BTreeSet<&String> = results.iter().map(|(_, ip)| ip).collect();
    assert_eq!(distinct.len(), N, "every address handed out once");
    // Every address is accounted for in whereabouts' own objects, under the container that got it.
    let pool = || -> Value {
        let (ok, out) = c.kubectl(
            &["-n", "kube-system", "get", "ippools.whereabouts.cni.cncf.io", "198.18.160.0-23", "-o", "json"],
            None,
        );
        assert!(ok, "{out}");
        serde_json::from_str(&out).unwrap()
    };
    let reservations = || {
        let (ok, out) = c.kubectl(
            &["-n", "kube-system", "get", "overlappingrangeipreservations.whereabouts.cni.cncf.io", "-o", "name"],
            None,
        );
        assert!(ok, "{out}");
        out.lines().filter(|l| !l.is_empty()).count()
    };
    let p = pool();
    let allocations = p["spec"]["allocations"].as_object().unwrap();
    assert_eq!(allocations.len(), N);
    for (i, ip) in &results {
        let offset =
            u32::from(ip.parse::<std::net::Ipv4Addr>().unwrap()) - u32::from(std::net::Ipv4Addr::new(198, 18, 160, 0));
        let who = tool(*i).2;
        assert_eq!(allocations[&offset.to_string()]["id"], format!("{who}-c{i}"), "{ip}");
        assert_eq!(allocations[&offset.to_string()]["podref"], format!("default/pod-{i}"));
    }
    assert_eq!(reservations(), N, "one OverlappingRangeIPReservation per address");

    // A pod whose NAD moved from whereabouts to plexus-ipam keeps its address in its new sandbox
    // (idempotent per pod and interface), and the entry now names the new container.
    let (i0, ip0) = results.iter().find(|(i, _)| tool(*i).2 == "wb").unwrap().clone();
    let (ok, r) = ipam_run(&c, &px, "ADD", "px-new-sandbox", &format!("pod-{i0}"), &px_conf);
    assert!(ok, "{r}");
    assert_eq!(r["ips"][0]["address"], format!("{ip0}/23"));
    let offset0 = (u32::from(ip0.parse::<std::net::Ipv4Addr>().unwrap())
        - u32::from(std::net::Ipv4Addr::new(198, 18, 160, 0)))
    .to_string();
    assert_eq!(pool()["spec"]["allocations"][&offset0]["id"], "px-new-sandbox");
    // plexus's writes leave the pool without the field set that listed every entry again.
    let (ok, out) = c.kubectl(
        &[
            "-n",
            "kube-system",
            "get",
            "ippools.whereabouts.cni.cncf.io",
            "198.18.160.0-23",
            "--show-managed-fields",
            "-o",
            "json",
        ],
        None,
    );
    assert!(ok, "{out}");
    let managed = serde_json::from_str::<Value>(&out).unwrap()["metadata"]["managedFields"].clone();
    assert!(managed.is_null(), "managedFields after a plexus write: {managed}");
    // Released across allocators: plexus-ipam frees that address, whereabouts frees one of plexus's.
    assert!(ipam_run(&c, &px, "DEL", "px-new-sandbox", &format!("pod-{i0}"), &px_conf).0);
    let (i1, ip1) = results.iter().find(|(i, _)| tool(*i).2 == "px").unwrap().clone();
    assert!(ipam_run(&c, &wb, "DEL", &format!("px-c{i1}"), &format!("pod-{i1}"), &wb_conf).0);
    let offset1 = (u32::from(ip1.parse::<std::net::Ipv4Addr>().unwrap())
        - u32::from(std::net::Ipv4Addr::new(198, 18, 160, 0)))
    .to_string();
    let p = pool();
    assert!(p["spec"]["allocations"].get(&offset0).is_none() && p["spec"]["allocations"].get(&offset1).is_none());
    assert_eq!(reservations(), N - 2, "both reservations went with their addresses");

    // API server down: ADD fails with code 11 within its deadline; back up: consistent again.
    c.daemon("stop", "kube-apiserver");
    let started = Instant::now();
    let (ok, r) = ipam_run(&c, &px, "ADD", "px-down", "pod-down", &px_conf);
    assert!(!ok && r["code"] == 11, "{r}");
    assert!(started.elapsed() < Duration::from_secs(45), "{:?}", started.elapsed());
    c.daemon("start", "kube-apiserver");
    let (ok, r) = ipam_run(&c, &px, "ADD", "px-up", "pod-up", &px_conf);
    assert!(ok, "{r}");
    assert!(ipam_run(&c, &px, "DEL", "px-up", "pod-up", &px_conf).0);

    // Everything released, each address by the allocator that did not take it: nothing is left.
    std::thread::scope(|s| {
        for client in 0..16 {
            let (c, results, tool, px, px_conf, wb, wb_conf) = (&c, &results, &tool, &px, &px_conf, &wb, &wb_conf);
            s.spawn(move || {
                for (i, _) in results.iter().skip(client).step_by(16) {
                    let who = tool(*i).2;
                    let (bin, conf) = if who == "wb" { (px, px_conf) } else { (wb, wb_conf) };
                    let (ok, r) = ipam_run(c, bin, "DEL", &format!("{who}-c{i}"), &format!("pod-{i}"), conf);
                    assert!(ok, "DEL {i}: {r}");
                }
            });
        }
    });
    // whereabouts' DEL returns success whatever happened (cmdDel discards IPManagement's error):
    // under this contention it can keep an address. plexus-ipam's DELs must have left nothing;
    // what whereabouts kept is freed by plexus-ipam, which must then leave nothing either.
    let left: Vec<String> = pool()["spec"]["allocations"]
        .as_object()
        .map(|a| a.values().map(|v| v["id"].as_str().unwrap_or_default().to_string()).collect())
        .unwrap_or_default();
    assert!(left.iter().all(|id| id.starts_with("px-c")), "plexus-ipam DEL left entries behind: {left:?}");
    if !left.is_empty() {
        eprintln!("whereabouts DEL succeeded but kept {left:?}: released by plexus-ipam");
    }
    for id in &left {
        let i = id.trim_start_matches("px-c");
        assert!(ipam_run(&c, &px, "DEL", id, &format!("pod-{i}"), &px_conf).0);
    }
    assert_eq!(pool()["spec"]["allocations"].as_object().map(|a| a.len()).unwrap_or(0), 0);
    assert_eq!(reservations(), 0);
}

#[test]
fn plexus_ipam_on_the_api_server_survives_its_restart_and_kills_in_a_1000_pod_churn() {
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    const PODS: usize = 1000;
    const CLIENTS: usize = 16;
    const LIVE: usize = 8;
    let c = Cluster::up("");
    c.use_kubernetes_ipam_store();
    let conf = json!({"cniVersion": "1.0.0", "name": "churn",
        "ipam": {"type": "plexus-ipam", "range": "198.18.164.0/22", "store": "kubernetes"}});
    let px = plexus_tests::plugin_bin("plexus-ipam");
    // The store's deadline is 30 s; each API call has 10 s more at most.
    let bound = Duration::from_secs(45);
    let live = Mutex::new(BTreeSet::<String>::new());
    let (adds, unavailable, killed) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
    // One run as the kubelet's runtime makes it: a kill (injected at an API call, or the
    // runtime's SIGKILL after a while) leaves no output; anything else that fails must be code
    // 11, inside the deadline.
    let call_as = |verb: &str, cid: &str, pod: &str, how: Interrupt| {
        let t = Instant::now();
        let interrupted = !matches!(how, Interrupt::Fault(""));
        let (ok, r) = c.ipam_run_on(1, &px, verb, cid, pod, &conf, how);
        assert!(t.elapsed() < bound, "{verb} {cid} took {:?}", t.elapsed());
        if !ok {
            if interrupted && r.get("code").is_none() {
                killed.fetch_add(1, SeqCst);
            } else {
                assert_eq!(r["code"], 11, "{verb} {cid}: only an unavailable API may fail it: {r}");
                unavailable.fetch_add(1, SeqCst);
            }
        }
        (ok, r)
    };
    let call = |verb: &str, cid: &str, pod: &str, fault: &str| call_as(verb, cid, pod, Interrupt::Fault(fault));
    std::thread::scope(|s| {
        s.spawn(|| {
            while adds.load(SeqCst) < 400 {
                std::thread::sleep(Duration::from_millis(50));
            }
            c.daemon("stop", "kube-apiserver");
            std::thread::sleep(Duration::from_secs(5));
            c.daemon("start", "kube-apiserver");
        });
        for client in 0..CLIENTS {
            let (call, call_as, live, adds) = (&call, &call_as, &live, &adds);
            s.spawn(move || {
                let del = |i: usize, cid: &str, ip: &str| {
                    live.lock().unwrap().remove(ip);
                    // Every 11th pod's first DEL is killed at one of its API calls.
                    let mut fault = if i.is_multiple_of(11) {
                        format!("plexus-ipam:{}:kill", 1 + (i / 11) % 3)
                    } else {
                        String::new()
                    };
                    while !call("DEL", cid, &format!("pod-{i}"), &fault).0 {
                        fault.clear();
                        std::thread::sleep(Duration::from_millis(500));
                    }
                };
                let mut mine = std::collections::VecDeque::new();
                for i in (client..PODS).step_by(CLIENTS) {
                    let (cid, pod) = (format!("churn-c{i}"), format!("pod-{i}"));
                    // Every 7th pod's first ADD is killed at one of its API calls.
                    let mut fault = if i.is_multiple_of(7) {
                        format!("plexus-ipam:{}:kill", 1 + (i / 7) % 4)
                    } else {
                        String::new()
                    };
                    // Every 13th other pod's first ADD is killed by the runtime 1-40 ms in,
                    // wherever it is: waiting for the node's turn with its request in the spool,
                    // serving the others' requests, or creating its reservation.
                    let mut kill = (!i.is_multiple_of(7) && i.is_multiple_of(13))
                        .then(|| Duration::from_millis(1 + (i as u64 * 7) % 40));
                    let ip = loop {
                        let (ok, r) = match kill.take() {
                            Some(after) => call_as("ADD", &cid, &pod, Interrupt::KillAfter(after)),
                            None => call("ADD", &cid, &pod, &fault),
                        };
                        if ok {
                            break r["ips"][0]["address"].as_str().unwrap().to_string();
                        }
                        fault.clear();
                        while !call("DEL", &cid, &pod, "").0 {
                            std::thread::sleep(Duration::from_millis(500));
                        }
                    };
                    assert!(live.lock().unwrap().insert(ip.clone()), "{ip} handed out twice ({cid})");
                    adds.fetch_add(1, SeqCst);
                    mine.push_back((i, cid, ip));
                    if mine.len() > LIVE {
                        let (i, cid, ip) = mine.pop_front().unwrap();
                        del(i, &cid, &ip);
                    }
                }
                for (i, cid, ip) in mine {
                    del(i, &cid, &ip);
                }
            });
        }
    });
    let (unavailable, killed) = (unavailable.load(SeqCst), killed.load(SeqCst));
    eprintln!("1000-pod churn: {unavailable} calls failed with code 11 (API server down), {killed} killed mid-call");
    assert!(unavailable > 0, "the outage hit no call: the test did not test it");
    assert!(killed > 0, "no call was killed: the test did not test it");
    let (ok, out) = c.kubectl(
        &["-n", "kube-system", "get", "ippools.whereabouts.cni.cncf.io", "198.18.164.0-22", "-o", "json"],
        None,
    );
    assert!(ok, "{out}");
    let pool: Value = serde_json::from_str(&out).unwrap();
    let left = pool["spec"]["allocations"].as_object().map(|a| a.len()).unwrap_or(0);
    assert_eq!(left, 0, "allocations leaked: {}", pool["spec"]["allocations"]);
    let (ok, out) = c.kubectl(
        &["-n", "kube-system", "get", "overlappingrangeipreservations.whereabouts.cni.cncf.io", "-o", "name"],
        None,
    );
    assert!(ok, "{out}");
    assert_eq!(out.lines().filter(|l| !l.is_empty()).count(), 0, "reservations leaked: {out}");
}

#[test]
fn on_the_api_server_a_tenants_range_lock_or_pool_never_holds_up_another_pod() {
    use serde_json::json;
    let c = Cluster::up("");
    c.use_kubernetes_ipam_store();
    let set_limits = |limits: Value| {
        let mut policy: Value =
            serde_json::from_str(&std::fs::read_to_string(c.var("PLEXUS_POLICY")).unwrap()).unwrap();
        policy["limits"] = limits;
        std::fs::write(c.var("PLEXUS_POLICY"), policy.to_string()).unwrap();
    };
    // A short request deadline: a wedged lock shows its bound quickly.
    set_limits(json!({"requestTimeoutSeconds": 15}));
    let net = |ipam: Value| {
        let mut ipam = ipam;
        ipam["type"] = json!("plexus-ipam");
        ipam["store"] = json!("kubernetes");
        json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "ens1f0np0", "ipam": ipam}).to_string()
    };
    // The node's own address on the rail, the first of the pool "fine" draws from: never a pod's.
    c.node_ip(&["addr", "add", "198.18.177.1/24", "dev", "ens1f0np0"]);
    // A range whose every usable offset lies above 2^63 (whereabouts' int64): refused at once,
    // while a pod beside it on another pool starts.
    c.apply(
        &(c.nad(
            "default",
            "hostile",
            &net(json!({"range": "2001:db8:177::/64", "range_start": "2001:db8:177:0:8000::"})),
        ) + &c.nad("default", "fine", &net(json!({"range": "198.18.177.0/24"})))
            + &c.pod("default", "hostile", "hostile")
            + &c.pod("default", "fine", "fine")),
    );
    c.wait_event("default", "hostile", "the kubernetes store holds offsets below 2^63 only");
    c.wait_ready("default", "pod/fine", "90s");
    assert!(c.whereabouts_object("ippools", "2001-db8-177---64").is_none(), "no pool for it");
    // The node's turn held by a wedged writer: a pod's ADD gives way at its deadline (code 11),
    // and starts once the turn is free (the kubelet's retry).
    // (Every turn file the node has: one of them is the pool's.)
    let turns: Vec<std::fs::File> = std::fs::read_dir(c.data().join(".plexus-ipam-kubernetes.spool"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("turn-")))
        .map(|p| std::fs::File::open(p).unwrap())
        .collect();
    assert!(!turns.is_empty(), "the pool's writes took turns");
    for t in &turns {
        t.lock().unwrap();
    }
    c.apply(&c.pod("default", "waits", "fine"));
    c.wait_event("default", "waits", "nothing committed in range 198.18.177.0/24 by this request's deadline");
    assert_eq!(c.pod_json("default", "waits")["status"]["phase"], "Pending");
    drop(turns);
    c.wait_ready("default", "pod/waits", "180s");
    // Pools: once the namespace holds the policy's cap, a node creates no more.
    let (ok, pools) = c.kubectl(&["-n", "kube-system", "get", "ippools.whereabouts.cni.cncf.io", "-o", "name"], None);
    assert!(ok, "{pools}");
    let held = pools.lines().filter(|l| !l.is_empty()).count();
    set_limits(json!({"requestTimeoutSeconds": 15, "kubernetesPools": held}));
    c.apply(
        &(c.nad("default", "newpool", &net(json!({"range": "198.18.178.0/24"})))
            + &c.pod("default", "newpool", "newpool")),
    );
    c.wait_event("default", "newpool", &format!("the node policy allows at most {held} (limits.kubernetesPools)"));
    assert!(c.whereabouts_object("ippools", "198.18.178.0-24").is_none(), "not created");
    // An address another namespace's pod holds is never named to a tenant.
    let taken = c.pool_entries("198.18.177.0-24").into_iter().find(|(_, e)| e["podref"] == "default/fine");
    let (offset, _) = taken.expect("default/fine's entry");
    assert_ne!(offset, "1", "the node's own address");
    let ip = format!("198.18.177.{offset}");
    let conf = json!({"cniVersion": "1.0.0", "name": "fine", "runtimeConfig": {"ips": [format!("{ip}/24")]},
        "ipam": {"type": "plexus-ipam", "range": "198.18.177.0/24", "store": "kubernetes"}});
    let px = plexus_tests::plugin_bin("plexus-ipam");
    let (ok, err) = ipam_run(&c, &px, "ADD", "thief", "tenant-b/thief", &conf);
    assert!(!ok);
    assert_eq!(err["code"], 111, "{err}");
    assert_eq!(err["msg"], format!("requested address {ip} is already allocated to a pod of another namespace"));
    let (ok, mine) = ipam_run(&c, &px, "ADD", "mine", "default/mine", &conf);
    assert!(!ok && mine["msg"].as_str().unwrap().ends_with("allocated to default/fine"), "{mine}");
    let mut nodes = conf.clone();
    nodes["runtimeConfig"]["ips"] = json!(["198.18.177.1/24"]);
    let (ok, err) = ipam_run(&c, &px, "ADD", "mine", "default/mine", &nodes);
    assert!(
        !ok && err["msg"] == "requested address 198.18.177.1 is already allocated to this node (ens1f0np0)",
        "{err}"
    );
    c.delete("default", &["pod", "--all"]);
    wait_until("every address released", Duration::from_secs(60), || c.pool_entries("198.18.177.0-24").is_empty());
}

#[test]
fn dual_stack_pods_on_the_api_store_keep_their_addresses_through_whereabouts_reconciler_and_plexusctl_lists_and_releases()
 {
    use serde_json::json;
    let c = Cluster::up("");
    c.use_kubernetes_ipam_store();
    let ipam = json!({"type": "plexus-ipam", "store": "kubernetes",
        "ipRanges": [{"range": "198.18.172.0/24"}, {"range": "2001:db8:172::/64"}]});
    let net = json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "ens1f0np0", "ipam": ipam});
    c.apply(&c.nad("default", "rail-api", &net.to_string()));
    c.apply(&c.pod("default", "keeper", "rail-api"));
    c.wait_ready("default", "pod/keeper", "90s");
    // The meta-plugin's network-status lists both addresses, as whereabouts' reconciler reads them.
    let status = c.network_status("default", "keeper");
    assert_eq!(status[1]["name"], "default/rail-api");
    assert_eq!(status[1]["ips"], json!(["198.18.172.1", "2001:db8:172::1"]), "{status:?}");
    let (v4, v6) = ("198.18.172.0-24", "2001-db8-172---64");
    let keeper = c.pool_entries(v4)["1"].clone();
    assert_eq!(keeper["podref"], "default/keeper");
    assert_eq!(c.pool_entries(v6)["1"], keeper, "the same entry in the IPv6 pool");
    assert_eq!(c.reservation_names(), BTreeSet::from(["198.18.172.1".into(), "2001-db8-172--1".into()]));

    // Two attachments whose pods do not exist (their runtime went away without a DEL).
    let ipam_conf = json!({"cniVersion": "1.0.0", "name": "rail-api", "ipam": ipam});
    let px = plexus_tests::plugin_bin("plexus-ipam");
    for ghost in ["ghost-a", "ghost-b"] {
        let (ok, r) = ipam_run(&c, &px, "ADD", ghost, ghost, &ipam_conf);
        assert!(ok, "{r}");
    }
    assert_eq!(c.reservation_names().len(), 6);

    // plexusctl ipam, through the network's own config: every address with its owner...
    let confs = c.state().join("plexusctl-conf");
    std::fs::create_dir_all(&confs).unwrap();
    let list = json!({"cniVersion": "1.0.0", "name": "rail-api", "plugins": [net]});
    std::fs::write(confs.join("rail-api.conflist"), list.to_string()).unwrap();
    let ctl = |args: &[&str]| c.plexus_tool("plexusctl", args, &[("NETCONFPATH", &confs)]);
    let (ok, out, err) = ctl(&["ipam", "list", "rail-api", "--json"]);
    assert!(ok, "{err}");
    let listed: Vec<Value> = serde_json::from_str(&out).unwrap();
    let held: BTreeSet<(String, String)> = listed
        .iter()
        .map(|a| (a["ip"].as_str().unwrap().to_string(), a["podRef"].as_str().unwrap().to_string()))
        .collect();
    let expected: BTreeSet<(String, String)> = [
        ("198.18.172.1", "default/keeper"),
        ("2001:db8:172::1", "default/keeper"),
        ("198.18.172.2", "default/ghost-a"),
        ("2001:db8:172::2", "default/ghost-a"),
        ("198.18.172.3", "default/ghost-b"),
        ("2001:db8:172::3", "default/ghost-b"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(held, expected, "{out}");
    let (ok, out, err) = ctl(&["ipam", "list", "rail-api"]);
    assert!(ok && out.contains("2001:db8:172::2") && err.contains("6 allocation(s)"), "{out}{err}");
    // ... and an operator's release: both addresses and both reservations go.
    let (ok, out, err) = ctl(&["ipam", "release", "rail-api", "ghost-a", "net1"]);
    assert!(ok, "{err}");
    assert!(out.contains("released 198.18.172.2 ") && out.contains("released 2001:db8:172::2 "), "{out}");
    assert!(!c.pool_entries(v4).contains_key("2") && !c.pool_entries(v6).contains_key("2"));
    assert!(!c.reservation_names().contains("198.18.172.2") && !c.reservation_names().contains("2001-db8-172--2"));

    // whereabouts' own reconciler: it frees ghost-b (no such pod) and keeps what the running
    // pod's network-status lists, in both families.
    let kubeconfig = c.var("KUBECONFIG").to_string();
    let (ok, out) = c.peer("whereabouts-reconcile", &["-kubeconfig", &kubeconfig], None);
    assert!(ok, "{out}");
    let freed: BTreeSet<&str> = out.lines().filter(|l| l.parse::<std::net::IpAddr>().is_ok()).collect();
    assert_eq!(freed, BTreeSet::from(["198.18.172.3", "2001:db8:172::3"]), "{out}");
    assert_eq!(c.pool_entries(v4).keys().collect::<Vec<_>>(), ["1"]);
    assert_eq!(c.pool_entries(v6).keys().collect::<Vec<_>>(), ["1"]);
    assert_eq!(c.reservation_names(), BTreeSet::from(["198.18.172.1".into(), "2001-db8-172--1".into()]));
    // The next address handed out is a new one (next-fit), not one the pod still has.
    let (ok, r) = ipam_run(&c, &px, "ADD", "after", "after", &ipam_conf);
    assert!(ok, "{r}");
    assert_eq!(r["ips"][0]["address"], "198.18.172.4/24");
    assert!(ipam_run(&c, &px, "DEL", "after", "after", &ipam_conf).0);

    // The pod goes: its DEL frees both, and nothing is left.
    c.delete("default", &["pod", "keeper"]);
    wait_until("keeper's addresses released", Duration::from_secs(30), || c.reservation_names().is_empty());
    assert!(c.pool_entries(v4).is_empty() && c.pool_entries(v6).is_empty());
    c.wait_no_state_or_cache();
}

#[test]
fn with_leader_election_plexus_ipam_waits_for_whereabouts_lease_and_takes_turns_with_whereabouts() {
    use serde_json::json;
    let c = Cluster::up("");
    c.use_kubernetes_ipam_store();
    let px = plexus_tests::plugin_bin("plexus-ipam");
    let wb = Path::new(c.var("PEERS_BIN")).join("whereabouts");
    let px_conf = json!({"cniVersion": "1.0.0", "name": "strict",
        "ipam": {"type": "plexus-ipam", "range": "198.18.174.0/24", "store": {"kubernetes": {"leaderElection": true}}}});
    let wb_conf = json!({"cniVersion": "1.0.0", "name": "strict",
        "ipam": {"type": "whereabouts", "range": "198.18.174.0/24", "configuration_path": c.whereabouts_flat_conf()}});
    let lease = || -> Value {
        let (ok, out) = c.kubectl(&["-n", "kube-system", "get", "lease", "whereabouts", "-o", "json"], None);
        assert!(ok, "{out}");
        serde_json::from_str(&out).unwrap()
    };
    // A whereabouts writer holds the Lease (just renewed, for a minute).
    let (ok, r) = ipam_run(&c, &wb, "ADD", "wb-first", "wb-first", &wb_conf);
    assert!(ok, "{r}");
    let mut held = lease();
    let now = Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%S.%6NZ"]).output().unwrap();
    held["spec"]["holderIdentity"] = json!("default/a-whereabouts-writer");
    held["spec"]["leaseDurationSeconds"] = json!(60);
    held["spec"]["renewTime"] = json!(String::from_utf8_lossy(&now.stdout).trim());
    let (ok, out) = c.kubectl(&["replace", "-f", "-"], Some(&held.to_string()));
    assert!(ok, "{out}");
    // plexus-ipam waits for it, as whereabouts' own writers do...
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| done_tx.send(ipam_run(&c, &px, "ADD", "px-waits", "px-waits", &px_conf)).unwrap());
        assert!(
            done_rx.recv_timeout(Duration::from_secs(4)).is_err(),
            "plexus-ipam allocated while whereabouts held its Lease"
        );
        assert!(c.pool_entries("198.18.174.0-24").values().all(|e| e["id"] != "px-waits"));
        // ... and goes on as soon as the holder gives it up (client-go's ReleaseOnCancel).
        let mut given_up = lease();
        given_up["spec"]["holderIdentity"] = json!("");
        let (ok, out) = c.kubectl(&["replace", "-f", "-"], Some(&given_up.to_string()));
        assert!(ok, "{out}");
        let (ok, r) = done_rx.recv_timeout(Duration::from_secs(10)).expect("plexus-ipam went on within 10 s");
        assert!(ok, "{r}");
        assert_eq!(r["ips"][0]["address"], "198.18.174.2/24");
    });
    let after = lease();
    assert_eq!(after["spec"]["holderIdentity"], "", "plexus-ipam gave the Lease back: {after}");
    assert!(
        after["spec"]["leaseTransitions"].as_i64().unwrap() > held["spec"]["leaseTransitions"].as_i64().unwrap_or(0)
    );

    // Both allocators on the one Lease at once: every address handed out once.
    const N: usize = 64;
    let tool = |i: usize| -> (&Path, &Value, &'static str) {
        if i.is_multiple_of(2) { (&wb, &wb_conf, "wb") } else { (&px, &px_conf, "px") }
    };
    let got = concurrent_adds(&c, 16, N, &tool);
    let distinct: BTreeSet<&String> = got.iter().map(|(_, ip)| ip).collect();
    assert_eq!(distinct.len(), N, "every address handed out once");
    assert_eq!(c.pool_entries("198.18.174.0-24").len(), N + 2);
    for (i, _) in &got {
        let (bin, conf, who) = tool(*i);
        assert!(ipam_run(&c, bin, "DEL", &format!("{who}-c{i}"), &format!("pod-{i}"), conf).0);
    }
    assert!(ipam_run(&c, &px, "DEL", "wb-first", "wb-first", &px_conf).0);
    assert!(ipam_run(&c, &px, "DEL", "px-waits", "px-waits", &px_conf).0);
    assert!(c.pool_entries("198.18.174.0-24").is_empty());
    assert!(c.reservation_names().is_empty());
}

fn sample(metrics: &str, series: &str) -> f64 {
    plexus_tests::daemon::sample(metrics, &format!("plexus_daemon_{series}"))
}

#[test]
fn through_plexus_daemon_pods_with_one_and_eight_networks_start_and_its_metrics_count_them() {
    let c = Cluster::up_daemon_mode("");
    let nads: String = (0..8)
        .map(|i| {
            let (port, range) = (format!("ens{}f0np0", i + 1), format!("198.19.{}.0/24", 240 + i));
            c.macvlan_nad("default", &format!("rail{i}"), &port, &range)
        })
        .collect();
    c.apply(&nads);
    let before = c.node_state();
    let selection: Vec<String> = (0..8).map(|i| format!("rail{i}")).collect();
    c.apply(&(c.pod("default", "one", "rail0") + &c.pod("default", "eight", &selection.join(","))));
    c.wait_ready("default", "pod/one", "120s");
    c.wait_ready("default", "pod/eight", "120s");
    // rail0 is shared by both pods (one of them has .2); the other seven rails are the eight's.
    let eight: BTreeSet<String> = (1..8).map(|i| format!("net{} 198.19.{}.1/24", i + 1, 240 + i)).collect();
    let one = c.pod_addrs("default", "one");
    assert_eq!(one.len(), 1, "{one:?}");
    assert!(one.iter().next().unwrap().starts_with("net1 198.19.240."), "{one:?}");
    let got = c.pod_addrs("default", "eight");
    // A first address taken means an ADD of the pod's sandbox failed and was tried again: say why.
    let why =
        || format!("{got:?}\nthe pod's events:\n{}\nplexus's log:\n{}", c.events("default", "eight"), c.plexus_log());
    assert_eq!(got.len(), 8, "{}", why());
    assert!(eight.is_subset(&got), "{}", why());
    assert!(got.iter().any(|a| a.starts_with("net1 198.19.240.")), "{got:?}");
    let status = c.network_status("default", "eight");
    let names: Vec<&str> = status.iter().map(|s| s["name"].as_str().unwrap()).collect();
    let mut expected = vec!["bootstrap".to_string()];
    expected.extend((0..8).map(|i| format!("default/rail{i}")));
    assert_eq!(names, expected, "network-status in annotation order, written by the daemon");
    // Served by the daemon, from its caches: every rail's delegate timed there, no NAD read from
    // the API, the NADs and this node's pods in its caches.
    let m = c.daemon_metrics();
    assert!(sample(&m, "request_duration_seconds_count{command=\"ADD\"}") >= 2.0, "{m}");
    for i in 0..8 {
        let series = format!(
            "delegate_duration_seconds_count{{command=\"ADD\",network=\"default/rail{i}\",type=\"plexus-macvlan\"}}"
        );
        assert!(sample(&m, &series) >= 1.0, "{series} in\n{m}");
    }
    assert_eq!(sample(&m, "api_requests_total{request=\"get_network_attachment_definition\"}"), 0.0, "{m}");
    assert!(sample(&m, "cached_objects{kind=\"network-attachment-definition\"}") >= 8.0, "{m}");
    assert!(sample(&m, "cached_objects{kind=\"pod\"}") >= 2.0, "{m}");
    assert!(m.contains("plexus_daemon_request_duration_seconds_bucket{le="), "{m}");
    assert!(!c.plexus_log().contains("thin mode"), "no shim ran a request itself:\n{}", c.plexus_log());
    // The DaemonSet installs the binaries of its image and runs its daemon: the daemon (chrooted
    // into the host's root) finds plexus-macvlan of its own build and runs it in-process.
    let log = c.plexus_log();
    assert!(
        log.lines().any(|l| l.contains("runs in-process: this build") && l.contains("plexus-macvlan")),
        "plexus-macvlan was not run in-process:\n{log}"
    );
    c.delete("default", &["pod", "one", "eight"]);
    wait_until("every address released", Duration::from_secs(60), || c.reservations() == 0);
    c.wait_no_state_or_cache();
    assert_eq!(c.node_state(), before, "the node's links and addresses are as before");
    let m = c.daemon_metrics();
    assert!(sample(&m, "request_duration_seconds_count{command=\"DEL\"}") >= 2.0, "{m}");
}

#[test]
fn the_daemon_serves_a_recreated_sandbox_from_its_caches_with_the_api_server_down_and_sees_nad_updates() {
    let c = Cluster::up_daemon_mode("");
    c.apply(&c.macvlan_nad("default", "rail0", "ens1f0np0", "198.19.250.0/24"));
    c.apply(&c.pod("default", "steady", "rail0"));
    c.wait_ready("default", "pod/steady", "120s");
    assert_eq!(c.pod_addrs("default", "steady"), BTreeSet::from(["net1 198.19.250.1/24".to_string()]));
    // A NAD updated: the daemon's cache has it within a second of the API server taking it, and
    // the next pod, created right after, gets the new config.
    let seen =
        || sample(&c.daemon_metrics(), "watch_events_total{kind=\"network-attachment-definition\",event=\"apply\"}");
    let updates = seen();
    // (Not 198.19.251.0/24, the node's pod CIDR: its bridge holds .1, which no pod gets.)
    c.apply(&c.macvlan_nad("default", "rail0", "ens1f0np0", "198.19.249.0/24"));
    let applied = Instant::now();
    while seen() <= updates {
        assert!(applied.elapsed() < Duration::from_secs(1), "the daemon saw no NAD update within 1 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("the daemon saw the NAD update {:?} after kubectl apply returned", applied.elapsed());
    c.apply(&c.pod("default", "next", "rail0"));
    c.wait_ready("default", "pod/next", "120s");
    assert_eq!(c.pod_addrs("default", "next"), BTreeSet::from(["net1 198.19.249.1/24".to_string()]));
    // The API server down: a sandbox that dies is set up again by the kubelet, the daemon serving
    // the pod and its NAD from its caches (thin mode would fail the ADD), network-status
    // retried until the API is back.
    let old = c.sandbox("default", "next").expect("a ready sandbox");
    c.daemon("stop", "kube-apiserver");
    let (ok, out) = c.crictl(&["stopp", &old]);
    assert!(ok, "{out}");
    wait_until("the kubelet's new sandbox, the API server down", Duration::from_secs(120), || {
        c.sandbox("default", "next").is_some_and(|s| s != old)
    });
    c.daemon("start", "kube-apiserver");
    let m = c.daemon_metrics();
    assert_eq!(sample(&m, "api_requests_total{request=\"get_network_attachment_definition\"}"), 0.0, "{m}");
    assert_eq!(sample(&m, "api_requests_total{request=\"get_pod\"}"), 0.0, "pods from the cache: {m}");
    // network-status names the new sandbox's attachment once the API is back (written then by
    // the daemon's background retry, or at once if the PATCH went through).
    wait_until("network-status of the recreated sandbox", Duration::from_secs(90), || {
        let s = c.network_status("default", "next");
        s.len() == 2 && s[1]["ips"][0].as_str().is_some_and(|ip| ip.starts_with("198.19.249."))
    });
    // The new sandbox's address, from the updated NAD's range (which one depends on whether the
    // old sandbox's DEL had released its address yet).
    // network-status is written at the sandbox's ADD, before the kubelet starts its container.
    let mut again = BTreeSet::new();
    wait_until("the recreated sandbox's container running", Duration::from_secs(90), || {
        c.try_pod_addrs("default", "next").map(|a| again = a).is_ok()
    });
    assert!(again.len() == 1 && again.iter().all(|a| a.starts_with("net1 198.19.249.")), "{again:?}");
    c.delete("default", &["pod", "steady", "next"]);
    wait_until("every address released", Duration::from_secs(60), || c.reservations() == 0);
    c.wait_no_state_or_cache();
}

#[test]
fn with_the_daemon_gone_the_shim_runs_requests_itself_and_pods_start_and_go() {
    let c = Cluster::up_daemon_mode("");
    c.apply(&c.macvlan_nad("default", "rail0", "ens1f0np0", "198.19.252.0/24"));
    let before = c.node_state();
    // The daemon stopped (its pod taken off the node, the DaemonSet kept — deleting the DaemonSet
    // would uninstall plexus — : SIGTERM, socket removed): the shims run thin.
    let off = r#"{"spec": {"template": {"spec": {"nodeSelector": {"plexus-test/nowhere": "x"}}}}}"#;
    let (ok, out) = c.kubectl(&["-n", "kube-system", "patch", "daemonset", "plexus", "-p", off], None);
    assert!(ok, "{out}");
    wait_until("the daemon's pod gone", Duration::from_secs(60), || {
        let (_, pods) =
            c.kubectl(&["-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=plexus", "-o", "name"], None);
        pods.trim().is_empty()
    });
    assert!(c.plexus_files_on_node().iter().any(|f| f.ends_with("/plexus")), "plexus stays installed");
    c.apply(&c.pod("default", "alone", "rail0"));
    c.wait_ready("default", "pod/alone", "120s");
    assert_eq!(c.pod_addrs("default", "alone"), BTreeSet::from(["net1 198.19.252.1/24".to_string()]));
    assert_eq!(c.network_status("default", "alone").len(), 2);
    assert!(c.plexus_log().contains("running the ADD here (thin mode)"), "{}", c.plexus_log());
    c.delete("default", &["pod", "alone"]);
    wait_until("every address released", Duration::from_secs(60), || c.reservations() == 0);
    c.wait_no_state_or_cache();
    assert_eq!(c.node_state(), before);
}

#[test]
fn a_daemon_killed_mid_add_fails_the_sandbox_and_the_kubelets_retry_succeeds_leaving_nothing_behind() {
    let c = Cluster::up_daemon_mode("");
    // "gated": plexus-macvlan behind a gate, so the daemon can be killed while it runs an ADD.
    let gate = c.state().join("gate");
    std::fs::create_dir_all(&gate).unwrap();
    let bin = Path::new(c.var("CNI_BIN_DIR"));
    plexus_tests::daemon::write_gated_delegate(&bin.join("gated"), &gate, &bin.join("plexus-macvlan"));
    let ipam = c.ipam("198.19.254.0/24");
    c.apply(
        &(c.macvlan_nad("default", "rail0", "ens1f0np0", "198.19.253.0/24")
            + &c.nad(
                "default",
                "gated",
                &format!(r#"{{"cniVersion": "1.0.0", "type": "gated", "master": "ens2f0np0", {ipam}}}"#),
            )),
    );
    let before = c.node_state();
    c.apply(&c.pod("default", "victim", "rail0,gated"));
    wait_until("the gated delegate under way in the daemon", Duration::from_secs(120), || {
        std::fs::read_dir(&gate)
            .is_ok_and(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("entered-")))
    });
    // The cluster network's and rail0's results recorded: only the gated one is under way.
    wait_until("rail0's result in the cache", Duration::from_secs(30), || {
        c.data_names("meta").iter().any(|f| {
            let text = std::fs::read_to_string(c.data().join("meta").join(f)).unwrap_or_default();
            text.matches("{\"attachment\":").count() == 2
        })
    });
    let pid = c.daemon_pid().expect("plexus-daemon runs");
    let out = Command::new("kill").args(["-KILL", &pid.to_string()]).output().unwrap();
    assert!(out.status.success(), "kill {pid}: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(gate.join("open"), "").unwrap();
    // The kubelet is told (code 11, the shim's message), tears the sandbox down and tries again.
    c.wait_event("default", "victim", "took the request and went away");
    c.wait_ready("default", "pod/victim", "180s");
    // rail0's address is the next after the one the killed ADD held (allocation is next-fit).
    let addrs: Vec<String> = c.pod_addrs("default", "victim").into_iter().collect();
    let ok = addrs.len() == 2 && addrs[0].starts_with("net1 198.19.253.") && addrs[1].starts_with("net2 198.19.254.");
    assert!(ok, "{addrs:?}");
    assert_eq!(c.network_status("default", "victim").len(), 3);
    // Nothing of the killed ADD is left: one sandbox's two addresses and one cache.
    assert_eq!((c.reservations(), c.data_files("meta")), (2, 1), "{:?}", c.data_names("meta"));
    c.delete("default", &["pod", "victim"]);
    wait_until("every address released", Duration::from_secs(60), || c.reservations() == 0);
    c.wait_no_state_or_cache();
    assert_eq!(c.node_state(), before, "the node's links and addresses are as before");
}
