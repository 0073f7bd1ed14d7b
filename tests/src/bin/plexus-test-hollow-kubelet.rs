//! What a hollow node's kubelet does for plexus (scripts/lib/hollow.sh; docs/hollow-nodes.md),
//! for every hollow node of one cluster in one process:
//!
//! - registers the node's DRA plugin as the kubelet's plugin watcher does (each socket that
//!   appears in the node's `plugins_registry/`: `GetInfo`, then `NotifyRegistrationStatus`);
//! - for every pod bound to the node (one watch per node, by `spec.nodeName`, as a kubelet's),
//!   makes a sandbox network namespace and runs the CNI ADD of the node's installed conflist
//!   through its plugins (the `plexus` shim), in the node's network namespace, with the CNI_ARGS
//!   containerd gives (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_INFRA_CONTAINER_ID`,
//!   `K8S_POD_UID`); a failed ADD is DEL'd and tried again, as the kubelet does (here at most
//!   five times, a second apart);
//! - once the pod is being deleted, runs the DEL and removes the namespace.
//!
//! kwok keeps the pods' status: its stages (hollow.sh) make a pod Ready only once it carries
//! the annotation `plexus.dev/hollow-sandbox` (written here after a successful ADD) and delete a
//! deleted pod only once it carries `plexus.dev/hollow-released` (after the DEL), so a pod is
//! Ready when its networks are attached and gone when they are released, as on a real node.
//!
//! Every CNI call is one JSON line in the timings file: node, pod, verb, attempt, the call's
//! start (Unix ms) and duration (ms), and its error. Run as `plexus-test-hollow-kubelet CONFIG`,
//! CONFIG a JSON file: `{"kubeconfig", "timings", "netnsPrefix", "nodes": [{"name", "netns",
//! "confFile", "binDir", "registry"?, "env"?}]}` (`env`: the runtime's variables its plugins
//! get, e.g. `PLEXUS_POLICY`); SIGTERM ends it (hollow.sh's `down` removes the
//! sandboxes' namespaces by their prefix).

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde::Deserialize;
use serde_json::{Value, json};

