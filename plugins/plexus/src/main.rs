//! plexus: the Multus-compatible meta-plugin.
//!
//! ADD: config → wait for the readiness file → the pod's attachments (cluster network, default
//! networks, selected NADs; interface names, device IDs, capability args) → write the delegate
//! cache → each delegate's ADD in order (recording its result) → on failure, DEL the ones added in
//! reverse and report the network with the delegate's code and message → network-status →
//! the cluster network's result (or all of them combined).
//! DEL: the cache → (else) the attachments rebuilt from the selection → (else) log and succeed;
//! every delegate gets its DEL, in reverse, and the errors are reported together.

mod attachment;
mod cache;
mod conf;
mod plan;

use std::process::ExitCode;

use attachment::Attachment;
use conf::MetaConf;
use plan::{Pod, SelectionSource};
use plexus_cni::{About, CniEnv, CniResult, Command, Error, Plugin, Request, code, files};
use plexus_k8s::nad::{DirSource, NadSource};
use plexus_k8s::{K8sError, Nad};
use serde_json::Value;

struct Meta;

fn main() -> ExitCode {
    plexus_cni::plugin::run(About { name: "plexus", version: env!("CARGO_PKG_VERSION") }, &Meta)
}

/// Where NADs come from when no Kubernetes API is configured: `nadDir`, or nowhere.
enum Nads {
    Dir(DirSource),
    None,
}

impl NadSource for Nads {
    fn nad(&self, namespace: &str, name: &str) -> Result<Nad, K8sError> {
        match self {
            Nads::Dir(d) => d.nad(namespace, name),
            Nads::None => Err(K8sError::NadNotFound { namespace: namespace.into(), name: name.into() }),
        }
    }
}

fn nads(conf: &MetaConf) -> Result<Nads, Error> {
    match &conf.nad_dir {
        Some(dir) => Ok(Nads::Dir(DirSource::load(dir)?)),
        None => Ok(Nads::None),
    }
}

/// The environment every delegate runs with: `binDir` ahead of `CNI_PATH`, and `CNI_ARGS` with
/// `IgnoreUnknown` and the pod's identity (what Multus passes).
fn delegate_env(req: &Request, conf: &MetaConf, pod: &Pod) -> CniEnv {
    let mut env = req.env.clone();
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
    env
}

fn attachments_for(req: &Request, conf: &MetaConf, pod: &Pod) -> Result<Vec<Attachment>, Error> {
    let nads = nads(conf)?;
    plan::plan(req, conf, pod, &nads, SelectionSource::Config(conf.networks.as_deref()))
}

/// DEL every attachment in reverse, keeping going past failures; device-info files go too.
fn delete_all(attachments: &[Attachment], base: &CniEnv) -> Vec<String> {
    let mut errors = Vec::new();
    for a in attachments.iter().rev() {
        if let Err(e) = a.del(base) {
            errors.push(format!("network {} ({}): {e}", a.network, a.ifname));
        }
        if let Some(f) = &a.device_info_file {
            let _ = files::remove_if_present(f);
        }
    }
    errors
}

