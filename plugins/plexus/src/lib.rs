//! plexus: the Multus-compatible meta-plugin.
//!
//! ADD: config → wait for the readiness file → the pod's attachments (cluster network, default
//! networks, selected NADs; interface names, device IDs, capability args) → write the delegate
//! cache → the delegates' ADDs (the cluster network first, then the others concurrently, or one
//! after another with `"parallel": false`; each result recorded) → on failure, DEL every one sent
//! an ADD, in reverse, and report the first failed network in annotation order with the
//! delegate's code and message → network-status → the cluster network's result (or all of them
//! combined, in annotation order).
//! DEL: the cache → (else) the attachments rebuilt from the selection → (else) log and succeed;
//! every delegate gets its DEL (the reverse of ADD's order, concurrently where ADD was), and the
//! errors are reported together.

//!
//! The same code runs in `plexus-daemon` (issue: the node daemon), where the cluster is read from
//! the daemon's watch caches ([`ClusterView`]) and the shim forwards its request ([`shim`]).

mod attach;
mod attachment;
mod cache;
mod claimed;
mod cluster;
mod conf;
mod delegates;
mod events;
mod multus;
mod plan;
mod pod;
pub mod shim;
pub mod wire;

use std::sync::Arc;

use attach::{Step, attach_all, delete_all, roll_back};
use attachment::{Attachment, DelegateEnv};
use cluster::{Cluster, cluster, write_status};
use conf::MetaConf;
use delegates::{Chains, Delegates};
use plan::Pod;
use plexus_cni::{CniResult, Command, Error, ErrorList, code};
use plexus_k8s::events::PodEvent;
use plexus_node::files;
use plexus_plugin::logging;
use plexus_plugin::undo::Undo;
use plexus_plugin::{About, Plugin, Request};
use pod::PodNetns;
use serde_json::Value;

pub use cluster::ClusterView;
pub use conf::MetaConf as Config;
pub use delegates::{DelegateCall, Observer, UNKNOWN_TYPE};

/// The meta-plugin's name and version (the shim's and the daemon's).
pub const ABOUT: About =
    About { name: "plexus", version: env!("CARGO_PKG_VERSION"), build: Some(plexus_build_id::BUILD) };

/// The meta-plugin: it runs a request the same way wherever it runs. How a request reaches it is
/// not its concern: the `plexus` binary's shim ([`shim`]) sends it to the daemon first when the
/// config names one, and runs it here only when the daemon does not answer; `plexus-daemon` runs
/// it on its caches. What differs is only where the cluster is read: [`Meta::thin`] asks the API
/// (or `nadDir`) on every call; [`Meta::with_view`] reads the daemon's watch caches. Delegates
/// run through the `delegates` seam, each as the request's runner says (`Request::runner`).
pub struct Meta {
    view: Option<Arc<dyn ClusterView>>,
    delegates: Arc<dyn Delegates>,
}

impl Meta {
    /// The `plexus` binary's: the API (or `nadDir`) read on every call.
    pub fn thin() -> Meta {
        Meta { view: None, delegates: Arc::new(Chains::default()) }
    }

    /// `plexus-daemon`'s: the cluster is `view` when the daemon has an API (else `nadDir`, as in
    /// thin mode).
    pub fn with_view(view: Option<Arc<dyn ClusterView>>) -> Meta {
        Meta { view, ..Meta::thin() }
    }

    /// `observers` are told of every delegate call (the daemon's metrics and spans).
    pub fn observed_by(self, observers: Vec<Arc<dyn Observer>>) -> Meta {
        Meta { delegates: Arc::new(Chains { observers }), ..self }
    }
}

