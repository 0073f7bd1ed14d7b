//! Keeping the node's ResourceSlices true: the ports are scanned every few seconds (netlink and
//! sysfs: cheap), and the slices are written when what the node offers changed, or when the slices
//! in the API are not what they should be — the kubelet deletes a node's slices when it starts,
//! and a driver's when its plugin has been gone for 30 s; a watch of this node's slices notices.
//! Each change of the devices is a new pool generation, written to every slice of the pool (the
//! scheduler uses the newest generation, once it has all of its slices); slices the pool no
//! longer needs are deleted.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;

use crate::DRIVER;
use crate::nics::{Nic, Skipped};
use crate::slice::{NodeRef, Publishing, slices};

/// What the node offers now, and what it left out (logged when it changes).
pub type Scan = dyn Fn() -> futures::future::BoxFuture<'static, (Vec<Nic>, Vec<Skipped>)> + Send + Sync;

/// Publish `node`'s ports until the task is dropped. Errors of the API are logged and retried at
/// the next tick.
pub async fn run(
    client: kube::Client,
    node: String,
    scan: Box<Scan>,
    publishing: Publishing,
    every: Duration,
    ready: std::sync::Arc<crate::ready::Readiness>,
) {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client);
    let mut events =
        watcher(slices.clone(), watcher::Config::default().fields(&format!("spec.nodeName={node}"))).boxed();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut node_ref: Option<NodeRef> = None;
    let mut offered: Option<Vec<Nic>> = None;
    let mut left_out: Vec<Skipped> = Vec::new();
    let mut in_api_checked = false;
    let mut written = Written::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            event = events.next() => {
                match event {
                    // Anything about this node's slices: look at ours again.
                    Some(Ok(_)) => in_api_checked = false,
                    Some(Err(e)) => tracing::debug!("watching ResourceSlices: {e}"),
                    None => return,
                }
            }
        }
        let (nics, skipped) = scan().await;
        if skipped != left_out {
            for s in &skipped {
                tracing::info!("DRA: {} not offered: {}", s.ifname, s.why);
            }
            left_out = skipped;
        }
        if offered.as_ref() != Some(&nics) {
            tracing::info!("DRA: offering {:?}", nics.iter().map(|n| n.device.as_str()).collect::<Vec<_>>());
            offered = Some(nics);
            in_api_checked = false;
        }
        if in_api_checked {
            continue;
        }
        if node_ref.is_none() {
            match nodes.get(&node).await {
                Ok(n) => node_ref = Some(NodeRef { name: node.clone(), uid: n.metadata.uid.unwrap_or_default() }),
                Err(e) => {
                    tracing::warn!("DRA: node {node}: {e}");
                    continue;
                }
            }
        }
        let nics = offered.as_deref().unwrap_or_default();
        match reconcile(&slices, node_ref.as_ref().expect("read above"), nics, &publishing, &mut written).await {
            Ok(()) => {
                in_api_checked = true;
                ready.set_published();
            }
            Err(e) => tracing::warn!("DRA: the ResourceSlices of node {node}: {e}"),
        }
    }
}

/// Per slice, the devices last written and as the API server keeps them (it drops fields of
/// features it has off, such as consumable capacity): a slice that reads back as it was kept is
/// right.
#[derive(Default)]
struct Written(BTreeMap<String, Kept>);

/// A slice's devices as written, and as the API server kept them.
type Kept = (Option<Vec<Device>>, Option<Vec<Device>>);

/// Make the API's slices of the node's pool offer `nics`: left alone when every one is right,
/// else all written at the next generation (created when missing), and the ones the pool no
/// longer has deleted.
async fn reconcile(
    api: &Api<ResourceSlice>,
    node: &NodeRef,
    nics: &[Nic],
    publishing: &Publishing,
    written: &mut Written,
) -> kube::Result<()> {
    let mut desired = slices(node, nics, 0, publishing);
    let ours = ListParams::default().fields(&format!("spec.nodeName={},spec.driver={DRIVER}", node.name));
    let current: BTreeMap<String, ResourceSlice> = api
        .list(&ours)
        .await?
        .items
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER && s.spec.node_name.as_deref() == Some(node.name.as_str()))
        .filter_map(|s| Some((s.metadata.name.clone()?, s)))
        .collect();
    let generation = current.values().map(|s| s.spec.pool.generation).max();
    let right = |d: &ResourceSlice| {
        let name = d.metadata.name.as_deref().unwrap_or_default();
        current.get(name).is_some_and(|c| {
            let pool = c.spec.pool.name == d.spec.pool.name
                && c.spec.pool.resource_slice_count == d.spec.pool.resource_slice_count
                && Some(c.spec.pool.generation) == generation;
            let kept = written.0.get(name).is_some_and(|(w, s)| *w == d.spec.devices && *s == c.spec.devices);
            pool && (c.spec.devices == d.spec.devices || kept)
        })
    };
    if current.len() == desired.len() && desired.iter().all(right) {
        return Ok(());
    }
    let next = generation.map_or(0, |g| g + 1);
    let mut now = Written::default();
    for d in &mut desired {
        d.spec.pool.generation = next;
        let name = d.metadata.name.clone().unwrap_or_default();
        let stored = match current.get(&name) {
            None => api.create(&PostParams::default(), d).await?,
            Some(c) => {
                d.metadata.resource_version = c.metadata.resource_version.clone();
                api.replace(&name, &PostParams::default(), d).await?
            }
        };
        now.0.insert(name, (d.spec.devices.clone(), stored.spec.devices));
    }
    for name in current.keys().filter(|n| !now.0.contains_key(*n)) {
        api.delete(name, &DeleteParams::default()).await?;
    }
    tracing::info!("DRA: {} ResourceSlice(s) of node {} at generation {next}", desired.len(), node.name);
    *written = now;
    Ok(())
}
