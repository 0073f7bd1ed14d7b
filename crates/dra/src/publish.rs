//! Keeping the node's ResourceSlice true: the ports are scanned every few seconds (netlink and
//! sysfs: cheap), and the slice is written when what the node offers changed, or when the slice
//! in the API is not what it should be — the kubelet deletes a node's slices when it starts, and
//! a driver's when its plugin has been gone for 30 s; a watch of this node's slices notices.
//! Each change of the devices is a new pool generation (the scheduler uses the newest).

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;

use crate::nics::{Nic, Skipped};
use crate::slice::{NodeRef, Publishing, slice, slice_name};

/// What the node offers now, and what it left out (logged when it changes).
pub type Scan = dyn Fn() -> futures::future::BoxFuture<'static, (Vec<Nic>, Vec<Skipped>)> + Send + Sync;

/// Publish `node`'s ports until the task is dropped. Errors of the API are logged and retried at
/// the next tick.
pub async fn run(client: kube::Client, node: String, scan: Box<Scan>, publishing: Publishing, every: Duration) {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client);
    let name = slice_name(&node);
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
        match reconcile(&slices, &name, node_ref.as_ref().expect("read above"), nics, &publishing, &mut written).await {
            Ok(()) => in_api_checked = true,
            Err(e) => tracing::warn!("DRA: ResourceSlice {name}: {e}"),
        }
    }
}

/// The devices last written, and as the API server keeps them (it drops fields of features it
/// has off, such as consumable capacity): a slice that reads back as it was kept is right.
#[derive(Default)]
struct Written {
    desired: Option<Vec<Device>>,
    stored: Option<Vec<Device>>,
}

/// Make the API's slice `name` offer `nics`: created when missing, replaced (next generation)
/// when its devices differ, left alone when it is right.
async fn reconcile(
    slices: &Api<ResourceSlice>,
    name: &str,
    node: &NodeRef,
    nics: &[Nic],
    publishing: &Publishing,
    written: &mut Written,
) -> kube::Result<()> {
    let mut desired = slice(node, nics, 0, publishing);
    let devices = desired.spec.devices.clone();
    let stored = match slices.get_opt(name).await? {
        None => {
            let made = slices.create(&PostParams::default(), &desired).await?;
            tracing::info!("DRA: ResourceSlice {name} created");
            made
        }
        Some(current) => {
            desired.spec.pool.generation = current.spec.pool.generation;
            let same = current.spec.devices == devices
                || (written.desired == devices && written.stored == current.spec.devices);
            if same && current.spec.pool == desired.spec.pool {
                return Ok(());
            }
            desired.spec.pool.generation += 1;
            desired.metadata.resource_version = current.metadata.resource_version.clone();
            let replaced = slices.replace(name, &PostParams::default(), &desired).await?;
            tracing::info!("DRA: ResourceSlice {name} at generation {}", desired.spec.pool.generation);
            replaced
        }
    };
    written.desired = devices;
    written.stored = stored.spec.devices;
    Ok(())
}
