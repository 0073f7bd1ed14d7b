//! A real Kubernetes for the tests: `scripts/cluster.sh up` brings up etcd, kube-apiserver,
//! controller-manager, scheduler, containerd and the kubelet in a network namespace of their own
//! (`--nodes N`: more nodes, each a containerd and kubelet in namespaces of its own, cabled to a
//! fabric namespace), and `scripts/cluster-install.sh` installs plexus on it (plain manifests or
//! the Helm chart, thin or daemon mode). [`Cluster`] is one such cluster, taken down on drop
//! (panics included), with the views the tests read it through: kubectl and crictl in the node's
//! namespace, the node's links and addresses, plexus's data directories, whereabouts' objects.
//!
//! Each test brings up a cluster of its own (about half a minute) in one of [`SLOTS`] slots (a
//! state dir and namespaces each, `PLEXUS_CLUSTER_SLOT`), so three run at once: a slot is a file
//! lock here, and nextest's `cluster` test group runs as many tests as there are slots
//! (.config/nextest.toml).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// How many clusters may be up at once: the tests are more waiting than computing, and three
/// fill this machine's two cores (`PLEXUS_CLUSTER_SLOTS` sets another number; nextest's
/// `cluster` group, .config/nextest.toml, runs as many at once).
pub const SLOTS: u32 = 3;

