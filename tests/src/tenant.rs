//! The tenant attacks' node: one "RoCE port" pair, a pod, and a temp dir holding NADs (from files,
//! as `nadDir`), the meta cache, spy delegates and victim files; plexus run the way a runtime runs
//! it, and delegates run directly the way Multus would. `tests/tests/trust_boundary.rs` and
//! `tests/tests/tenant_isolation.rs` mount their attacks on it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::{DaemonProcess, DataDir, Lab, Outcome, PluginRun, REFERENCE_CNI_DIR, plugin_bin, write_policy};

/// The UID of the pod [`Node::claim`] prepares claims for.
pub const POD_UID: &str = "99999999-8888-7777-6666-555555555555";

/// The directory of the plugins under test.
pub fn bin_dir() -> PathBuf {
    plugin_bin("plexus").parent().unwrap().to_path_buf()
}

/// A node with one "RoCE port", a pod, and a temp dir holding NADs, the meta cache, IPAM data,
/// spy delegates and victim files.
pub struct Node {
    pub lab: Lab,
    pub dir: tempfile::TempDir,
    /// plexus-ipam's data directory (a direct child of the data root, as the policy wants).
    pub ipam: DataDir,
    pub policy: PathBuf,
}

impl Default for Node {
    fn default() -> Node {
        Node::with_policy(json!({}))
    }
}

impl Node {
    pub fn new() -> Node {
        Node::default()
    }

    /// A node whose policy is the tests' (temp dirs are data roots) plus `extra`.
    pub fn with_policy(extra: Value) -> Node {
        let lab = Lab::new();
        lab.add_nic("nic0", 9000);
        lab.add_nic("nic1", 9000);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("nads")).unwrap();
        std::fs::create_dir_all(dir.path().join("spies")).unwrap();
        let mut policy = json!({"dataRoots": [std::env::temp_dir()]});
        policy.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let policy = write_policy(dir.path(), "policy.json", &policy);
        Node { lab, dir, ipam: DataDir::new("ipam"), policy }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn nad(&self, name: &str, config: &Value) {
        self.nad_with(name, config, "");
    }

    pub fn nad_with(&self, name: &str, config: &Value, annotations: &str) {
        let yaml = format!(
            "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: {name}\n  namespace: default\n{annotations}spec:\n  config: '{config}'\n"
        );
        std::fs::write(self.path("nads").join(format!("{name}.yaml")), yaml).unwrap();
    }

