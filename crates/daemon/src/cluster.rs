//! The daemon's view of the cluster: watch caches (kube-rs reflectors) of every
//! NetworkAttachmentDefinition and of the pods bound to this node (field selector on
//! `spec.nodeName`, metadata only), each object trimmed to what plexus reads. A pod or NAD the
//! cache does not have yet is read from the API; network-status goes to the [`StatusWriter`].

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use plexus_k8s::api::{ApiClient, PodInfo};
use plexus_k8s::events::PodEvent;
use plexus_k8s::nad::{NadSource, RESOURCE_NAME_ANNOTATION};
use plexus_k8s::selection::{DEFAULT_NETWORK_ANNOTATION, NETWORKS_ANNOTATION};
use plexus_k8s::status::{NetworkStatus, PodRef};
use plexus_k8s::{K8sError, Nad};

use crate::claim_status::ClaimStatusWriter;
use crate::events::EventWriter;
use crate::metrics::Metrics;
use crate::status::{Patch, StatusWriter};

/// A NetworkAttachmentDefinition as the cache keeps it: its metadata (trimmed to name, namespace
/// and the resourceName annotation) and `spec.config`, the only field of its spec plexus reads.
/// A type of its own rather than kube's `DynamicObject`: no per-object copy of the API resource's
/// names in the cache's keys, no JSON map per object, and the other fields of the objects a list
/// decodes are skipped rather than built (issue #16: the daemon's memory with 5,000 NADs).
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
struct CachedNad {
    metadata: kube::api::ObjectMeta,
    #[serde(default)]
    spec: NadSpec,
}

thread_local! {
    /// The largest `spec.config` decoded now, on this thread: the cap of the NAD cache whose
    /// watch is being polled ([`Capped`]), which decodes what it reads inside its poll. A decoder
    /// has no other way in (serde's), and no cap is a process's: two caches of one process keep
    /// their own. Outside a capped poll, the default limit.
    static CONFIG_CAP: std::cell::Cell<usize> =
        std::cell::Cell::new(plexus_node::policy::Limits::default().nad_config_bytes);
}

/// `f` with `cap` as the largest `spec.config` decoded on this thread, then the cap as it was.
fn decoding_capped<T>(cap: usize, f: impl FnOnce() -> T) -> T {
    let before = CONFIG_CAP.with(|c| c.replace(cap));
    let out = f();
    CONFIG_CAP.with(|c| c.set(before));
    out
}

/// A watch whose every poll decodes with the cache's cap on `spec.config` (the node policy's
/// `limits.nadConfigBytes`): a larger config is dropped while it is decoded, and a request
/// selecting that NAD reads it from the API (and is refused for its size).
struct Capped<S> {
    inner: S,
    cap: usize,
}

impl<S: futures::Stream + Unpin> futures::Stream for Capped<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        let cap = self.cap;
        decoding_capped(cap, || std::pin::Pin::new(&mut self.inner).poll_next(cx))
    }
}

/// `spec` of a cached NAD. A NAD is tenant-written: whatever its spec is (the CRD says an object
/// with a string `config`; a cluster may have installed another), it never fails the decoding of
/// the list it came in — anything else reads as no config, as `plexus_k8s::Nad::from_object`
/// reads it — and a config larger than the cache's cap ([`Capped`]) is never held, not even while
/// decoding.
#[derive(Clone, Debug, Default, serde::Serialize)]
struct NadSpec {
    config: String,
    /// `config` was larger than the cap: dropped, the API has it.
    #[serde(skip)]
    oversized: bool,
}

impl<'de> serde::Deserialize<'de> for NadSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<NadSpec, D::Error> {
        d.deserialize_any(SpecVisitor)
    }
}

struct SpecVisitor;

impl<'de> serde::de::Visitor<'de> for SpecVisitor {
    type Value = NadSpec;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a NetworkAttachmentDefinition spec")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<NadSpec, A::Error> {
        let mut spec = NadSpec::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "config" => {
                    let config = map.next_value_seed(ConfigSeed)?;
                    spec.oversized = config.is_none();
                    spec.config = config.unwrap_or_default();
                }
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(spec)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<NadSpec, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(NadSpec::default())
    }

    fn visit_str<E>(self, _: &str) -> Result<NadSpec, E> {
        Ok(NadSpec::default())
    }
    fn visit_bool<E>(self, _: bool) -> Result<NadSpec, E> {
        Ok(NadSpec::default())
    }
    fn visit_i64<E>(self, _: i64) -> Result<NadSpec, E> {
        Ok(NadSpec::default())
    }
    fn visit_u64<E>(self, _: u64) -> Result<NadSpec, E> {
        Ok(NadSpec::default())
    }
    fn visit_f64<E>(self, _: f64) -> Result<NadSpec, E> {
        Ok(NadSpec::default())
    }
    fn visit_unit<E>(self) -> Result<NadSpec, E> {
        Ok(NadSpec::default())
    }
}

