//! plexus as a DRA driver on a real node (Kubernetes 1.34 of `scripts/cluster.sh`, plexus
//! installed with Helm in daemon mode with `dra.enabled`): the node's RoCE ports published as a
//! ResourceSlice with their PCIe roots, a pod's claim for a GPU and two ports on the GPU's root
//! prepared by the kubelet plugin, the ports attached and addressed by the meta-plugin, their
//! `/dev/infiniband` nodes put in the container by CDI, the claim's status filled; deleting the
//! pod returns everything. A shared port's macvlans for two pods; the kubelet restarted, and
//! plexus-daemon stopped with the kubelet's prepare lying unread on its socket, then killed: the
//! claims prepared before are kept and the new one is prepared by the daemon's next life.
//!
//! This kernel has no RDMA: a fake sysfs makes four of the node's veth "RoCE ports" ConnectX
//! functions with RDMA devices (two on each of two PCIe roots), and the device nodes are made with
//! mknod under the cluster's state dir (the driver's `--dev-root`). The GPUs are a ResourceSlice of
//! a stand-in driver (`plexus-test-dra-gpu`, registered with the kubelet).

use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::sys::stat::{Mode, SFlag, makedev, mknod};
use nix::unistd::Pid;
use plexus_tests::cluster::{Cluster, repo, wait_until};
use serde_json::Value;

/// (netdev, PCI address, PCIe root, RDMA device, uverbs minor offset)
const PORTS: [(&str, &str, &str, &str, u64); 4] = [
    ("ens1f0np0", "0000:3b:00.0", "pci0000:3a", "mlx5_0", 0),
    ("ens2f0np0", "0000:3b:00.1", "pci0000:3a", "mlx5_1", 1),
    ("ens3f0np0", "0000:9b:00.0", "pci0000:9a", "mlx5_2", 2),
    ("ens4f0np0", "0000:9b:00.1", "pci0000:9a", "mlx5_3", 3),
];

fn fake_sysfs(sys: &Path) {
    for (netdev, pci, root, rdma, n) in PORTS {
        let dev = sys.join("devices").join(root).join(pci);
        std::fs::create_dir_all(dev.join("net").join(netdev)).unwrap();
        std::fs::create_dir_all(dev.join("infiniband").join(rdma)).unwrap();
        std::fs::create_dir_all(dev.join("infiniband_verbs").join(format!("uverbs{n}"))).unwrap();
        std::fs::write(dev.join("numa_node"), if root == "pci0000:3a" { "0\n" } else { "1\n" }).unwrap();
        std::fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
        symlink(&dev, sys.join("bus/pci/devices").join(pci)).unwrap();
        std::fs::create_dir_all(sys.join("class/net").join(netdev)).unwrap();
        symlink(&dev, sys.join("class/net").join(netdev).join("device")).unwrap();
    }
}

/// `/dev/infiniband/uverbs0..3` and `rdma_cm` under `dev`.
fn device_nodes(dev: &Path) {
    let ib = dev.join("infiniband");
    std::fs::create_dir_all(&ib).unwrap();
    let mode = Mode::from_bits_truncate(0o666);
    for (_, _, _, _, n) in PORTS {
        mknod(&ib.join(format!("uverbs{n}")), SFlag::S_IFCHR, mode, makedev(231, 192 + n)).unwrap();
    }
    mknod(&ib.join("rdma_cm"), SFlag::S_IFCHR, mode, makedev(10, 58)).unwrap();
}

/// The stand-in GPU driver's kubelet plugin; stopped on drop.
struct GpuDriver(Child);

impl GpuDriver {
    fn start(c: &Cluster) -> GpuDriver {
        let log = std::fs::File::create(c.state().join("log/dra-gpu.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_plexus-test-dra-gpu"))
            .arg(c.state().join("kubelet"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        GpuDriver(child)
    }
}

impl Drop for GpuDriver {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0.id() as i32), Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

/// Two GPUs of `gpu.example.com` on this node, one on each PCIe root, and their class.
fn gpus(c: &Cluster) -> String {
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {{name: gpu.example.com}}
spec:
  selectors:
  - cel: {{expression: 'device.driver == "gpu.example.com"'}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: {node}-gpu}}
spec:
  driver: gpu.example.com
  nodeName: {node}
  pool: {{name: {node}, generation: 0, resourceSliceCount: 1}}
  devices:
  - name: gpu0
    attributes: {{resource.kubernetes.io/pcieRoot: {{string: pci0000:3a}}}}
  - name: gpu1
    attributes: {{resource.kubernetes.io/pcieRoot: {{string: pci0000:9a}}}}
"#,
        node = c.var("NODE_NAME")
    )
}