/// The environment every delegate runs with: `binDir` ahead of `CNI_PATH`, `CNI_ARGS` with
/// `IgnoreUnknown` and the pod's identity (what Multus passes), and this invocation's log
/// destination (the admin's: delegates take theirs from here, never from their own config); each
/// runs as the request's runner says.
fn delegate_env(req: &Request, conf: &MetaConf, pod: &Pod) -> DelegateEnv {
    let mut env = req.env.clone();
    if let Some(file) = &req.log.file {
        env.vars.push((logging::LOG_FILE_ENV.into(), file.display().to_string()));
        env.vars.push((logging::LOG_LEVEL_ENV.into(), req.log.level.clone().unwrap_or_default()));
    }
    let mut path = vec![conf.bin_dir.clone()];
    path.extend(req.env.path.iter().filter(|p| **p != conf.bin_dir).cloned());
    env.path = path;
    if !pod.name.is_empty() {
        env.args.set("IgnoreUnknown", "true");
        env.args.set("K8S_POD_NAMESPACE", &pod.namespace);
        env.args.set("K8S_POD_NAME", &pod.name);
        env.args.set("K8S_POD_INFRA_CONTAINER_ID", &pod.infra_container_id);
        env.args.set("K8S_POD_UID", &pod.uid);
    }
    DelegateEnv { cni: env, runner: req.runner.clone() }
}

/// The pod's attachments; a network that would run a meta-plugin or one of plexus's binaries that
/// are not plugins is refused before any runs.
fn attachments_for(
    req: &Request,
    conf: &MetaConf,
    pod: &Pod,
    cluster: &Cluster,
    base: &DelegateEnv,
) -> Result<Vec<Attachment>, Error> {
    let attachments = plan::plan(req, conf, pod, cluster, cluster.selection(conf, pod)?)?;
    for a in &attachments {
        a.refuse_forbidden_plugins(&base.cni.path)?;
    }
    Ok(attachments)
}

/// Attachments a cache recorded, less any that would run a meta-plugin or a binary that is not a
/// plugin (a cache written before plexus refused them): those are logged and left alone, never run.
fn runnable(attachments: Vec<Attachment>, base: &DelegateEnv) -> Vec<Attachment> {
    attachments
        .into_iter()
        .filter(|a| match a.refuse_forbidden_plugins(&base.cni.path) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!("not run: {e}");
                false
            }
        })
        .collect()
}

/// Multus's cache of the request's container, when the config names Multus's directory and it
/// has one (a cache that is not Multus's is logged and left alone).
fn multus_sandbox(conf: &MetaConf, req: &Request) -> Option<multus::Sandbox> {
    let dir = conf.multus_cache_dir.as_ref()?;
    multus::Sandbox::load(dir, &req.env.container_id, &req.env.ifname).unwrap_or_else(|why| {
        tracing::error!("{why}");
        None
    })
}

/// The selection's `default-route`s applied in the pod; the results that changed are recorded
/// again in the cache (a later record replaces an earlier one), so CHECK and DEL see them.
fn apply_default_routes(
    pod: &PodNetns,
    cache_path: &std::path::Path,
    attachments: &mut [Attachment],
    results: &mut [CniResult],
) -> Result<(), Error> {
    for i in pod.apply_default_routes(attachments, results)? {
        let raw = attachments[i].render(&results[i])?;
        cache::record_result(cache_path, i, &raw)?;
        attachments[i].result = Some(raw);
    }
    Ok(())
}