    pub fn macvlan_nad(&self, name: &str, master: &str, range: &str, extra: Value) {
        let mut c = json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": master,
            "ipam": {"type": "plexus-ipam", "range": range, "dataDir": self.ipam}});
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        self.nad(name, &c);
    }

    /// A delegate that records each call (`<ifname>.<verb>.json`: its config) and succeeds.
    pub fn spy(&self, name: &str) {
        let spy = self.path("spies").join(name);
        let d = self.path("spies");
        std::fs::write(
            &spy,
            format!(
                "#!/bin/sh\ncat > {d}/$CNI_IFNAME.$CNI_COMMAND.json\n[ \"$CNI_COMMAND\" = ADD ] && echo '{{\"cniVersion\":\"1.0.0\"}}'\nexit 0\n",
                d = d.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&spy, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    pub fn spied(&self, ifname: &str, verb: &str) -> Option<Value> {
        let f = self.path("spies").join(format!("{ifname}.{verb}.json"));
        std::fs::read(f).ok().map(|b| serde_json::from_slice(&b).unwrap())
    }

    pub fn meta(&self, networks: &str) -> Value {
        json!({"cniVersion": "1.1.0", "name": "plexus", "type": "plexus", "nadDir": self.path("nads"),
               "networks": networks, "cniDir": self.path("cache"), "binDir": bin_dir()})
    }

    pub fn cni_path(&self) -> String {
        format!("{}:{}:{REFERENCE_CNI_DIR}", self.path("spies").display(), bin_dir().display())
    }

    pub fn plexus(&self, verb: &str, c: &Value) -> Outcome {
        self.plexus_with(verb, c, |r| r)
    }

    pub fn plexus_with(&self, verb: &str, c: &Value, f: impl Fn(PluginRun) -> PluginRun) -> Outcome {
        f(PluginRun::new(plugin_bin("plexus"), verb)
            .attachment("pod1", &self.lab.pod.path(), "eth0", &self.cni_path())
            .env("PLEXUS_POLICY", self.policy.to_str().unwrap())
            .stdin(c)
            .in_netns(&self.lab.node))
        .run()
    }

    /// A delegate run directly, as Multus runs it.
    pub fn direct(&self, plugin: &str, verb: &str, c: &Value) -> Outcome {
        self.direct_with(plugin, verb, c, |r| r)
    }

    pub fn direct_with(&self, plugin: &str, verb: &str, c: &Value, f: impl Fn(PluginRun) -> PluginRun) -> Outcome {
        f(PluginRun::new(plugin_bin(plugin), verb)
            .attachment("c1", &self.lab.pod.path(), "net1", &self.cni_path())
            .env("PLEXUS_POLICY", self.policy.to_str().unwrap())
            .stdin(c)
            .in_netns(&self.lab.node))
        .run()
    }

    /// An etcd beside the node, the node policy naming it as the store profile `fabric` (prefix
    /// `/plexus-test`).
    pub fn etcd_store(&self) -> crate::etcd::Etcd {
        let etcd = crate::etcd::Etcd::start_in(&self.lab.node);
        let profile = json!({"etcd": {"endpoints": [etcd.endpoint()], "prefix": "/plexus-test", "timeoutMs": 2000}});
        write_policy(
            self.dir.path(),
            "policy.json",
            &json!({"dataRoots": [std::env::temp_dir()], "stores": {"fabric": profile}}),
        );
        etcd
    }

    /// A plexus-daemon serving this node's meta config, with `args` and `env`: the daemon, and
    /// [`Node::meta`] naming its socket (and the shim's log, `shim.log`).
    pub fn daemon(&self, args: &[&str], env: &[(&str, &Path)]) -> (DaemonProcess, Value) {
        std::fs::create_dir_all(self.path("run")).unwrap();
        let socket = self.path("run/daemon.sock");
        let bin = crate::plugin_bin("plexus-daemon");
        let d = DaemonProcess::start_binary(&bin, &self.lab.node.path(), &socket, &self.path("daemon.log"), args, env);
        let mut meta = self.meta("unused");
        meta["daemonSocket"] = json!(socket);
        meta["logFile"] = json!(self.path("shim.log"));
        meta["logLevel"] = json!("debug");
        (d, meta)
    }

    /// A claim `name` as plexus's DRA driver prepares it for the pod [`POD_UID`] (in the claims
    /// directory, `claims`, which [`Node::with_claims`] makes a meta config read): one shared port,
    /// nic0, with `config` as the claim's parameters of the driver (tenant input: `interface`,
    /// `mtu`, `ipam`, `network`, ...).
    pub fn claim(&self, name: &str, config: Value) {
        self.claim_port(name, "nic0", "shared", config);
    }

    /// [`Node::claim`] of `port` (`nic0`, `nic1`) in `mode` (`shared`: a macvlan on it;
    /// `exclusive`: the port itself moved into the pod).
    pub fn claim_port(&self, name: &str, port: &str, mode: &str, config: Value) {
        let n = name.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))) % 1_000_000_000_000;
        let uid = format!("11111111-2222-3333-4444-{n:012}");
        let prepared = json!({"version": 1, "namespace": "default", "name": name, "uid": uid, "pods": [POD_UID],
            "devices": [{"request": "rail", "pool": "node-1", "device": port, "ifname": port, "mode": mode,
                         "pciAddress": "0000:3b:00.0", "rdmaDevice": "mlx5_0", "config": config, "cdiDeviceIds": []}]});
        std::fs::create_dir_all(self.path("claims")).unwrap();
        std::fs::write(self.path("claims").join(format!("{uid}.json")), prepared.to_string()).unwrap();
    }

    /// `meta` reading the claims [`Node::claim`] prepared.
    pub fn with_claims(&self, meta: &Value) -> Value {
        let mut m = meta.clone();
        m["draClaimsDir"] = json!(self.path("claims"));
        m
    }

    /// plexus run for the pod [`POD_UID`] (`default/pod1`), as the kubelet's runtime names it: the
    /// pod whose claims [`Node::claim`] prepared.
    pub fn plexus_for_pod(&self, verb: &str, c: &Value) -> Outcome {
        self.plexus_with(verb, c, |r| {
            r.env("CNI_ARGS", &format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod1;K8S_POD_UID={POD_UID}"))
        })
    }

    pub fn pod_links(&self) -> Vec<String> {
        self.lab.pod.links().into_iter().map(|l| l.ifname).collect()
    }

    pub fn held(&self) -> usize {
        std::fs::read_dir(self.ipam.path().join("default/ips")).map(|d| d.count()).unwrap_or(0)
    }

    /// A file a tenant would like root to overwrite, append to, delete or send.
    pub fn victim(&self, name: &str) -> PathBuf {
        let v = self.path(name);
        std::fs::write(&v, b"keep").unwrap();
        v
    }
}

pub fn assert_untouched(victim: &Path) {
    assert_eq!(std::fs::read(victim).unwrap_or_default(), b"keep", "{} was touched", victim.display());
}

pub fn macvlan_conf(node: &Node, extra: Value) -> Value {
    let mut c = json!({"cniVersion": "1.0.0", "name": "rail0", "type": "plexus-macvlan", "master": "nic0",
        "ipam": {"type": "plexus-ipam", "range": "198.18.40.0/24", "dataDir": node.ipam}});
    c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    c
}