fn json(c: &Cluster, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let (ok, out) = c.kubectl(&all, None);
    assert!(ok, "kubectl {args:?}: {out}");
    serde_json::from_str(&out).unwrap()
}

/// A node whose four fake ConnectX ports are offered by plexus's DRA driver (`shared` ports as
/// macvlans), installed with Helm in daemon mode.
struct Rig {
    c: Cluster,
    /// The fake sysfs, kept as long as the cluster.
    _sys: tempfile::TempDir,
}

impl Rig {
    fn up(shared: &[&str]) -> Rig {
        let sys = tempfile::tempdir().unwrap();
        fake_sysfs(sys.path());
        let c = Cluster::bare(Some(sys.path()));
        let state = c.state().to_path_buf();
        device_nodes(&state.join("dev"));
        let mut helm_args = format!(
            "--set dra.enabled=true --set dra.kubeletDir={k} --set dra.cdiDir={cdi} --set dra.devRoot={dev} \
             --set dra.claimsDir={claims} --set-json env=[{{\"name\":\"PLEXUS_SYSFS_ROOT\",\"value\":\"{sys}\"}}]",
            k = state.join("kubelet").display(),
            cdi = state.join("cdi").display(),
            dev = state.join("dev").display(),
            claims = state.join("dra-claims").display(),
            sys = sys.path().display(),
        );
        if !shared.is_empty() {
            helm_args.push_str(&format!(" --set dra.sharedPorts={{{}}}", shared.join(",")));
        }
        let install = c
            .script("cluster-install.sh")
            .envs(c.vars())
            .env("PLEXUS_DAEMON_MODE", "1")
            .env("PLEXUS_INSTALL_WITH", "helm")
            .env("PLEXUS_HELM_ARGS", &helm_args)
            .output()
            .unwrap();
        assert!(install.status.success(), "cluster-install.sh failed:\n{}", String::from_utf8_lossy(&install.stderr));
        let example = repo().join("conf-examples/dra");
        c.apply(&std::fs::read_to_string(example.join("deviceclasses.yaml")).unwrap());
        Rig { c, _sys: sys }
    }

    /// The node's slice once it offers `n` devices.
    fn slice(&self, n: usize) -> Value {
        let name = format!("{}-plexus-dev", self.c.var("NODE_NAME"));
        let mut slice = Value::Null;
        wait_until("plexus's ResourceSlice", Duration::from_secs(60), || {
            let (ok, out) = self.c.kubectl(&["get", "resourceslice", &name, "-o", "json"], None);
            ok && {
                slice = serde_json::from_str(&out).unwrap();
                slice["spec"]["devices"].as_array().is_some_and(|d| d.len() == n)
            }
        });
        slice
    }