impl Meta {
    /// ADD once the pod and its cluster are known: the attachments planned, cached, attached
    /// (rolled back on failure), and the result with the events to tell the pod.
    fn attach_pod(
        &self,
        req: &Request,
        conf: &MetaConf,
        pod: &Pod,
        base: &DelegateEnv,
        cluster: &Cluster,
    ) -> Result<(CniResult, Vec<PodEvent>), Error> {
        let mut state = cache::Cache {
            version: cache::CACHE_VERSION,
            container_id: req.env.container_id.clone(),
            netns: req.env.netns.clone(),
            pod_ref: pod.reference(),
            attachments: attachments_for(req, conf, pod, cluster, base)?,
        };
        if state.attachments.is_empty() {
            return Err(Error::invalid_config("no network to attach: set clusterNetwork, delegates or networks"));
        }
        // Before any delegate runs, as Multus: the pod's namespace exists and has none of the
        // interface names asked for.
        let pod_netns = PodNetns::open(req.netns().expect("ADD has CNI_NETNS"))?;
        pod_netns.refuse_taken_names(&state.attachments)?;
        let cache_path = cache::path(&conf.cni_dir, &req.env.container_id);
        // A later plexus's cache of this container is neither written over nor, by a rollback,
        // removed.
        if let Err(too_new @ cache::Unusable::TooNew(_)) = cache::load(&cache_path) {
            return Err(too_new.error(&cache_path, code::INTERNAL));
        }
        // Before any delegate runs: a crash from here on leaves what DEL needs.
        cache::save(&cache_path, &state)?;
        let mut undo = Undo::new();
        undo.push(Step::Cache(cache_path.clone()));
        if conf.write_multus_cache
            && let Some(dir) = &conf.multus_cache_dir
        {
            let written = multus::write(dir, &req.env.container_id, &state.attachments);
            match written {
                Ok(path) => undo.push(Step::Cache(path)),
                Err(e) => return Err(roll_back(undo, e, &state.attachments, base, &req.policy, &*self.delegates)),
            }
        }
        // The delegates' ADDs end early enough for their DELs (a rollback) to run in what is left.
        let mut add_env = base.clone();
        add_env.cni.deadline = base.cni.deadline.keeping_for_undo();
        let delegates = &*self.delegates;
        let attached = attach_all(&mut state, conf.parallel, pod, &add_env, &cache_path, &mut undo, delegates)
            .and_then(|mut results| {
                apply_default_routes(&pod_netns, &cache_path, &mut state.attachments, &mut results)
                    .map_err(|e| e.context("default-route"))?;
                write_status(cluster, pod, &state.attachments, &results)
                    .map_err(|e| e.context("set network-status"))?;
                Ok(results)
            });
        let mut results = match attached {
            Ok(results) => results,
            Err(e) => return Err(roll_back(undo, e, &state.attachments, base, &req.policy, delegates)),
        };
        undo.commit();
        let told = events::added(pod, &state.attachments, &results);
        let cluster_network = state.attachments.iter().position(|a| a.cluster_network);
        let result = match cluster_network {
            Some(i) => results.swap_remove(i),
            None => attachment::combine(&results),
        };
        Ok((result, told))
    }
}