/// A slot of its own for this cluster: the first whose lock is free, waited for.
pub fn take_slot() -> (u32, nix::fcntl::Flock<std::fs::File>) {
    let slots = std::env::var("PLEXUS_CLUSTER_SLOTS").ok().and_then(|n| n.parse().ok()).unwrap_or(SLOTS).max(1);
    loop {
        for slot in 0..slots {
            let path = format!("/run/lock/plexus-cluster-slot-{slot}");
            let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).unwrap();
            if let Ok(lock) = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                return (slot, lock);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The cluster, removed on drop (panics included), then its slot given back.
pub struct Cluster {
    env: BTreeMap<String, String>,
    slot: u32,
    _slot: nix::fcntl::Flock<std::fs::File>,
}

impl Cluster {
    /// A cluster with plexus installed; `meta_keys` are added to its meta config.
    pub fn up(meta_keys: &str) -> Cluster {
        Cluster::up_with(meta_keys, None, false)
    }

    /// A cluster with plexus installed in daemon mode (conf-examples/deploy/daemon).
    pub fn up_daemon_mode(meta_keys: &str) -> Cluster {
        Cluster::up_with(meta_keys, None, true)
    }

    /// [`Cluster::up`], the CNI plugins reading sysfs from `sysfs` (a fake tree) when given, in
    /// daemon mode when `daemon_mode`.
    pub fn up_with(meta_keys: &str, sysfs: Option<&Path>, daemon_mode: bool) -> Cluster {
        Cluster::up_installed_with(meta_keys, sysfs, daemon_mode, "manifests")
    }

    /// A cluster with plexus installed by `with`: "manifests" (`kubectl apply -k`) or "helm".
    pub fn up_installed_with(meta_keys: &str, sysfs: Option<&Path>, daemon_mode: bool, with: &str) -> Cluster {
        let c = Cluster::bare(sysfs);
        c.install(meta_keys, daemon_mode, with);
        c
    }

    /// A cluster without plexus: its cluster network only (the CNI bin dir has the reference
    /// plugins it runs).
    pub fn bare(sysfs: Option<&Path>) -> Cluster {
        Cluster::bare_nodes(sysfs, 1)
    }

    /// [`Cluster::bare`] with `nodes` nodes (`cluster.sh up --nodes N`): node 1 runs the control
    /// plane, each node its own containerd and kubelet, their RoCE ports cabled to one bridge
    /// per rail in the fabric namespace.
    pub fn bare_nodes(sysfs: Option<&Path>, nodes: u32) -> Cluster {
        crate::require_root();
        let (slot, lock) = take_slot();
        // Removed on drop from here on, also when coming up fails halfway.
        let mut c = Cluster { env: BTreeMap::new(), slot, _slot: lock };
        let out = c
            .script("cluster.sh")
            .args(["up", "--nodes", &nodes.to_string()])
            .env("PLEXUS_CLUSTER_SYSFS", sysfs.map(Path::as_os_str).unwrap_or_default())
            .output()
            .unwrap();
        c.came_up(
            &out,
            &["KUBECONFIG", "NODE_NETNS", "NODE_NAME", "CNI_BIN_DIR", "CNI_CONF_DIR", "TEST_IMAGE", "PEERS_BIN"],
        );
        for k in 2..=nodes {
            for key in ["NODE_NETNS", "NODE_NAME", "NODE_STATE"] {
                assert!(c.env.contains_key(&format!("{key}_{k}")), "cluster.sh up printed no {key}_{k}");
            }
        }
        c
    }

    /// A control plane and `nodes` hollow nodes on it (`cluster.sh up --hollow N`,
    /// docs/hollow-nodes.md): each a Node kwok keeps Ready, a namespace with eight RoCE ports on a
    /// fake sysfs, the real plexus-daemon of the shipped build (`scripts/build-release.sh`), and
    /// the kubelet stand-in (`kubelet`, this package's `plexus-test-hollow-kubelet`) running their
    /// pods' CNI ADD and DEL. No real node: kubectl runs in the control plane's namespace.
    pub fn hollow(nodes: u32, kubelet: &Path) -> Cluster {
        crate::require_root();
        let (slot, lock) = take_slot();
        let mut c = Cluster { env: BTreeMap::new(), slot, _slot: lock };
        let release = c.release_build();
        let out = c
            .script("cluster.sh")
            .args(["up", "--hollow", &nodes.to_string()])
            .env("PLEXUS_HOLLOW_BIN", &release)
            .env("PLEXUS_HOLLOW_KUBELET", kubelet)
            .output()
            .unwrap();
        c.came_up(&out, &["KUBECONFIG", "NODE_NETNS", "PEERS_BIN", "HOLLOW_NODES", "HOLLOW_TIMINGS"]);
        for k in 1..=nodes {
            assert!(c.env.contains_key(&format!("HOLLOW_NAME_{k}")), "cluster.sh up printed no HOLLOW_NAME_{k}");
        }
        c
    }

    /// What `cluster.sh up` printed (`KEY=value` lines) taken as this cluster's keys, once it
    /// succeeded and printed every one of `keys`.
    fn came_up(&mut self, out: &std::process::Output, keys: &[&str]) {
        assert!(out.status.success(), "cluster.sh up failed:\n{}", String::from_utf8_lossy(&out.stderr));
        self.env = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect();
        for key in keys {
            assert!(self.env.contains_key(*key), "cluster.sh up printed no {key}");
        }
    }

    /// `scripts/cluster-install.sh`: plexus installed by `with` ("manifests" or "helm"), in
    /// daemon mode when `daemon_mode`, `meta_keys` added to its meta config.
    pub fn install(&self, meta_keys: &str, daemon_mode: bool, with: &str) {
        self.install_release(meta_keys, daemon_mode, with, None, "");
    }

    /// [`Cluster::install`] with Helm of another release: its chart (`deploy/helm/plexus` of
    /// `release`, as `scripts/previous-release.sh` keeps it) and its image, imported first as
    /// `localhost/plexus:<image_tag>` ([`Cluster::import_image`]); `helm_args` added to `helm
    /// install`.
    pub fn install_release(
        &self,
        meta_keys: &str,
        daemon_mode: bool,
        with: &str,
        release: Option<(&Path, &str)>,
        helm_args: &str,
    ) {
        let mut script = self.script("cluster-install.sh");
        if let Some((chart, tag)) = release {
            script.env("PLEXUS_CHART", chart).env("PLEXUS_IMAGE_TAG", tag);
        }
        if !helm_args.is_empty() {
            script.env("PLEXUS_HELM_ARGS", helm_args);
        }
        let install = script
            .envs(&self.env)
            .env("PLEXUS_META_KEYS", meta_keys)
            .env("PLEXUS_DAEMON_MODE", if daemon_mode { "1" } else { "" })
            .env("PLEXUS_INSTALL_WITH", with)
            .output()
            .unwrap();
        assert!(install.status.success(), "cluster-install.sh failed:\n{}", String::from_utf8_lossy(&install.stderr));
    }

    /// One of scripts/, run for this cluster's slot.
    pub fn script(&self, name: &str) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg(repo().join("scripts").join(name)).env("PLEXUS_CLUSTER_SLOT", self.slot.to_string());
        cmd
    }

    pub fn var(&self, key: &str) -> &str {
        &self.env[key]
    }

    /// What `cluster.sh up` printed, for the scripts that take it in their environment.
    pub fn vars(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// plexus's files on the node: binaries in the CNI bin dir, the meta config and the
    /// credentials directory in the CNI conf dir.
    pub fn plexus_files_on_node(&self) -> Vec<String> {
        let mut found = Vec::new();
        for dir in [self.var("CNI_BIN_DIR"), self.var("CNI_CONF_DIR")] {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.contains("plexus") {
                    found.push(format!("{dir}/{name}"));
                }
            }
        }
        found.sort();
        found
    }

    /// [`Cluster::uninstall`] of an installed plexus: its 8 files on the node before, none after,
    /// the cluster network kept, no cluster-wide RBAC of plexus left.
    pub fn uninstall_leaving_nothing(&self, with: &str, daemon_mode: bool) {
        assert_eq!(self.plexus_files_on_node().len(), 8, "{:?}", self.plexus_files_on_node());
        self.uninstall(with, daemon_mode);
        assert_eq!(self.plexus_files_on_node(), Vec::<String>::new());
        assert!(Path::new(self.var("CLUSTER_NETWORK")).exists());
        let (_, left) = self.kubectl(&["get", "clusterrole,clusterrolebinding", "-o", "name"], None);
        assert!(!left.contains("/plexus"), "{left}");
    }

    /// `cluster-install.sh --uninstall`, as README says for the way it was installed.
    pub fn uninstall(&self, with: &str, daemon_mode: bool) {
        let out = self
            .script("cluster-install.sh")
            .arg("--uninstall")
            .envs(&self.env)
            .env("PLEXUS_DAEMON_MODE", if daemon_mode { "1" } else { "" })
            .env("PLEXUS_INSTALL_WITH", with)
            .output()
            .unwrap();
        assert!(out.status.success(), "uninstall failed:\n{}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn state(&self) -> &Path {
        Path::new(self.var("KUBECONFIG")).parent().unwrap()
    }

    pub fn data(&self) -> PathBuf {
        self.state().join("data")
    }

    /// A peer binary run in the node's network namespace.
    pub fn peer(&self, tool: &str, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        self.peer_on(1, tool, args, stdin)
    }

    /// A peer binary run in node `k`'s network namespace.
    pub fn peer_on(&self, k: u32, tool: &str, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        use std::io::Write;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.node_netns(k)])
            .arg(Path::new(self.var("PEERS_BIN")).join(tool))
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

    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        let mut all = vec!["--kubeconfig", self.var("KUBECONFIG")];
        all.extend_from_slice(args);
        self.peer("kubectl", &all, stdin)
    }

    pub fn crictl(&self, args: &[&str]) -> (bool, String) {
        self.crictl_on(1, args)
    }

    /// crictl against node `k`'s containerd.
    pub fn crictl_on(&self, k: u32, args: &[&str]) -> (bool, String) {
        let endpoint = format!("unix://{}/containerd.sock", self.node_files(k).display());
        let mut all = vec!["--runtime-endpoint", endpoint.as_str(), "--timeout", "60s"];
        all.extend_from_slice(args);
        self.peer_on(k, "crictl", &all, None)
    }

    /// Node `k`'s network namespace (node 1: `NODE_NETNS`).
    pub fn node_netns(&self, k: u32) -> &str {
        if k == 1 { self.var("NODE_NETNS") } else { self.var(&format!("NODE_NETNS_{k}")) }
    }

    /// Node `k`'s name (node 1: `NODE_NAME`).
    pub fn node_name(&self, k: u32) -> &str {
        if k == 1 { self.var("NODE_NAME") } else { self.var(&format!("NODE_NAME_{k}")) }
    }

    /// Node `k`'s files as the host sees them: node 1's are the state dir; node K's are bound
    /// over the state dir's paths inside its own mount namespace.
    pub fn node_files(&self, k: u32) -> PathBuf {
        if k == 1 { self.state().to_path_buf() } else { PathBuf::from(self.var(&format!("NODE_STATE_{k}"))) }
    }

    /// Node `k`'s mount namespace (where its paths under the state dir are its own).
    pub fn node_mount_ns(&self, k: u32) -> PathBuf {
        self.node_files(k).join("mnt")
    }

    /// The PID of the pod's ready sandbox on node `k` (its network namespace is
    /// `/proc/PID/ns/net`, reachable from the host).
    pub fn sandbox_pid(&self, k: u32, ns: &str, name: &str) -> u32 {
        let id = self.sandbox_on(k, ns, name).unwrap_or_else(|| panic!("{ns}/{name} has no ready sandbox on node {k}"));
        let (ok, out) = self.crictl_on(k, &["inspectp", "-o", "go-template", "--template", "{{.info.pid}}", &id]);
        assert!(ok, "{out}");
        out.lines().find_map(|l| l.trim().parse().ok()).unwrap_or_else(|| panic!("no pid for {ns}/{name}: {out}"))
    }

    pub fn apply(&self, yaml: &str) {
        let (ok, out) = self.kubectl(&["apply", "-f", "-"], Some(yaml));
        assert!(ok, "kubectl apply: {out}");
    }

    pub fn pod_json(&self, ns: &str, name: &str) -> Value {
        let (ok, out) = self.kubectl(&["-n", ns, "get", "pod", name, "-o", "json"], None);
        assert!(ok, "{out}");
        serde_json::from_str(&out).unwrap()
    }

    /// The pod's network-status annotation, as the API server has it.
    pub fn network_status(&self, ns: &str, name: &str) -> Vec<Value> {
        let p = self.pod_json(ns, name);
        let text = p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"]
            .as_str()
            .unwrap_or_else(|| panic!("{ns}/{name} has no network-status: {p}"));
        serde_json::from_str::<Value>(text).unwrap().as_array().unwrap().clone()
    }

    pub fn wait_ready(&self, ns: &str, what: &str, timeout: &str) {
        let t = format!("--timeout={timeout}");
        let (ok, out) = self.kubectl(&["-n", ns, "wait", "--for=condition=Ready", what, &t], None);
        assert!(ok, "{ns}/{what} not Ready: {out}\n{}", self.kubectl(&["-n", ns, "describe", what], None).1);
    }

    pub fn delete(&self, ns: &str, what: &[&str]) {
        let mut args = vec!["-n", ns, "delete", "--wait=true", "--timeout=300s"];
        args.extend_from_slice(what);
        let (ok, out) = self.kubectl(&args, None);
        assert!(ok, "{out}");
    }

    /// The IPv4 addresses of a pod's interfaces, as the pod sees them (`net1 198.18.240.1/24`).
    pub fn pod_addrs(&self, ns: &str, name: &str) -> BTreeSet<String> {
        self.try_pod_addrs(ns, name).unwrap_or_else(|out| panic!("{out}"))
    }

    /// [`Cluster::pod_addrs`], or why `kubectl exec` failed (a recreated sandbox whose container
    /// is not started yet).
    pub fn try_pod_addrs(&self, ns: &str, name: &str) -> Result<BTreeSet<String>, String> {
        let (ok, out) = self.kubectl(&["-n", ns, "exec", name, "--", "ip", "-o", "-4", "addr"], None);
        if !ok {
            return Err(out);
        }
        Ok(out
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() > 3 && f[1].starts_with("net")).then(|| format!("{} {}", f[1], f[3]))
            })
            .collect())
    }

    /// The events of one object, their messages joined.
    pub fn events(&self, ns: &str, name: &str) -> String {
        let selector = format!("involvedObject.name={name}");
        let (_, out) = self.kubectl(
            &["-n", ns, "get", "events", "--field-selector", &selector, "-o", "jsonpath={.items[*].message}"],
            None,
        );
        out
    }

    pub fn wait_event(&self, ns: &str, name: &str, text: &str) {
        let start = Instant::now();
        while !self.events(ns, name).contains(text) {
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "{text:?} not in the events of {ns}/{name} within 90 s; they are: {}\nplexus.log's warnings:\n{}\nplexus.log ends:\n{}",
                self.events(ns, name),
                self.plexus_log()
                    .lines()
                    .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
                    .take(20)
                    .collect::<Vec<_>>()
                    .join("\n"),
                self.plexus_log_tail(40)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Addresses plexus-ipam holds (files in every domain's `ips/`).
    pub fn reservations(&self) -> usize {
        let Ok(domains) = std::fs::read_dir(self.data().join("ipam")) else { return 0 };
        domains.flatten().map(|d| std::fs::read_dir(d.path().join("ips")).map(|r| r.count()).unwrap_or(0)).sum()
    }

    /// Entries in a data directory (`meta`: the meta-plugin's cache; `hd`: host-device state),
    /// plexus's mark of a data directory left out.
    pub fn data_files(&self, sub: &str) -> usize {
        self.data_names(sub).len()
    }

    pub fn data_names(&self, sub: &str) -> Vec<String> {
        self.data_names_on(1, sub)
    }

    /// [`Cluster::data_names`] on node `k`.
    pub fn data_names_on(&self, k: u32, sub: &str) -> Vec<String> {
        let entries = std::fs::read_dir(self.node_files(k).join("data").join(sub));
        let names: Vec<String> = entries
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.into_iter().filter(|n| n != ".plexus-data").collect()
    }

    /// Waits for host-device state and the meta-plugin's cache to be empty; names what is left.
    pub fn wait_no_state_or_cache(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.data_files("hd") + self.data_files("meta") > 0 {
            let left = (self.data_names("hd"), self.data_names("meta"));
            assert!(Instant::now() < deadline, "state or cache left after 30 s (hd, meta): {left:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn node_ip(&self, args: &[&str]) -> String {
        let out = Command::new("ip").args(["-n", self.var("NODE_NETNS")]).args(args).output().unwrap();
        assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn node_link_up(&self, name: &str) -> bool {
        self.node_link_up_on(1, name)
    }

    /// Whether node `k` has link `name`, up.
    pub fn node_link_up_on(&self, k: u32, name: &str) -> bool {
        let out = Command::new("ip").args(["-n", self.node_netns(k), "-j", "link", "show", name]).output().unwrap();
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("\"UP\"")
    }

    /// The node namespace's links and addresses, the cluster's own pod veths left out (the
    /// bootstrap bridge plugin's bridge cni0 and veths): what a leak would change.
    pub fn node_state(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        let links: Value = serde_json::from_str(&self.node_ip(&["-j", "link"])).unwrap();
        let addrs: Value = serde_json::from_str(&self.node_ip(&["-j", "addr"])).unwrap();
        let ours = |name: &str| !name.starts_with("veth") && name != "cni0";
        let links = links
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["ifname"].as_str().unwrap().to_string())
            .filter(|n| ours(n))
            .collect();
        let addrs = addrs
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| ours(l["ifname"].as_str().unwrap()))
            .flat_map(|l| {
                let name = l["ifname"].as_str().unwrap().to_string();
                l["addr_info"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(move |a| format!("{name} {}", a["local"]))
                    .collect::<Vec<_>>()
            })
            .collect();
        (links, addrs)
    }

    /// CNI ADDs containerd started so far (its debug log's "begin cni setup").
    pub fn cni_adds(&self) -> usize {
        std::fs::read_to_string(self.state().join("log/containerd.log"))
            .unwrap_or_default()
            .matches("begin cni setup")
            .count()
    }

    /// `cluster.sh stop|start|restart|kill DAEMON`.
    pub fn daemon(&self, action: &str, name: &str) {
        self.daemon_on(1, action, name)
    }

    /// `cluster.sh stop|start|restart|kill DAEMON --node K`.
    pub fn daemon_on(&self, k: u32, action: &str, name: &str) {
        let out = self.script("cluster.sh").args([action, name, "--node", &k.to_string()]).output().unwrap();
        assert!(
            out.status.success(),
            "cluster.sh {action} {name} --node {k}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The ID of the pod's ready sandbox, if it has one.
    pub fn sandbox(&self, ns: &str, name: &str) -> Option<String> {
        self.sandbox_on(1, ns, name)
    }

    /// [`Cluster::sandbox`] on node `k`.
    pub fn sandbox_on(&self, k: u32, ns: &str, name: &str) -> Option<String> {
        let (ok, out) = self.crictl_on(k, &["pods", "--namespace", ns, "--name", name, "--state", "ready", "-q"]);
        assert!(ok, "{out}");
        out.lines().next().map(str::to_string)
    }

    pub fn nad(&self, ns: &str, name: &str, config: &str) -> String {
        format!(
            "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  config: '{config}'\n---\n"
        )
    }

    pub fn ipam(&self, range: &str) -> String {
        format!(r#""ipam": {{"type": "plexus-ipam", "range": "{range}", "dataDir": "{}/ipam"}}"#, self.data().display())
    }

    pub fn macvlan_nad(&self, ns: &str, name: &str, master: &str, range: &str) -> String {
        let ipam = self.ipam(range);
        self.nad(
            ns,
            name,
            &format!(r#"{{"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "{master}", {ipam}}}"#),
        )
    }

    pub fn hostdev_nad(&self, ns: &str, name: &str, device: &str, range: &str) -> String {
        let (ipam, data) = (self.ipam(range), self.data().display().to_string());
        self.nad(
            ns,
            name,
            &format!(
                r#"{{"cniVersion": "1.0.0", "type": "plexus-host-device", "device": "{device}", "dataDir": "{data}/hd", {ipam}}}"#
            ),
        )
    }

    pub fn pod(&self, ns: &str, name: &str, networks: &str) -> String {
        self.pod_on(ns, name, networks, None)
    }

    /// [`Cluster::pod`], bound to the node named `node` when given.
    pub fn pod_on(&self, ns: &str, name: &str, networks: &str, node: Option<&str>) -> String {
        let node = node.map(|n| format!("  nodeName: {n}\n")).unwrap_or_default();
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels: {{app: plexus-test}}\n  annotations: {{k8s.v1.cni.cncf.io/networks: \"{networks}\"}}\nspec:\n{node}  terminationGracePeriodSeconds: 0\n  containers:\n  - {{name: c, image: {}, imagePullPolicy: Never, command: [\"/bin/sh\", \"-c\", \"sleep 3600\"]}}\n---\n",
            self.var("TEST_IMAGE")
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.script("cluster.sh").arg("down").output();
    }
}

pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

impl Cluster {
    /// The directory of the shipped build (`scripts/build-release.sh`), which the image
    /// `cluster-install.sh` installs carries.
    pub fn release_build(&self) -> PathBuf {
        let built = self.script("build-release.sh").output().unwrap();
        assert!(built.status.success(), "build-release.sh:\n{}", String::from_utf8_lossy(&built.stderr));
        PathBuf::from(String::from_utf8_lossy(&built.stdout).trim())
    }

    /// An image of plexus in the node's containerd, `localhost/plexus:TAG`, made of the binaries in
    /// `bins` (another release's: the image file is this tree's, the same at every release so far).
    pub fn import_image(&self, tag: &str, bins: &Path) {
        let work = tempfile::tempdir().unwrap();
        let archive = work.path().join("image.tar");
        let arch =
            String::from_utf8(Command::new("dpkg").arg("--print-architecture").output().unwrap().stdout).unwrap();
        let out = self
            .script("build-image.sh")
            .env("ARCHES", arch.trim())
            .env("IMAGE", format!("localhost/plexus:{tag}"))
            .env("ARCHIVE", &archive)
            .env("PLEXUS_BIN_DIR", bins)
            .env("PLEXUS_IMAGE_STORE", work.path().join("podman"))
            .output()
            .unwrap();
        assert!(out.status.success(), "build-image.sh:\n{}", String::from_utf8_lossy(&out.stderr));
        let endpoint = self.state().join("containerd.sock");
        let (ok, out) = self.peer(
            "ctr",
            &["-a", endpoint.to_str().unwrap(), "-n", "k8s.io", "images", "import", archive.to_str().unwrap()],
            None,
        );
        assert!(ok, "ctr images import: {out}");
        // Podman's vfs store holds root-owned files it would not let tempfile remove.
        let _ = Command::new("podman")
            .args(["--root", &work.path().join("podman/root").display().to_string()])
            .args(["--runroot", &work.path().join("podman/run").display().to_string()])
            .args(["--storage-driver", "vfs", "rmi", "-a", "-f"])
            .output();
    }

    /// Lines of containerd's log where a CNI ADD or DEL failed.
    pub fn cni_failures(&self) -> Vec<String> {
        std::fs::read_to_string(self.state().join("log/containerd.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                l.contains("failed to setup network for sandbox") || l.contains("failed to destroy network for sandbox")
            })
            .map(str::to_string)
            .collect()
    }
}

/// How a test run of an IPAM plugin is cut short ([`Cluster::ipam_run_on`]).
pub enum Interrupt<'a> {
    /// `PLEXUS_FAULT` (empty: not at all).
    Fault(&'a str),
    /// SIGKILL after this long if it still runs, as a runtime kills a plugin past its timeout,
    /// wherever it is (nsenter execs the plugin: the child is the plugin).
    KillAfter(Duration),
}

impl Cluster {
    /// One run of an IPAM plugin for container `cid` of pod `pod` (a name in `default`, or
    /// `namespace/name`) on node `k`, as that node's runtime runs it: in the node's network and
    /// mount namespaces (node K's data dir is its own), under the node policy, `conf` on stdin.
    /// Its result, or its stdout and stderr when that is not JSON.
    #[allow(clippy::too_many_arguments)]
    pub fn ipam_run_on(
        &self,
        k: u32,
        bin: &Path,
        verb: &str,
        cid: &str,
        pod: &str,
        conf: &Value,
        how: Interrupt,
    ) -> (bool, Value) {
        use std::io::Write;
        let (ns, name) = pod.split_once('/').unwrap_or(("default", pod));
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.node_netns(k)))
            .arg(format!("--mount={}", self.node_mount_ns(k).display()))
            .arg("--")
            .arg(bin)
            .env("CNI_COMMAND", verb)
            .env("CNI_CONTAINERID", cid)
            .env("CNI_NETNS", "/var/run/netns/none")
            .env("CNI_IFNAME", "net1")
            .env("CNI_PATH", bin.parent().unwrap())
            .env("CNI_ARGS", format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}"))
            .env("PLEXUS_POLICY", self.var("PLEXUS_POLICY"))
            .env("PLEXUS_FAULT", if let Interrupt::Fault(f) = how { f } else { "" })
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(conf.to_string().as_bytes()).unwrap();
        if let Interrupt::KillAfter(after) = how {
            std::thread::sleep(after);
            let _ = child.kill(); // our own child, by its PID; gone already is fine
        }
        let out = child.wait_with_output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let v = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| serde_json::json!({"stdout": text(&out.stdout), "stderr": text(&out.stderr)}));
        (out.status.success(), v)
    }
}

impl Cluster {
    /// What the admin does to turn plexus-ipam's `kubernetes` store on: its RBAC, and the policy
    /// naming the node's credentials (the DaemonSet's kubeconfig) and whereabouts' namespace.
    pub fn use_kubernetes_ipam_store(&self) {
        self.apply(&std::fs::read_to_string(repo().join("conf-examples/deploy/rbac-ipam-kubernetes.yaml")).unwrap());
        let kubeconfig = Path::new(self.var("CNI_CONF_DIR")).join("plexus.d/plexus.kubeconfig");
        let policy = serde_json::json!({"dataRoots": [self.data()], "deviceInfoDir": self.state().join("devinfo"),
            "kubernetes": {"kubeconfig": kubeconfig, "namespace": "kube-system"}});
        std::fs::write(self.var("PLEXUS_POLICY"), policy.to_string()).unwrap();
    }

    /// plexus-ipam's pools (`poolName`) on this cluster: the chart's Role for them, and the node
    /// policy's `kubernetes` with the pools in kube-system.
    pub fn use_ipam_pools(&self) {
        self.use_kubernetes_ipam_store();
        self.apply(&std::fs::read_to_string(repo().join("conf-examples/deploy/rbac-ipam-pools.yaml")).unwrap());
        let mut policy: Value =
            serde_json::from_str(&std::fs::read_to_string(self.var("PLEXUS_POLICY")).unwrap()).unwrap();
        policy["kubernetes"]["poolNamespace"] = "kube-system".into();
        std::fs::write(self.var("PLEXUS_POLICY"), policy.to_string()).unwrap();
    }

    /// A whereabouts object in kube-system (`ippools`, `overlappingrangeipreservations`), if it
    /// exists.
    pub fn whereabouts_object(&self, kind: &str, name: &str) -> Option<Value> {
        let (ok, out) = self.kubectl(
            &["-n", "kube-system", "get", &format!("{kind}.whereabouts.cni.cncf.io"), name, "-o", "json"],
            None,
        );
        if !ok {
            assert!(out.contains("NotFound"), "{out}");
            return None;
        }
        Some(serde_json::from_str(&out).unwrap())
    }

    /// The entries of an IPPool (offset → entry); none when it does not exist.
    pub fn pool_entries(&self, pool: &str) -> serde_json::Map<String, Value> {
        self.whereabouts_object("ippools", pool)
            .and_then(|p| p["spec"]["allocations"].as_object().cloned())
            .unwrap_or_default()
    }

    /// whereabouts' flat configuration file (its `configuration_path`): the Kubernetes store,
    /// with the admin's kubeconfig.
    pub fn whereabouts_flat_conf(&self) -> PathBuf {
        let flat = self.state().join("whereabouts.conf");
        let conf = serde_json::json!({"datastore": "kubernetes", "kubernetes": {"kubeconfig": self.var("KUBECONFIG")}});
        std::fs::write(&flat, conf.to_string()).unwrap();
        flat
    }

    /// A plexus binary (plexusctl) run in the node's network namespace under the node's policy.
    pub fn plexus_tool(&self, tool: &str, args: &[&str], envs: &[(&str, &Path)]) -> (bool, String, String) {
        let out = Command::new("ip")
            .args(["netns", "exec", self.var("NODE_NETNS")])
            .arg(crate::plugin_bin(tool))
            .args(args)
            .env("PLEXUS_POLICY", self.var("PLEXUS_POLICY"))
            .envs(envs.iter().copied())
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    }

    /// The items of a `kubectl get … -o json` list (`args` without `-o json`).
    pub fn kubectl_items(&self, args: &[&str]) -> Vec<Value> {
        let args: Vec<&str> = args.iter().copied().chain(["-o", "json"]).collect();
        let (ok, out) = self.kubectl(&args, None);
        assert!(ok, "{out}");
        let list: Value = serde_json::from_str(&out).unwrap();
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// The OverlappingRangeIPReservations in kube-system: name → the container ID they hold for.
    pub fn reservation_holders(&self) -> BTreeMap<String, String> {
        self.kubectl_items(&["-n", "kube-system", "get", "overlappingrangeipreservations.whereabouts.cni.cncf.io"])
            .iter()
            .map(|r| {
                let s = |p: &str| r.pointer(p).and_then(Value::as_str).unwrap_or_default().to_string();
                (s("/metadata/name"), s("/spec/containerid"))
            })
            .collect()
    }

    /// The names of the OverlappingRangeIPReservations.
    pub fn reservation_names(&self) -> BTreeSet<String> {
        self.reservation_holders().into_keys().collect()
    }
}

impl Cluster {
    /// plexus-daemon's metrics, from the node's loopback (the DaemonSet's --metrics-address).
    pub fn daemon_metrics(&self) -> String {
        let netns = Path::new("/run/netns").join(self.var("NODE_NETNS"));
        let (code, body) = crate::daemon::http_get(&netns, crate::daemon::METRICS_PORT, "/metrics")
            .expect("plexus-daemon's /metrics answers");
        assert_eq!(code, 200, "{body}");
        body
    }

    /// The PID of this cluster's plexus-daemon (the one serving its socket), if it runs.
    pub fn daemon_pid(&self) -> Option<u32> {
        let socket = format!("--socket={}", self.state().join("run/plexus-daemon.sock").display());
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let ours = args.first()?.ends_with(b"/plexus-daemon") && args.contains(&socket.as_bytes());
            ours.then_some(pid)
        })
    }

    /// The last `n` lines of [`Cluster::plexus_log`].
    pub fn plexus_log_tail(&self, n: usize) -> String {
        let log = self.plexus_log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The shims' and the daemon's requests' log (the meta config's logFile).
    pub fn plexus_log(&self) -> String {
        std::fs::read_to_string(self.state().join("log/plexus.log")).unwrap_or_default()
    }
}