    /// A pod using claim template `template` (the test image, never pulled).
    fn pod(&self, name: &str, template: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 0\n  resourceClaims: [{{name: fabric, resourceClaimTemplateName: {template}}}]\n  containers:\n  - {{name: main, image: {}, imagePullPolicy: Never, command: [sleep, \"3600\"], resources: {{claims: [{{name: fabric}}]}}}}\n",
            self.c.var("TEST_IMAGE")
        )
    }

    /// The claim of pod `name` (from its template).
    fn claim_of(&self, name: &str) -> Value {
        let pod = json(&self.c, &["-n", "default", "get", "pod", name]);
        let claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"].as_str().unwrap().to_string();
        json(&self.c, &["-n", "default", "get", "resourceclaim", &claim])
    }
}

#[test]
fn a_pod_claiming_a_gpu_and_two_roce_ports_on_its_pcie_root_gets_them_attached_with_device_nodes_and_status() {
    let rig = Rig::up(&[]);
    let c = &rig.c;
    let state = c.state().to_path_buf();
    // The node's slice: the four RDMA ports with their roots; ens5..8 (no RDMA device) not.
    let node = c.var("NODE_NAME").to_string();
    let slice_name = format!("{node}-plexus-dev");
    let slice = rig.slice(4);
    assert_eq!(slice["spec"]["driver"], "plexus.dev");
    assert_eq!(slice["spec"]["nodeName"], node.as_str());
    let ens3 = slice["spec"]["devices"].as_array().unwrap().iter().find(|d| d["name"] == "ens3f0np0").unwrap();
    assert_eq!(ens3["attributes"]["resource.kubernetes.io/pcieRoot"]["string"], "pci0000:9a");
    assert_eq!(ens3["attributes"]["plexus.dev/rdmaDevice"]["string"], "mlx5_2");
    assert_eq!(ens3["attributes"]["k8s.cni.cncf.io/deviceID"]["string"], "0000:9b:00.0");
    assert_eq!(ens3["attributes"]["plexus.dev/numaNode"]["int"], 1);

    // The kubelet deletes a node's slices when it starts: the driver puts its slice back.
    c.kubectl(&["delete", "resourceslice", &slice_name], None);
    wait_until("the slice put back", Duration::from_secs(30), || {
        c.kubectl(&["get", "resourceslice", &slice_name], None).0
    });

    let _gpu = GpuDriver::start(c);
    c.apply(&gpus(c));
    let example = repo().join("conf-examples/dra");
    let data = c.data();
    // The example's template, its ports' config taken from a NAD of the namespace (`network`):
    // plexus-host-device's state and plexus-ipam's data in this node's data root (the test node's
    // policy allows no other).
    let nad = format!(
        r#"apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {{name: rails, namespace: default}}
spec:
  config: '{{"cniVersion": "1.0.0", "name": "rails", "type": "plexus-host-device", "dataDir": "{d}/hd", "ipam": {{"type": "plexus-ipam", "range": "198.18.60.0/24", "dataDir": "{d}/ipam"}}}}'
"#,
        d = data.display()
    );
    c.apply(&nad);
    let template = std::fs::read_to_string(example.join("claim-template.yaml"))
        .unwrap()
        .replace("ipam: {type: plexus-ipam, range: 198.18.60.0/24}", "network: rails");
    assert!(template.contains("network: rails"), "{template}");
    c.apply(&template);
    let pod = std::fs::read_to_string(example.join("pod.yaml"))
        .unwrap()
        .replace("image: busybox:1.36", &format!("image: {}\n    imagePullPolicy: Never", c.var("TEST_IMAGE")));
    c.apply(&pod);
    c.wait_ready("default", "pod/trainer", "120s");

    // The claim: a GPU and the two ports on its PCIe root, prepared, attached, reported.
    let claim = rig.claim_of("trainer");
    let results = claim["status"]["allocation"]["devices"]["results"].as_array().unwrap().clone();
    let device_of = |request: &str| -> Vec<String> {
        let mut d: Vec<String> = results
            .iter()
            .filter(|r| r["request"] == request)
            .map(|r| r["device"].as_str().unwrap().to_string())
            .collect();
        d.sort();
        d
    };
    let gpu_root = match device_of("gpu").as_slice() {
        [g] if g == "gpu0" => "pci0000:3a",
        [g] if g == "gpu1" => "pci0000:9a",
        other => panic!("GPU allocation {other:?}"),
    };
    let ports: Vec<(&str, u64)> = PORTS.iter().filter(|p| p.2 == gpu_root).map(|p| (p.0, p.4)).collect();
    assert_eq!(device_of("rails"), ports.iter().map(|p| p.0.to_string()).collect::<Vec<_>>(), "{results:?}");
    let status = claim["status"]["devices"].as_array().cloned().unwrap_or_default();
    assert_eq!(status.len(), 2, "{claim}");
    for s in &status {
        assert_eq!(s["driver"], "plexus.dev");
        assert_eq!(s["conditions"][0]["type"], "Ready");
        assert_eq!(s["conditions"][0]["status"], "True");
        let ifname = s["networkData"]["interfaceName"].as_str().unwrap();
        assert_eq!(ifname, s["device"].as_str().unwrap());
        let ip = s["networkData"]["ips"][0].as_str().unwrap();
        assert!(ip.starts_with("198.18.60.") && ip.ends_with("/24"), "{s}");
        assert!(s["data"]["rdmaDevice"].as_str().unwrap().starts_with("mlx5_"));
    }
    // In the pod: the ports, addressed, and their device nodes.
    let (ok, addrs) = c.kubectl(&["-n", "default", "exec", "trainer", "--", "ip", "-o", "-4", "addr"], None);
    assert!(ok && ports.iter().all(|p| addrs.contains(p.0)) && addrs.contains("198.18.60."), "{addrs}");
    let (ok, nodes) = c.kubectl(&["-n", "default", "exec", "trainer", "--", "ls", "/dev/infiniband"], None);
    assert!(ok, "{nodes}");
    let mut nodes: Vec<String> = nodes.split_whitespace().map(String::from).collect();
    nodes.sort();
    let mut want: Vec<String> = ports.iter().map(|p| format!("uverbs{}", p.1)).collect();
    want.push("rdma_cm".into());
    want.sort();
    assert_eq!(nodes, want);
    // The ports left the node.
    let links = c.node_ip(&["-o", "link"]);
    assert!(ports.iter().all(|p| !links.contains(p.0)), "{links}");
    assert_eq!(std::fs::read_dir(state.join("cdi")).unwrap().count(), 1, "one CDI spec for the claim");

    // Deleting the pod returns everything: the ports, the addresses, the CDI spec, the prepared claim.
    c.delete("default", &["pod", "trainer"]);
    wait_until("the ports back on the node", Duration::from_secs(60), || {
        let links = c.node_ip(&["-o", "link"]);
        ports.iter().all(|p| links.contains(p.0))
    });
    wait_until("address released", Duration::from_secs(30), || c.reservations() == 0);
    wait_until("CDI spec and prepared claim removed", Duration::from_secs(60), || {
        let count = |d: &str| std::fs::read_dir(state.join(d)).map(|e| e.count()).unwrap_or(0);
        count("cdi") == 0 && count("dra-claims") == 0
    });
    c.wait_no_state_or_cache();
}

/// The PID of this cluster's plexus-daemon (its `--dra-claims-dir` is under the state dir).
fn daemon_pid(state: &Path) -> Pid {
    let mark = format!("--dra-claims-dir={}", state.join("dra-claims").display());
    let mut found = None;
    wait_until("plexus-daemon running", Duration::from_secs(120), || {
        found = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let daemon = args.first().is_some_and(|a| a.ends_with(b"plexus-daemon"));
            (daemon && args.contains(&mark.as_bytes())).then(|| Pid::from_raw(pid))
        });
        found.is_some()
    });
    found.unwrap()
}