impl Plugin for Meta {
    fn known_args(&self) -> &'static [&'static str] {
        &["IP", "MAC", "GATEWAY"]
    }

    /// The meta config is the admin's (the CNI conf dir), unless a delegation ran plexus — then it
    /// is a network's, and refused.
    fn admin_config(&self, req: &Request) -> bool {
        !req.delegated
    }

    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let conf = MetaConf::load(req)?;
        conf.wait_ready(req.env.deadline)?;
        let pod = Pod::from_request(req);
        let base = delegate_env(req, &conf, &pod);
        let cluster = cluster(&conf, self.view.as_ref(), &req.policy)?;
        let added = self.attach_pod(req, &conf, &pod, &base, &cluster);
        if let Cluster::Api(api) = &cluster {
            match &added {
                Ok((_, told)) => events::tell(api.as_ref(), told, req.env.deadline),
                Err(e) => {
                    events::tell(api.as_ref(), &events::add_failed(&pod, e), req.env.deadline);
                    claimed::tell_failed(api.as_ref(), &conf, &pod, e);
                }
            }
        }
        added.map(|(result, _)| result)
    }

    fn del(&self, req: &Request) -> Result<(), Error> {
        if req.delegated {
            // Run by a delegation, plexus does nothing (its ADD is refused): nothing to release.
            tracing::error!(
                "plexus run by a delegation, with a config a network chose: nothing done, nothing to release"
            );
            return Ok(());
        }
        let conf = MetaConf::load(req)?;
        let pod = Pod::from_request(req);
        let base = delegate_env(req, &conf, &pod);
        let cache_path = cache::path(&conf.cni_dir, &req.env.container_id);
        let loaded = cache::load(&cache_path);
        // A sandbox Multus attached (no plexus cache): what it ran, from its cache.
        let from_multus = match &loaded {
            Ok(Some(_)) | Err(cache::Unusable::TooNew(_)) => None,
            _ => multus_sandbox(&conf, req),
        };
        let attachments = if let Some(sandbox) = &from_multus {
            tracing::info!(
                "container {}: attached by Multus, deleting the {} delegate(s) its cache names",
                req.env.container_id,
                sandbox.attachments.len()
            );
            runnable(sandbox.attachments.clone(), &base)
        } else {
            match loaded {
                Ok(Some(c)) => runnable(c.attachments, &base),
                // A later plexus's cache: what it attached is not guessed from the NADs.
                Err(too_new @ cache::Unusable::TooNew(_)) => return Err(too_new.error(&cache_path, code::INTERNAL)),
                other => {
                    if let Err(why) = other {
                        // A cache that does not parse must not make DEL a no-op (Multus #1087).
                        tracing::error!("delegate cache unreadable, rebuilding the attachments: {why}");
                    }
                    match cluster(&conf, self.view.as_ref(), &req.policy)
                        .and_then(|c| attachments_for(req, &conf, &pod, &c, &base))
                    {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::error!("cannot rebuild the attachments, nothing deleted: {e}");
                            let _ = files::remove_if_present(&cache_path);
                            cache::remove_leftovers(&conf.cni_dir, &req.env.container_id);
                            return Ok(());
                        }
                    }
                }
            }
        };
        let errors = delete_all(&attachments, &base, &req.policy, conf.parallel, &*self.delegates);
        if errors.is_empty() || !conf.retry_delete_on_error {
            files::remove_if_present(&cache_path)?;
            match (&from_multus, &conf.multus_cache_dir) {
                (Some(sandbox), _) => sandbox.remove(),
                // The Multus cache plexus wrote beside its own (`writeMultusCache`).
                (None, Some(dir)) => files::remove_if_present(&dir.join(&req.env.container_id))?,
                (None, None) => {}
            }
        }
        cache::remove_leftovers(&conf.cni_dir, &req.env.container_id);
        let n = errors.len();
        let deleted = errors.into_result(code::DELEGATE_FAILED, format!("DEL failed for {n} attachment(s)"));
        if let Err(e) = &deleted
            && let Ok(Cluster::Api(api)) = cluster(&conf, self.view.as_ref(), &req.policy)
        {
            events::tell(api.as_ref(), &events::delete_failed(&pod, e), req.env.deadline);
        }
        deleted
    }

    fn check(&self, req: &Request) -> Result<(), Error> {
        let conf = MetaConf::load(req)?;
        let pod = Pod::from_request(req);
        let base = delegate_env(req, &conf, &pod);
        let cache_path = cache::path(&conf.cni_dir, &req.env.container_id);
        let state =
            cache::load(&cache_path).map_err(|why| why.error(&cache_path, code::CHECK_FAILED))?.ok_or_else(|| {
                Error::new(
                    code::CHECK_FAILED,
                    format!("no attachments recorded for container {}", req.env.container_id),
                )
            })?;
        // Every attachment, not only the cluster network (Multus checks only static delegates).
        for a in &runnable(state.attachments, &base) {
            self.delegates.check(a, &base)?;
        }
        Ok(())
    }

    fn status(&self, req: &Request) -> Result<(), Error> {
        let conf = MetaConf::load(req)?;
        let pod = Pod::default();
        let base = delegate_env(req, &conf, &pod);
        for a in attachments_for(req, &conf, &pod, &cluster(&conf, self.view.as_ref(), &req.policy)?, &base)? {
            a.status_or_gc(&base, Command::Status, None)?;
        }
        Ok(())
    }

    fn gc(&self, req: &Request) -> Result<(), Error> {
        if req.delegated {
            tracing::error!(
                "plexus run by a delegation, with a config a network chose: nothing done, nothing to collect"
            );
            return Ok(());
        }
        let conf = MetaConf::load(req)?;
        let valid = req.valid_attachments()?;
        let pod = Pod::default();
        let base = delegate_env(req, &conf, &pod);
        let mut errors = ErrorList::default();
        cache::remove_stale_leftovers(&conf.cni_dir, std::time::Duration::from_secs(60));
        // Attachments of containers the runtime no longer knows: DEL them from their caches —
        // plexus's, then Multus's of the sandboxes it attached before the node switched.
        let mut kept: Vec<(String, Vec<Attachment>)> = Vec::new();
        let (caches, mut unread) = cache::all(&conf.cni_dir);
        let (sandboxes, multus_unread) = conf.multus_cache_dir.as_deref().map(multus::Sandbox::all).unwrap_or_default();
        // A container plexus attached has its own cache; a Multus cache of it is the one plexus
        // wrote beside it (`writeMultusCache`), removed with it.
        let (written, sandboxes): (Vec<_>, Vec<_>) =
            sandboxes.into_iter().partition(|s| caches.iter().any(|(_, c)| c.container_id == s.container_id));
        // One directory for both (`cniDir` set to Multus's): each reader's leftovers are the other's.
        unread.retain(|c| !sandboxes.iter().chain(&written).any(|s| &s.container_id == c));
        unread.extend(multus_unread.into_iter().filter(|c| !caches.iter().any(|(_, x)| &x.container_id == c)));
        let is_valid = |id: &str| valid.iter().any(|v| v.container_id == id);
        let mut gone = |container_id: &str, netns: Option<std::path::PathBuf>, attachments: Vec<Attachment>| {
            let mut env = base.clone();
            env.cni.container_id = container_id.to_string();
            env.cni.netns = netns;
            let failed = delete_all(&runnable(attachments, &env), &env, &req.policy, conf.parallel, &*self.delegates);
            let ok = failed.is_empty();
            errors.extend(failed);
            ok
        };
        for (path, c) in caches {
            if is_valid(&c.container_id) {
                kept.push((c.container_id, c.attachments));
                continue;
            }
            let id = c.container_id.clone();
            gone(&c.container_id, c.netns, c.attachments);
            let _ = files::remove_if_present(&path);
            written.iter().filter(|s| s.container_id == id).for_each(multus::Sandbox::remove_cache);
        }
        for s in sandboxes {
            if is_valid(&s.container_id) {
                kept.push((s.container_id.clone(), s.attachments.clone()));
            } else if gone(&s.container_id, None, s.attachments.clone()) || !conf.retry_delete_on_error {
                s.remove();
            }
        }
        // Then GC on every delegate network, with the attachments still valid for it — unless a
        // container still valid has a cache this build cannot read: its attachments are not known,
        // and a delegate would take them for stale and release them.
        if let Some(c) = unread.iter().find(|c| is_valid(c)) {
            let why = format!(
                "the cache of container {c}, still valid, cannot be read: the delegate networks' GC is skipped"
            );
            errors.push(String::from("GC"), Error::new(code::INTERNAL, why));
            return errors.into_result(code::DELEGATE_FAILED, "GC could not clean every attachment");
        }
        for a in attachments_for(req, &conf, &pod, &cluster(&conf, self.view.as_ref(), &req.policy)?, &base)? {
            let still: Vec<Value> = kept
                .iter()
                .flat_map(|(container_id, attachments)| {
                    attachments
                        .iter()
                        .filter(|x| x.network == a.network)
                        .map(move |x| serde_json::json!({"containerID": container_id, "ifname": x.ifname}))
                })
                .collect();
            if let Err(e) = a.status_or_gc(&base, Command::Gc, Some(&Value::Array(still))) {
                errors.push(a.describe(), e);
            }
        }
        errors.into_result(code::DELEGATE_FAILED, "GC could not clean every attachment")
    }
}

#[cfg(test)]
mod tests;