/// `spec.config`: the text (empty when it is not a string), or `None` when it is longer than
/// the cap ([`CONFIG_CAP`]) — measured on the decoder's own buffer, never copied.
struct ConfigSeed;

impl<'de> serde::de::DeserializeSeed<'de> for ConfigSeed {
    type Value = Option<String>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_any(ConfigVisitor)
    }
}

struct ConfigVisitor;

impl<'de> serde::de::Visitor<'de> for ConfigVisitor {
    type Value = Option<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a NetworkAttachmentDefinition's spec.config")
    }

    fn visit_str<E>(self, v: &str) -> Result<Option<String>, E> {
        Ok((v.len() <= CONFIG_CAP.with(std::cell::Cell::get)).then(|| v.to_string()))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Option<String>, A::Error> {
        while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
        Ok(Some(String::new()))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Option<String>, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Some(String::new()))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Option<String>, E> {
        Ok(Some(String::new()))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Option<String>, E> {
        Ok(Some(String::new()))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Option<String>, E> {
        Ok(Some(String::new()))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Option<String>, E> {
        Ok(Some(String::new()))
    }
    fn visit_unit<E>(self) -> Result<Option<String>, E> {
        Ok(Some(String::new()))
    }
}

impl kube::Resource for CachedNad {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "NetworkAttachmentDefinition".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "k8s.cni.cncf.io".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "network-attachment-definitions".into()
    }
    fn meta(&self) -> &kube::api::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut kube::api::ObjectMeta {
        &mut self.metadata
    }
}

/// Keep of an object's metadata only what plexus reads: name, namespace, UID, resource version
/// and the annotations in `keep`.
fn trim(meta: &mut kube::api::ObjectMeta, keep: &[&str]) {
    meta.managed_fields = None;
    meta.creation_timestamp = None;
    meta.generation = None;
    meta.labels = None;
    meta.owner_references = None;
    meta.finalizers = None;
    meta.generate_name = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.retain(|k, _| keep.contains(&k.as_str()));
    }
}

pub struct Caches {
    nads: Store<CachedNad>,
    pods: Store<PartialObjectMeta<Pod>>,
    api: Arc<ApiClient>,
    metrics: Arc<Metrics>,
    synced: Arc<AtomicBool>,
    /// network-status, journaled and written after the answer.
    pub status: Arc<StatusWriter>,
    /// Events about pods, written after the answer.
    events: EventWriter,
    /// DRA claims' status, written after the answer.
    claim_status: ClaimStatusWriter,
}

/// The caches' kinds, as the metrics label them.
const NAD_KIND: &str = "network-attachment-definition";
const POD_KIND: &str = "pod";

/// What a watch event did to its cache, for the metrics: `None` for the list's start and end.
/// A list's end also hands the memory its pages were decoded in back to the system: the first
/// list of a large cluster peaks at several times what the trimmed caches keep, and the
/// allocator would otherwise hold on to that peak for the daemon's lifetime.
fn watched<K>(event: &watcher::Event<K>) -> Option<&'static str> {
    match event {
        watcher::Event::Apply(_) => Some("apply"),
        watcher::Event::Delete(_) => Some("delete"),
        watcher::Event::InitApply(_) => Some("list"),
        watcher::Event::InitDone => {
            // SAFETY: malloc_trim only returns free memory of the allocator's own heaps.
            unsafe { nix::libc::malloc_trim(0) };
            None
        }
        watcher::Event::Init => None,
    }
}

/// NADs per page of the NAD list: a page of NADs of etcd's largest size is ~15 MiB (its peak while
/// decoded, ~3 times that, was 111 MiB with pages of 25; 5,000 ordinary NADs still sync in about a
/// second).
const NAD_PAGE: u32 = 10;

/// How often a network-status PATCH the API refused is tried again.
const STATUS_RETRY: Duration = Duration::from_secs(2);

