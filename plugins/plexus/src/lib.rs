//! plexus: the Multus-compatible meta-plugin.
//!
//! ADD: the config (once the readiness file is there) → the pod → the cluster and the pod's
//! selection in it → the plan (cluster network, default networks, selected NADs, the devices of
//! its DRA claims; interface names, device IDs, capability args) → attached (the pod's namespace
//! checked, the delegate cache written, the delegates' ADDs — the cluster network first, then the
//! others concurrently, or one after another with `"parallel": false`; each result recorded —,
//! default routes, network-status and the claims' status; on failure, DEL every one sent an ADD,
//! in reverse, and report the first failed network in annotation order with the delegate's code
//! and message) → the pod told (events) → the cluster network's result (or all of them combined,
//! in annotation order).
//! DEL: the cache → (else) the attachments rebuilt from the selection → (else) log and succeed;
//! every delegate gets its DEL (the reverse of ADD's order, concurrently where ADD was), and the
//! errors are reported together.
//!
//! The same code runs in `plexus-daemon`, where the cluster is read from the daemon's watch
//! caches ([`ClusterView`]) and the shim forwards its request ([`shim`]).

mod attach;
mod attachment;
mod cache;
mod cluster;
mod conf;
mod events;
mod multus;
mod plan;
mod pod;
pub mod shim;
mod status;
pub mod wire;

use std::sync::Arc;

use attach::delete_all;
use attachment::{Attachment, Chains, DelegateEnv, Delegates};
use conf::MetaConf;
use plexus_cni::{CniResult, Command, Error, ErrorList, code};
use plexus_node::files;
use plexus_plugin::logging;
use plexus_plugin::{About, Plugin, Request};
use pod::Pod;
use serde_json::Value;

pub use attachment::{DelegateCall, Observer, UNKNOWN_TYPE};
pub use cluster::ClusterView;
pub use conf::MetaConf as Config;

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
    if !pod.who.name.is_empty() {
        env.args.set("IgnoreUnknown", "true");
        env.args.set("K8S_POD_NAMESPACE", &pod.who.namespace);
        env.args.set("K8S_POD_NAME", &pod.who.name);
        env.args.set("K8S_POD_INFRA_CONTAINER_ID", &pod.infra_container_id);
        env.args.set("K8S_POD_UID", &pod.who.uid);
    }
    DelegateEnv { cni: env, runner: req.runner.clone() }
}

impl Meta {
    /// The pod's attachments planned again (DEL without a cache, STATUS, GC): the cluster read,
    /// its selection planned.
    fn replan(&self, req: &Request, conf: &MetaConf, pod: &Pod, base: &DelegateEnv) -> Result<Vec<Attachment>, Error> {
        let (cluster, selection) = cluster::read(conf, self.view.as_ref(), &req.policy, pod)?;
        plan::plan(req, conf, pod, &*cluster.nads, selection, &base.cni.path)
    }
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

impl Plugin for Meta {
    fn known_args(&self) -> &'static [&'static str] {
        &["IP", "MAC", "GATEWAY"]
    }

    /// The meta config is the admin's (the CNI conf dir), unless a delegation ran plexus — then it
    /// is a network's, and refused.
    fn admin_config(&self, req: &Request) -> bool {
        !req.delegated
    }

    /// ADD: the config, the pod, the cluster and what the pod selects in it; the plan (its NADs'
    /// and its claims' attachments); the attachments made (network-status recorded, everything
    /// undone on failure); what happened told.
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let conf = MetaConf::for_add(req)?;
        let pod = Pod::from_request(req);
        let base = delegate_env(req, &conf, &pod);
        let (cluster, selection) = cluster::read(&conf, self.view.as_ref(), &req.policy, &pod)?;
        let record = status::Recorded { cluster: &cluster, pod: &pod };
        let added = plan::plan(req, &conf, &pod, &*cluster.nads, selection, &base.cni.path)
            .and_then(|attachments| attach::add_pod(req, &conf, &pod, &base, attachments, &*self.delegates, &record));
        events::report(cluster.view.as_deref(), &conf, &pod, added.as_ref(), req.env.deadline);
        added.map(|a| a.result)
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
                    match self.replan(req, &conf, &pod, &base) {
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
            && let Ok(cluster::Cluster { view: Some(api), .. }) =
                cluster::connect(&conf, self.view.as_ref(), &req.policy)
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
        for a in self.replan(req, &conf, &pod, &base)? {
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
        for a in self.replan(req, &conf, &pod, &base)? {
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