/// Whether a request lies unread on unix socket `path` of the node (`ss`: a receive queue on it
/// or on a connection accepted from it).
fn unread(c: &Cluster, path: &Path) -> bool {
    let out = Command::new("ip").args(["netns", "exec", c.var("NODE_NETNS"), "ss", "-xnH"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 4 && Path::new(f[4]) == path && f[2].parse::<u64>().is_ok_and(|q| q > 0)
    })
}

/// A claim template of one port of `class`, its interface `net1` addressed from `range`.
fn one_port(rig: &Rig, name: &str, class: &str, selector: Option<&str>, range: &str) -> String {
    let select = selector.map(|cel| format!(", selectors: [{{cel: {{expression: '{cel}'}}}}]")).unwrap_or_default();
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {name}, namespace: default}}
spec:
  spec:
    devices:
      requests:
      - {{name: port, exactly: {{deviceClassName: {class}{select}}}}}
      config:
      - opaque: {{driver: plexus.dev, parameters: {{interface: net1, ipam: {{type: plexus-ipam, range: "{range}", dataDir: "{data}/ipam"}}}}}}
"#,
        data = rig.c.data().display()
    )
}

#[test]
fn a_shared_port_gives_pods_macvlans_through_a_kubelet_restart_and_a_plugin_killed_mid_prepare_and_unmet_claims_say_why()
 {
    let rig = Rig::up(&["ens1f0np0"]);
    let c = &rig.c;
    let state = c.state().to_path_buf();
    let slice = rig.slice(4);
    let ens1 = slice["spec"]["devices"].as_array().unwrap().iter().find(|d| d["name"] == "ens1f0np0").unwrap().clone();
    assert_eq!(ens1["attributes"]["plexus.dev/mode"]["string"], "shared");
    assert_eq!(ens1["allowMultipleAllocations"], true, "{ens1}");
    assert_eq!(ens1["capacity"]["plexus.dev/macvlans"]["value"], "64");

    // Two pods, one claim each, both on the shared port: a macvlan each, their own addresses.
    c.apply(&one_port(&rig, "shared", "roce-shared.plexus.dev", None, "198.18.61.0/24"));
    c.apply(&rig.pod("p1", "shared"));
    c.apply(&rig.pod("p2", "shared"));
    c.wait_ready("default", "pod/p1", "120s");
    c.wait_ready("default", "pod/p2", "120s");
    let mut shares = Vec::new();
    for p in ["p1", "p2"] {
        let claim = rig.claim_of(p);
        let result = &claim["status"]["allocation"]["devices"]["results"][0];
        assert_eq!(result["device"], "ens1f0np0");
        shares.push(result["shareID"].as_str().unwrap_or_default().to_string());
        let status = &claim["status"]["devices"][0];
        assert_eq!(status["shareID"], result["shareID"], "{claim}");
        assert_eq!(status["conditions"][0]["status"], "True");
        assert_eq!(status["networkData"]["interfaceName"], "net1");
        assert_eq!(c.pod_addrs("default", p).len(), 1, "{p}: {:?}", c.pod_addrs("default", p));
    }
    assert!(!shares[0].is_empty() && shares[0] != shares[1], "{shares:?}");
    let addrs: Vec<String> = ["p1", "p2"].iter().flat_map(|p| c.pod_addrs("default", p)).collect();
    assert_ne!(addrs[0], addrs[1]);
    assert!(addrs.iter().all(|a| a.starts_with("net1 198.18.61.")), "{addrs:?}");
    assert!(c.node_ip(&["-o", "link"]).contains("ens1f0np0"), "a shared port stays on the node");

    // The kubelet restarts (and deletes the node's ResourceSlices as it starts): the plugin is
    // registered again, its slice put back, the prepared claims kept, and a third pod is served.
    c.daemon("restart", "kubelet");
    rig.slice(4);
    let prepared = || std::fs::read_dir(state.join("dra-claims")).map(|e| e.count()).unwrap_or(0);
    assert_eq!(prepared(), 2, "prepared claims kept across the kubelet's restart");
    c.apply(&rig.pod("p3", "shared"));
    c.wait_ready("default", "pod/p3", "120s");
    assert_eq!(rig.claim_of("p3")["status"]["devices"][0]["conditions"][0]["status"], "True");
    c.delete("default", &["pod", "p3"]);

    // plexus-daemon killed with a prepare in flight: stopped before a pod's claim is prepared, so
    // the kubelet's NodePrepareResources lies unread on the plugin's socket, then killed. Its
    // container comes back, the plugin registers again, the kubelet's retry prepares the claim,
    // and the pod starts with its port.
    let daemon = daemon_pid(&state);
    kill(daemon, Signal::SIGSTOP).unwrap();
    c.apply(&rig.pod("p4", "shared"));
    let socket = state.join("kubelet/plugins/plexus.dev/dra.sock");
    wait_until("the kubelet's prepare waiting on the stopped plugin", Duration::from_secs(90), || unread(c, &socket));
    kill(daemon, Signal::SIGKILL).unwrap();
    c.wait_ready("default", "pod/p4", "180s");
    assert_ne!(daemon_pid(&state), daemon, "a new plexus-daemon");
    let p4 = rig.claim_of("p4");
    assert_eq!(p4["status"]["devices"][0]["conditions"][0]["status"], "True", "{p4}");
    assert_eq!(c.pod_addrs("default", "p4").len(), 1, "{:?}", c.pod_addrs("default", "p4"));

    // plexus's pod replaced, as a rollout replaces it: it is Ready only once the kubelet has
    // registered its DRA plugin and its slice is published, so a claim's pod made the moment it
    // is Ready is prepared at once — never told the driver is not registered, never waiting for
    // the kubelet's retry.
    let (ok, out) = c.kubectl(
        &["-n", "kube-system", "delete", "pod", "-l", "app.kubernetes.io/name=plexus", "--wait=true", "--timeout=60s"],
        None,
    );
    assert!(ok, "{out}");
    let (ok, out) = c.kubectl(&["-n", "kube-system", "rollout", "status", "daemonset/plexus", "--timeout=120s"], None);
    assert!(ok, "{out}");
    c.apply(&rig.pod("p5", "shared"));
    c.wait_ready("default", "pod/p5", "120s");
    let events = c.events("default", "p5");
    assert!(!events.contains("not registered"), "a claim prepared before the plugin was registered: {events}");

    // Three exclusive ports on one PCIe root: no root has them; the pod stays Pending, saying why.
    c.apply(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: three-on-one-root, namespace: default}
spec:
  spec:
    devices:
      requests:
      - {name: ports, exactly: {deviceClassName: roce.plexus.dev, count: 3}}
      constraints:
      - {requests: [ports], matchAttribute: resource.kubernetes.io/pcieRoot}
"#,
    );
    c.apply(&rig.pod("too-many", "three-on-one-root"));
    wait_until("the scheduler's reason", Duration::from_secs(60), || {
        let pod = json(c, &["-n", "default", "get", "pod", "too-many"]);
        pod["status"]["conditions"].as_array().into_iter().flatten().any(|cond| {
            cond["type"] == "PodScheduled"
                && cond["status"] == "False"
                && cond["message"].as_str().is_some_and(|m| m.contains("cannot allocate all claims"))
        })
    });

    // A port whose RDMA device has no device node: prepare fails, and the pod's events say why.
    std::fs::remove_file(state.join("dev/infiniband/uverbs3")).unwrap();
    c.apply(&one_port(
        &rig,
        "ens4",
        "roce.plexus.dev",
        Some(r#"device.attributes["plexus.dev"].ifName == "ens4f0np0""#),
        "198.18.62.0/24",
    ));
    c.apply(&rig.pod("no-verbs", "ens4"));
    wait_until("the prepare failure in the pod's events", Duration::from_secs(90), || {
        c.events("default", "no-verbs").contains("uverbs3")
    });
    assert!(c.node_ip(&["-o", "link"]).contains("ens4f0np0"), "nothing attached");

    // A claim asking the shared port for more MTU than it has: refused at prepare, in the pod's
    // events, before any sandbox is made (not by the macvlan's ADD).
    c.apply(
        &one_port(&rig, "too-big", "roce-shared.plexus.dev", None, "198.18.63.0/24")
            .replace("parameters: {interface: net1,", "parameters: {interface: net1, mtu: 70000,"),
    );
    c.apply(&rig.pod("too-big", "too-big"));
    wait_until("the MTU refused at prepare", Duration::from_secs(90), || {
        c.events("default", "too-big").contains("mtu 70000: port ens1f0np0 takes 68 to")
    });
    assert!(!c.events("default", "too-big").contains("FailedCreatePodSandBox"), "no sandbox was tried");

    // A claim the node policy refuses at ADD (its IPAM's dataDir outside the data roots): the
    // sandbox fails with the refusal, and the runtime's DEL of that sandbox succeeds — there is
    // nothing of the attachment to release, and the pod is told nothing failed to be deleted.
    c.apply(
        &one_port(&rig, "refused", "roce-shared.plexus.dev", None, "198.18.64.0/24")
            .replace(&format!("dataDir: \"{}/ipam\"", c.data().display()), "dataDir: \"/etc/plexus-test-forbidden\""),
    );
    c.apply(&rig.pod("refused", "refused"));
    wait_until("the refusal in the pod's events", Duration::from_secs(90), || {
        c.events("default", "refused").contains("is not beneath the node policy's dataRoots")
    });
    // The kubelet's DEL of the failed sandbox comes right after its ADD: a moment for it.
    std::thread::sleep(Duration::from_secs(5));
    let events = c.events("default", "refused");
    assert!(!events.contains("DEL failed"), "the DEL of an attachment that never was failed: {events}");

    c.delete("default", &["pod", "p1", "p2", "p4", "p5", "too-many", "no-verbs", "too-big", "refused"]);
    wait_until("addresses released", Duration::from_secs(60), || c.reservations() == 0);
    wait_until("CDI specs and prepared claims removed", Duration::from_secs(60), || {
        let count = |d: &str| std::fs::read_dir(state.join(d)).map(|e| e.count()).unwrap_or(0);
        count("cdi") == 0 && count("dra-claims") == 0
    });
    c.wait_no_state_or_cache();
}