impl Caches {
    /// Start both watches on the current runtime; `watch` is a client for long requests, `api`
    /// one with the per-call deadline; network-status is journaled in `journal`.
    /// `nad_config_cap`: the largest `spec.config` the NAD cache keeps (the node policy's
    /// `limits.nadConfigBytes`).
    pub fn start(
        watch: kube::Client,
        api: ApiClient,
        node: &str,
        metrics: Arc<Metrics>,
        journal: &Path,
        nad_config_cap: usize,
    ) -> anyhow::Result<Arc<Caches>> {
        let (nads, nad_writer) = reflector::store::<CachedNad>();
        // Pages of a few NADs: a page is decoded whole, and a NAD may be ~1.5 MiB (etcd's limit),
        // so the largest page, not the number of NADs, bounds what a list holds at once.
        let nad_pages = watcher::Config::default().page_size(NAD_PAGE);
        let nad_stream = watcher(Api::<CachedNad>::all(watch.clone()), nad_pages)
            .default_backoff()
            .modify(|o: &mut CachedNad| {
                trim(&mut o.metadata, &[RESOURCE_NAME_ANNOTATION]);
                // A NAD is read for its name, namespace, annotation and spec.config only.
                o.metadata.uid = None;
                o.metadata.resource_version = None;
            })
            .reflect(nad_writer);
        let (pods, pod_writer) = reflector::store::<PartialObjectMeta<Pod>>();
        let pod_stream = watcher(
            Api::<PartialObjectMeta<Pod>>::all(watch),
            watcher::Config::default().fields(&format!("spec.nodeName={node}")),
        )
        .default_backoff()
        .modify(|o: &mut PartialObjectMeta<Pod>| {
            trim(&mut o.metadata, &[NETWORKS_ANNOTATION, DEFAULT_NETWORK_ANNOTATION])
        })
        .reflect(pod_writer);
        for (kind, stream) in [
            (
                NAD_KIND,
                Capped { inner: nad_stream.boxed(), cap: nad_config_cap }.map(|e| e.map(|e| watched(&e))).boxed(),
            ),
            (POD_KIND, pod_stream.map(|e| e.map(|e| watched(&e))).boxed()),
        ] {
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let mut stream = stream;
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(Some(event)) => metrics.watch_event(kind, event),
                        Ok(None) => {}
                        Err(e) => {
                            metrics.api_request("watch_error");
                            tracing::warn!("watch of {kind}: {e} (serving from the cache meanwhile)");
                        }
                    }
                }
            });
        }
        let synced = Arc::new(AtomicBool::new(false));
        let api = Arc::new(api);
        let (patching, counting) = (api.clone(), metrics.clone());
        let patch: Arc<Patch> = Arc::new(move |pod: &PodRef, statuses: &[NetworkStatus]| {
            counting.api_request("patch_pod");
            patching.set_network_status(pod, statuses)
        });
        let status = StatusWriter::new(patch, journal, STATUS_RETRY)
            .map_err(|e| anyhow::anyhow!("network-status journal {}: {e}", journal.display()))?;
        let events = EventWriter::start(api.clone(), metrics.clone())
            .map_err(|e| anyhow::anyhow!("start the event writer: {e}"))?;
        let claim_status = ClaimStatusWriter::start(api.clone(), metrics.clone())
            .map_err(|e| anyhow::anyhow!("start the claim status writer: {e}"))?;
        let caches = Arc::new(Caches {
            nads: nads.clone(),
            pods: pods.clone(),
            api,
            metrics,
            synced: synced.clone(),
            status,
            events,
            claim_status,
        });
        tokio::spawn(async move {
            let (a, b) = tokio::join!(nads.wait_until_ready(), pods.wait_until_ready());
            if a.is_ok() && b.is_ok() {
                synced.store(true, Ordering::SeqCst);
                tracing::info!(nads = nads.len(), pods = pods.len(), "watch caches synced");
            }
        });
        Ok(caches)
    }

    /// Both caches have had their first full list.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    pub fn sizes(&self) -> [(&'static str, usize); 2] {
        [(NAD_KIND, self.nads.len()), (POD_KIND, self.pods.len())]
    }
}

/// How long the daemon waits for its caches at start before it serves anyway (from the API).
pub const SYNC_WAIT: Duration = Duration::from_secs(10);

impl NadSource for Caches {
    fn nad(&self, namespace: &str, name: &str) -> Result<Nad, K8sError> {
        match self.nads.get(&ObjectRef::new(name).within(namespace)).filter(|o| !o.spec.oversized) {
            Some(obj) => Ok(Nad {
                namespace: namespace.to_string(),
                name: name.to_string(),
                resource_name: obj.metadata.annotations.as_ref().and_then(|a| a.get(RESOURCE_NAME_ANNOTATION)).cloned(),
                config: obj.spec.config.clone(),
            }),
            None => {
                // Created a moment ago, or not there at all: the API says which. A NAD larger
                // than the cache keeps is read from there too (and refused for its size).
                self.metrics.api_request("get_network_attachment_definition");
                self.api.nad(namespace, name)
            }
        }
    }
}

