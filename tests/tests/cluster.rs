//! plexus under a real kubelet: `scripts/cluster.sh up` brings a single-node Kubernetes (real
//! etcd, kube-apiserver, controller-manager, scheduler, containerd CRI, kubelet) into a network
//! namespace of its own, `scripts/cluster-install.sh` installs plexus through the deployment
//! manifests (CRD, ServiceAccount, least RBAC, DaemonSet), and from then on kubelet → containerd
//! → plexus sets up every pod's networks. One test: the cluster takes a minute to come up.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The cluster, removed on drop (panics included).
struct Cluster {
    env: BTreeMap<String, String>,
}

impl Cluster {
    fn up() -> Cluster {
        plexus_tests::require_root();
        // Removed on drop from here on, also when coming up fails halfway.
        let mut c = Cluster { env: BTreeMap::new() };
        let out = Command::new("bash").arg(repo().join("scripts/cluster.sh")).arg("up").output().unwrap();
        assert!(out.status.success(), "cluster.sh up failed:\n{}", String::from_utf8_lossy(&out.stderr));
        c.env = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect();
        for key in ["KUBECONFIG", "NODE_NETNS", "NODE_NAME", "CNI_BIN_DIR", "CNI_CONF_DIR", "TEST_IMAGE", "PEERS_BIN"] {
            assert!(c.env.contains_key(key), "cluster.sh up printed no {key}");
        }
        let install =
            Command::new("bash").arg(repo().join("scripts/cluster-install.sh")).envs(&c.env).output().unwrap();
        assert!(install.status.success(), "cluster-install.sh failed:\n{}", String::from_utf8_lossy(&install.stderr));
        c
    }

    fn var(&self, key: &str) -> &str {
        &self.env[key]
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        use std::io::Write;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.var("NODE_NETNS")])
            .arg(Path::new(self.var("PEERS_BIN")).join("kubectl"))
            .args(["--kubeconfig", self.var("KUBECONFIG")])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        child.stdin.take().unwrap().write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    }

    fn apply(&self, yaml: &str) {
        let (ok, out) = self.kubectl(&["apply", "-f", "-"], Some(yaml));
        assert!(ok, "kubectl apply: {out}");
    }

    fn pod_json(&self, name: &str) -> Value {
        let (ok, out) = self.kubectl(&["get", "pod", name, "-o", "json"], None);
        assert!(ok, "{out}");
        serde_json::from_str(&out).unwrap()
    }

    fn data_files(&self, sub: &str) -> usize {
        let dir = Path::new(self.var("KUBECONFIG")).parent().unwrap().join("data").join(sub);
        std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
    }

    fn node_link_up(&self, name: &str) -> bool {
        let out = Command::new("ip").args(["-n", self.var("NODE_NETNS"), "-j", "link", "show", name]).output().unwrap();
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("\"UP\"")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(repo().join("scripts/cluster.sh")).arg("down").output();
    }
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn kubelet_runs_a_pod_on_two_plexus_networks_and_a_missing_nad_fails_cleanly() {
    let c = Cluster::up();
    let data = Path::new(c.var("KUBECONFIG")).parent().unwrap().join("data");
    let ipam = format!(
        r#""ipam": {{"type": "plexus-ipam", "range": "198.18.240.0/24", "dataDir": "{}/ipam"}}"#,
        data.display()
    );
    let ipam1 = ipam.replace("198.18.240.0", "198.18.241.0");
    c.apply(&format!(
        r#"apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {{name: rail0, namespace: default}}
spec:
  config: '{{"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "ens1f0np0", {ipam}}}'
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {{name: hostdev, namespace: default}}
spec:
  config: '{{"cniVersion": "1.0.0", "type": "plexus-host-device", "device": "ens2f0np0", "dataDir": "{}/hd", {ipam1}}}'
"#,
        data.display()
    ));
    let pod = |name: &str, networks: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  annotations: {{k8s.v1.cni.cncf.io/networks: \"{networks}\"}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - {{name: c, image: {}, imagePullPolicy: Never, command: [\"/bin/sh\", \"-c\", \"sleep 3600\"]}}\n",
            c.var("TEST_IMAGE")
        )
    };
    c.apply(&pod("trainer", "rail0,hostdev"));
    let (ok, out) = c.kubectl(&["wait", "--for=condition=Ready", "pod/trainer", "--timeout=90s"], None);
    assert!(ok, "the pod did not become Ready: {out}\n{}", c.kubectl(&["describe", "pod", "trainer"], None).1);
    let (ok, addrs) = c.kubectl(&["exec", "trainer", "--", "ip", "-o", "-4", "addr"], None);
    assert!(ok, "{addrs}");
    assert!(addrs.contains("net1    inet 198.18.240.1/24"), "{addrs}");
    assert!(addrs.contains("net2    inet 198.18.241.1/24"), "{addrs}");
    assert!(!c.node_link_up("ens2f0np0"), "the host device is in the pod");
    // network-status, read back from the API server: plexus wrote it with the DaemonSet's
    // service account (the RBAC of conf-examples/deploy is enough).
    let p = c.pod_json("trainer");
    let status: Value =
        serde_json::from_str(p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"].as_str().unwrap())
            .unwrap();
    let names: Vec<&str> = status.as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["bootstrap", "default/rail0", "default/hostdev"]);
    assert_eq!(status[1]["ips"][0], "198.18.240.1");
    assert_eq!(status[2]["ips"][0], "198.18.241.1");
    // Deleting the pod: both addresses released, the device back with its host state.
    let (ok, out) = c.kubectl(&["delete", "pod", "trainer", "--wait=true", "--timeout=90s"], None);
    assert!(ok, "{out}");
    wait_until("addresses released", Duration::from_secs(30), || c.data_files("ipam/default/ips") == 0);
    wait_until("device back on the node", Duration::from_secs(30), || c.node_link_up("ens2f0np0"));
    assert_eq!((c.data_files("hd"), c.data_files("meta")), (0, 0), "no state or cache left");
    // A NAD that does not exist: the pod's events carry plexus's error, nothing leaks.
    c.apply(&pod("orphan", "nosuch"));
    wait_until("plexus's error in the pod's events", Duration::from_secs(60), || {
        let (_, ev) =
            c.kubectl(&["get", "events", "--field-selector", "involvedObject.name=orphan", "-o", "json"], None);
        ev.contains("cannot find a network-attachment-definition (nosuch) in namespace (default)")
    });
    assert_eq!(c.data_files("ipam/default/ips"), 0);
    let (ok, out) = c.kubectl(&["delete", "pod", "orphan", "--wait=true", "--timeout=90s"], None);
    assert!(ok, "{out}");
    wait_until("no cache left", Duration::from_secs(30), || c.data_files("meta") == 0);
}