/// The annotation a pod gets once its sandbox's ADD succeeded (kwok's pod-ready stage waits for it).
const SANDBOX: &str = "plexus.dev/hollow-sandbox";
/// The annotation a deleted pod gets once its sandbox's DEL ran (kwok's pod-delete stage waits for it).
const RELEASED: &str = "plexus.dev/hollow-released";
/// ADD attempts of one pod before the stand-in gives up on it (the kubelet would go on, backing off).
const ATTEMPTS: u32 = 5;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Config {
    kubeconfig: PathBuf,
    timings: PathBuf,
    netns_prefix: String,
    nodes: Vec<NodeConfig>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeConfig {
    name: String,
    netns: String,
    conf_file: PathBuf,
    bin_dir: PathBuf,
    #[serde(default)]
    registry: Option<PathBuf>,
    /// What the node's runtime has in its environment for its plugins (`PLEXUS_POLICY`).
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
}

/// One pod's sandbox, as the stand-in knows it.
#[derive(Clone, PartialEq)]
enum Sandbox {
    /// ADD under way; `deleted`: the pod was deleted meanwhile (the DEL follows the ADD).
    Adding {
        deleted: bool,
    },
    Up {
        id: String,
    },
    Releasing,
    /// Every attempt failed; nothing of it is left.
    Failed,
    /// On the host's network: no sandbox of its own.
    HostNetwork,
}

struct Node {
    conf: NodeConfig,
    /// The node's network namespace, where its plugins run.
    netns: OwnedFd,
    sandboxes: Mutex<HashMap<String, Sandbox>>,
    prefix: String,
    timings: Arc<Mutex<File>>,
    client: kube::Client,
}

/// The pod's facts the CNI calls need.
#[derive(Clone)]
struct PodKey {
    namespace: String,
    name: String,
    uid: String,
}

fn main() {
    let path = std::env::args().nth(1).expect("usage: plexus-test-hollow-kubelet CONFIG");
    let config: Config = serde_json::from_slice(&std::fs::read(&path).expect("read the config"))
        .unwrap_or_else(|e| panic!("config {path}: {e}"));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(run(config));
}

async fn run(config: Config) {
    let mut kube_config = plexus_k8s::api::kube_config(Some(&config.kubeconfig), Duration::from_secs(10))
        .await
        .expect("kubeconfig")
        .expect("a kubeconfig");
    // Watches stay open longer than any one call.
    kube_config.read_timeout = None;
    let client = kube::Client::try_from(kube_config).expect("client");
    let timings =
        Arc::new(Mutex::new(File::options().create(true).append(true).open(&config.timings).expect("timings file")));
    let mut tasks = Vec::new();
    for conf in config.nodes {
        let netns = File::open(Path::new("/run/netns").join(&conf.netns))
            .unwrap_or_else(|e| panic!("node {}: netns {}: {e}", conf.name, conf.netns));
        let node = Arc::new(Node {
            conf,
            netns: netns.into(),
            sandboxes: Mutex::new(HashMap::new()),
            prefix: config.netns_prefix.clone(),
            timings: timings.clone(),
            client: client.clone(),
        });
        if let Some(registry) = node.conf.registry.clone() {
            tasks.push(tokio::spawn(register_plugins(node.conf.name.clone(), registry)));
        }
        tasks.push(tokio::spawn(watch_pods(node)));
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    for t in tasks {
        t.abort();
    }
}

/// The kubelet's plugin watcher for one node: every socket that appears in its registry (a new
/// file, or a new one at a known path: the plugin restarted) is registered.
async fn register_plugins(node: String, registry: PathBuf) {
    let mut registered: HashMap<PathBuf, u64> = HashMap::new();
    loop {
        if let Ok(entries) = std::fs::read_dir(&registry) {
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
                if path.extension().is_none_or(|e| e != "sock") || registered.get(&path) == Some(&meta.ino()) {
                    continue;
                }
                match plexus_dra::kubelet::client::register(&path).await {
                    Ok(info) => {
                        eprintln!("{node}: registered {} ({})", info.name, info.endpoint);
                        registered.insert(path, meta.ino());
                    }
                    Err(e) => eprintln!("{node}: register {}: {}", path.display(), e.message()),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The node's pods, as its kubelet watches them.
async fn watch_pods(node: Arc<Node>) {
    let api: Api<Pod> = Api::all(node.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", node.conf.name));
    let mut events = watcher(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => seen(&node, &pod),
            Ok(watcher::Event::Delete(pod)) => gone(&node, &pod),
            Ok(_) => {}
            Err(e) => eprintln!("{}: watch: {e}", node.conf.name),
        }
    }
}

fn key(pod: &Pod) -> Option<PodKey> {
    Some(PodKey {
        namespace: pod.metadata.namespace.clone()?,
        name: pod.metadata.name.clone()?,
        uid: pod.metadata.uid.clone()?,
    })
}

/// A pod as it is now: a new one gets its sandbox, a deleted one loses it. A pod on the host's
/// network gets no CNI call (as with the kubelet): it is Ready at once and goes when deleted.
fn seen(node: &Arc<Node>, pod: &Pod) {
    let Some(key) = key(pod) else { return };
    let deleted = pod.metadata.deletion_timestamp.is_some();
    let mut sandboxes = node.sandboxes.lock().unwrap();
    let state = sandboxes.get(&key.uid).cloned();
    if pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false) {
        if state.is_none() {
            sandboxes.insert(key.uid.clone(), Sandbox::HostNetwork);
            tokio::spawn(annotate(node.clone(), key, SANDBOX, "hostNetwork".into()));
        } else if deleted && state == Some(Sandbox::HostNetwork) {
            sandboxes.insert(key.uid.clone(), Sandbox::Releasing);
            tokio::spawn(annotate(node.clone(), key, RELEASED, "true".into()));
        }
        return;
    }
    match (state, deleted) {
        (None, false) => {
            sandboxes.insert(key.uid.clone(), Sandbox::Adding { deleted: false });
            tokio::spawn(add(node.clone(), key));
        }
        (Some(Sandbox::Adding { .. }), true) => {
            sandboxes.insert(key.uid.clone(), Sandbox::Adding { deleted: true });
        }
        (Some(Sandbox::Up { id }), true) => {
            sandboxes.insert(key.uid.clone(), Sandbox::Releasing);
            tokio::spawn(release(node.clone(), key, id));
        }
        // Deleted before the stand-in made anything, or after every attempt failed.
        (None | Some(Sandbox::Failed), true) => {
            sandboxes.insert(key.uid.clone(), Sandbox::Releasing);
            tokio::spawn(annotate(node.clone(), key, RELEASED, "true".into()));
        }
        _ => {}
    }
}

/// A pod gone from the API: whatever of it is still up is released.
fn gone(node: &Arc<Node>, pod: &Pod) {
    let Some(key) = key(pod) else { return };
    let state = node.sandboxes.lock().unwrap().remove(&key.uid);
    if let Some(Sandbox::Up { id }) = state {
        let node = node.clone();
        tokio::spawn(async move {
            let _ = teardown(node, key, id).await;
        });
    }
}

async fn add(node: Arc<Node>, key: PodKey) {
    let uid_hex: String = key.uid.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    for attempt in 1..=ATTEMPTS {
        let id = format!("{uid_hex:0>32}{attempt:032x}");
        let ok = {
            let (node, key, id) = (node.clone(), key.clone(), id.clone());
            tokio::task::spawn_blocking(move || sandbox_add(&node, &key, &id, attempt)).await.unwrap_or(false)
        };
        let deleted =
            matches!(node.sandboxes.lock().unwrap().get(&key.uid), Some(Sandbox::Adding { deleted: true }) | None);
        if ok {
            if deleted {
                node.sandboxes.lock().unwrap().insert(key.uid.clone(), Sandbox::Releasing);
                release(node, key, id).await;
            } else {
                node.sandboxes.lock().unwrap().insert(key.uid.clone(), Sandbox::Up { id: id.clone() });
                annotate(node, key, SANDBOX, id).await;
            }
            return;
        }
        if deleted {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let deleted = matches!(node.sandboxes.lock().unwrap().get(&key.uid), Some(Sandbox::Adding { deleted: true }));
    node.sandboxes.lock().unwrap().insert(key.uid.clone(), Sandbox::Failed);
    if deleted {
        annotate(node, key, RELEASED, "true".into()).await;
    }
}

/// The sandbox's namespace and its ADD; on failure its DEL and the namespace removed.
fn sandbox_add(node: &Node, key: &PodKey, id: &str, attempt: u32) -> bool {
    let netns = node.sandbox_netns(key);
    if let Err(e) = ip_netns("add", &netns) {
        eprintln!("{}: {}/{}: {e}", node.conf.name, key.namespace, key.name);
        return false;
    }
    match node.cni("ADD", key, id, &netns, attempt) {
        Ok(()) => true,
        Err(_) => {
            let _ = node.cni("DEL", key, id, &netns, attempt);
            let _ = ip_netns("delete", &netns);
            false
        }
    }
}

async fn release(node: Arc<Node>, key: PodKey, id: String) {
    if teardown(node.clone(), key.clone(), id).await {
        annotate(node, key, RELEASED, "true".into()).await;
    }
}

/// The sandbox's DEL, then its namespace removed: whether the DEL succeeded.
async fn teardown(node: Arc<Node>, key: PodKey, id: String) -> bool {
    tokio::task::spawn_blocking(move || {
        let netns = node.sandbox_netns(&key);
        let ok = node.cni("DEL", &key, &id, &netns, 1).is_ok();
        let _ = ip_netns("delete", &netns);
        ok
    })
    .await
    .unwrap_or(false)
}

async fn annotate(node: Arc<Node>, key: PodKey, annotation: &str, value: String) {
    let api: Api<Pod> = Api::namespaced(node.client.clone(), &key.namespace);
    let patch = json!({"metadata": {"annotations": {annotation: value}}});
    if let Err(e) = api.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        eprintln!("{}: annotate {}/{}: {e}", node.conf.name, key.namespace, key.name);
    }
}

fn ip_netns(verb: &str, name: &str) -> Result<(), String> {
    let out = Command::new("ip").args(["netns", verb, name]).output().map_err(|e| format!("ip netns: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!("ip netns {verb} {name}: {}", String::from_utf8_lossy(&out.stderr).trim())),
    }
}

impl Node {
    fn sandbox_netns(&self, key: &PodKey) -> String {
        format!("{}{}", self.prefix, key.uid)
    }

    /// One CNI operation of the node's conflist, as libcni runs it: each plugin in order for ADD
    /// (each given the result before it), in reverse for DEL; timed and recorded as one call.
    fn cni(&self, verb: &str, key: &PodKey, id: &str, netns: &str, attempt: u32) -> Result<(), String> {
        let started = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
        let clock = Instant::now();
        let result = self.run_conflist(verb, key, id, netns);
        let ms = clock.elapsed().as_secs_f64() * 1000.0;
        let line = json!({
            "node": self.conf.name, "namespace": key.namespace, "pod": key.name, "verb": verb,
            "attempt": attempt, "start_ms": started as u64, "ms": ms,
            "error": result.as_ref().err(),
        });
        let _ = writeln!(self.timings.lock().unwrap(), "{line}");
        if let Err(e) = &result {
            eprintln!("{}: {verb} {}/{}: {e}", self.conf.name, key.namespace, key.name);
        }
        result
    }

    fn run_conflist(&self, verb: &str, key: &PodKey, id: &str, netns: &str) -> Result<(), String> {
        let list: Value = serde_json::from_slice(
            &std::fs::read(&self.conf.conf_file).map_err(|e| format!("{}: {e}", self.conf.conf_file.display()))?,
        )
        .map_err(|e| format!("{}: {e}", self.conf.conf_file.display()))?;
        let mut plugins: Vec<Value> = list["plugins"].as_array().cloned().unwrap_or_default();
        if verb == "DEL" {
            plugins.reverse();
        }
        let mut prev: Option<Value> = None;
        for mut plugin in plugins {
            plugin["name"] = list["name"].clone();
            plugin["cniVersion"] = list["cniVersion"].clone();
            if let Some(prev) = &prev {
                plugin["prevResult"] = prev.clone();
            }
            let kind = plugin["type"].as_str().ok_or("a plugin without a type")?.to_string();
            let out = self.exec(&kind, verb, key, id, netns, &plugin)?;
            if verb == "ADD" {
                prev = Some(serde_json::from_slice(&out).map_err(|e| format!("{kind}: its result: {e}"))?);
            }
        }
        Ok(())
    }

    fn exec(
        &self,
        kind: &str,
        verb: &str,
        key: &PodKey,
        id: &str,
        netns: &str,
        conf: &Value,
    ) -> Result<Vec<u8>, String> {
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={id};K8S_POD_UID={}",
            key.namespace, key.name, key.uid
        );
        let mut cmd = Command::new(self.conf.bin_dir.join(kind));
        cmd.env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", verb)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", format!("/run/netns/{netns}"))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", &self.conf.bin_dir)
            .env("CNI_ARGS", args)
            .envs(&self.conf.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let fd = self.netns.try_clone().map_err(|e| format!("netns: {e}"))?;
        // SAFETY: setns is a single system call, async-signal-safe between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                nix::sched::setns(fd.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
            });
        }
        let mut child = cmd.spawn().map_err(|e| format!("{kind}: {e}"))?;
        let stdin = serde_json::to_vec(conf).map_err(|e| e.to_string())?;
        if let Some(mut input) = child.stdin.take() {
            input.write_all(&stdin).map_err(|e| format!("{kind}: stdin: {e}"))?;
        }
        let out = child.wait_with_output().map_err(|e| format!("{kind}: {e}"))?;
        match out.status.success() {
            true => Ok(out.stdout),
            false => {
                let err: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
                Err(format!(
                    "{kind} {verb}: code {} {} {}",
                    err["code"],
                    err["msg"].as_str().unwrap_or(""),
                    err["details"].as_str().unwrap_or_else(|| std::str::from_utf8(&out.stderr).unwrap_or("").trim())
                ))
            }
        }
    }
}