impl plexus::ClusterView for Caches {
    fn pod(&self, namespace: &str, name: &str, uid: &str) -> Result<Option<PodInfo>, K8sError> {
        let cached = self.pods.get(&ObjectRef::new(name).within(namespace));
        if let Some(p) = cached.filter(|p| uid.is_empty() || p.metadata.uid.as_deref() == Some(uid)) {
            return Ok(Some(PodInfo {
                uid: p.metadata.uid.clone().unwrap_or_default(),
                annotations: p.metadata.annotations.clone().unwrap_or_default().into_iter().collect(),
            }));
        }
        // Not yet seen by the watch (the kubelet can be quicker than it), or a new pod of the name.
        self.metrics.api_request("get_pod");
        self.api.pod(namespace, name)
    }

    /// Journaled and written after the answer ([`StatusWriter`]): the attachment stands whatever
    /// the API does with it, retried while the API does not take it (thin mode can only fail the
    /// ADD; a daemon outlives the call).
    fn set_network_status(&self, pod: &PodRef, statuses: &[NetworkStatus]) -> Result<(), K8sError> {
        self.status.submit(pod, statuses)
    }

    /// Queued and written after the answer ([`EventWriter`]): the request does not wait for them.
    fn record_events(&self, events: &[PodEvent], _deadline: plexus_cni::Deadline) {
        self.events.submit(events)
    }

    /// Queued and written after the answer, in order ([`ClaimStatusWriter`]).
    fn set_claim_status(
        &self,
        claim: &plexus_k8s::claims::ClaimRef,
        devices: &[serde_json::Value],
    ) -> Result<(), K8sError> {
        self.claim_status.submit(claim, devices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nad_list_decodes_whatever_a_tenant_put_in_spec() {
        let list = serde_json::json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinitionList",
        "metadata": {"resourceVersion": "7"},
        "items": [
            {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
             "metadata": {"name": "rail0", "namespace": "ml", "uid": "u1",
                          "annotations": {RESOURCE_NAME_ANNOTATION: "nvidia.com/rdma"}},
             "spec": {"config": "{\"cniVersion\":\"1.0.0\",\"type\":\"plexus-macvlan\"}"}},
            {"metadata": {"name": "number", "namespace": "ml"}, "spec": {"config": 42}},
            {"metadata": {"name": "text-spec", "namespace": "ml"}, "spec": "not an object"},
            {"metadata": {"name": "no-spec", "namespace": "ml"}},
            {"metadata": {"name": "object-config", "namespace": "ml"}, "spec": {"config": {"a": [1, {"b": null}]}, "x": 1}}
        ]});
        let decoded: kube::core::ObjectList<CachedNad> = serde_json::from_value(list).unwrap();
        let configs: Vec<(&str, &str)> =
            decoded.items.iter().map(|n| (n.metadata.name.as_deref().unwrap(), n.spec.config.as_str())).collect();
        assert_eq!(
            configs,
            [
                ("rail0", "{\"cniVersion\":\"1.0.0\",\"type\":\"plexus-macvlan\"}"),
                ("number", ""),
                ("text-spec", ""),
                ("no-spec", ""),
                ("object-config", "")
            ]
        );
        assert!(decoded.items.iter().all(|n| !n.spec.oversized));
        let rail0 = &decoded.items[0];
        assert_eq!(rail0.metadata.annotations.as_ref().unwrap()[RESOURCE_NAME_ANNOTATION], "nvidia.com/rdma");
    }

    #[test]
    fn a_config_larger_than_the_cap_is_dropped_while_it_is_decoded() {
        let big = format!("{{\"type\":\"macvlan\",\"pad\":\"{}\"}}", "x".repeat(70 * 1024));
        let list = serde_json::json!({"metadata": {}, "items": [
            {"metadata": {"name": "big", "namespace": "ml"}, "spec": {"config": big}},
            {"metadata": {"name": "small", "namespace": "ml"}, "spec": {"config": "{}"}}
        ]});
        let decoded: kube::core::ObjectList<CachedNad> = serde_json::from_value(list.clone()).unwrap();
        let (big, small) = (&decoded.items[0].spec, &decoded.items[1].spec);
        assert!(big.oversized && big.config.is_empty(), "64 KiB by default");
        assert!(!small.oversized && small.config == "{}");
        // Two caches of one process, each its own cap: the list decoded by each.
        let kept = |cap: usize| {
            let decoded: kube::core::ObjectList<CachedNad> =
                decoding_capped(cap, || serde_json::from_value(list.clone()).unwrap());
            decoded.items.iter().filter(|n| !n.spec.oversized).count()
        };
        assert_eq!((kept(1), kept(128 * 1024), kept(1)), (0, 2, 0));
    }
}