impl Plugin for Meta {
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let conf = MetaConf::load(req)?;
        conf.wait_ready()?;
        let pod = Pod::from_request(req);
        let base = delegate_env(req, &conf, &pod);
        let mut state = cache::Cache {
            version: cache::CACHE_VERSION,
            container_id: req.env.container_id.clone(),
            netns: req.env.netns.clone(),
            pod_ref: pod.reference(),
            attachments: attachments_for(req, &conf, &pod)?,
        };
        if state.attachments.is_empty() {
            return Err(Error::invalid_config("no network to attach: set clusterNetwork, delegates or networks"));
        }
        let cache_path = cache::path(&conf.cni_dir, &req.env.container_id);
        // Before any delegate runs: a crash from here on leaves what DEL needs.
        cache::save(&cache_path, &state)?;
        let mut results = Vec::new();
        for i in 0..state.attachments.len() {
            let a = &state.attachments[i];
            tracing::debug!(network = %a.network, ifname = %a.ifname, "attaching");
            match a.add(&base) {
                Ok((result, raw)) => {
                    state.attachments[i].result = Some(raw);
                    cache::save(&cache_path, &state)?;
                    results.push(result);
                }
                Err(e) => {
                    let failed = format!("network {} ({})", a.network, a.ifname);
                    let rollback = delete_all(&state.attachments[..=i], &base);
                    if !rollback.is_empty() {
                        tracing::error!("rollback after {failed} failed: {}", rollback.join("; "));
                    }
                    let _ = files::remove_if_present(&cache_path);
                    return Err(e.context(format!("[{}] adding {failed}", pod.reference().unwrap_or_default())));
                }
            }
        }
        let master = state.attachments.iter().position(|a| a.master);
        Ok(match master {
            Some(i) => results.swap_remove(i),
            None => attachment::combine(&results),
        })
    }

    fn del(&self, req: &Request) -> Result<(), Error> {
        let conf = MetaConf::load(req)?;
        let pod = Pod::from_request(req);
        let base = delegate_env(req, &conf, &pod);
        let cache_path = cache::path(&conf.cni_dir, &req.env.container_id);
        let attachments = match cache::load(&cache_path) {
            Ok(Some(c)) => c.attachments,
            other => {
                if let Err(why) = other {
                    // A cache that does not parse must not make DEL a no-op (Multus #1087).
                    tracing::error!("delegate cache unreadable, rebuilding the attachments: {why}");
                }
                match attachments_for(req, &conf, &pod) {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::error!("cannot rebuild the attachments, nothing deleted: {e}");
                        let _ = files::remove_if_present(&cache_path);
                        return Ok(());
                    }
                }
            }
        };
        let errors = delete_all(&attachments, &base);
        if errors.is_empty() || !conf.retry_delete_on_error {
            files::remove_if_present(&cache_path)?;
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::new(code::DELEGATE_FAILED, format!("DEL failed for {} attachment(s)", errors.len()))
                .with_details(errors.join("; ")))
        }
    }

    fn check(&self, req: &Request) -> Result<(), Error> {
        let conf = MetaConf::load(req)?;
        let pod = Pod::from_request(req);
        let base = delegate_env(req, &conf, &pod);
        let cache_path = cache::path(&conf.cni_dir, &req.env.container_id);
        let state = cache::load(&cache_path)
            .map_err(|why| Error::new(code::CHECK_FAILED, format!("delegate cache unreadable: {why}")))?
            .ok_or_else(|| Error::new(code::CHECK_FAILED, format!("no attachments recorded for container {}", req.env.container_id)))?;
        // Every attachment, not only the cluster network (Multus checks only static delegates).
        for a in &state.attachments {
            a.check(&base)?;
        }
        Ok(())
    }

    fn status(&self, req: &Request) -> Result<(), Error> {
        let conf = MetaConf::load(req)?;
        let pod = Pod::default();
        let base = delegate_env(req, &conf, &pod);
        for a in attachments_for(req, &conf, &pod)? {
            a.status_or_gc(&base, Command::Status, None)?;
        }
        Ok(())
    }

    fn gc(&self, req: &Request) -> Result<(), Error> {
        let conf = MetaConf::load(req)?;
        let valid = req.valid_attachments()?;
        let pod = Pod::default();
        let base = delegate_env(req, &conf, &pod);
        let mut errors = Vec::new();
        // Attachments of containers the runtime no longer knows: DEL them from their caches.
        let mut kept = Vec::new();
        for (path, c) in cache::all(&conf.cni_dir) {
            if valid.iter().any(|v| v.container_id == c.container_id) {
                kept.push(c);
                continue;
            }
            let mut env = base.clone();
            env.container_id = c.container_id.clone();
            env.netns = c.netns.clone();
            errors.extend(delete_all(&c.attachments, &env));
            let _ = files::remove_if_present(&path);
        }
        // Then GC on every delegate network, with the attachments still valid for it.
        for a in attachments_for(req, &conf, &pod)? {
            let still: Vec<Value> = kept
                .iter()
                .flat_map(|c| {
                    c.attachments
                        .iter()
                        .filter(|x| x.network == a.network)
                        .map(|x| serde_json::json!({"containerID": c.container_id, "ifname": x.ifname}))
                })
                .collect();
            if let Err(e) = a.status_or_gc(&base, Command::Gc, Some(&Value::Array(still))) {
                errors.push(e.to_string());
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::new(code::DELEGATE_FAILED, "GC could not clean every attachment").with_details(errors.join("; ")))
        }
    }
}
