//! The cluster as the meta-plugin reads and writes it: the pod's selection and UID, NADs, and
//! network-status — from the Kubernetes API (the daemon's watch caches, or a client of this
//! invocation's), else `nadDir`, else nowhere.

use std::collections::BTreeMap;
use std::sync::Arc;

use plexus_cni::{CniResult, Error};
use plexus_k8s::api::{ApiClient, PodInfo};
use plexus_k8s::claims::ClaimRef;
use plexus_k8s::events::PodEvent;
use plexus_k8s::nad::{DirSource, NadSource};
use plexus_k8s::status::{NetworkStatus, PodRef};
use plexus_k8s::{K8sError, Nad, status};
use serde_json::Value;

use crate::attachment::{Attachment, ClaimedDevice};
use crate::conf::MetaConf;
use crate::plan::{Pod, SelectionSource};

/// The cluster as the meta-plugin reads and writes it: the pod (selection and UID), NADs, and
/// network-status. Thin mode asks the API on every call; the daemon answers from its watch
/// caches.
pub trait ClusterView: NadSource + Send + Sync {
    /// The pod's UID and annotations; `None` when the pod is gone. `uid` is the one the runtime
    /// named (may be empty): a cached pod of another UID is an earlier pod of that name.
    fn pod(&self, namespace: &str, name: &str, uid: &str) -> Result<Option<PodInfo>, K8sError>;
    /// Write `k8s.v1.cni.cncf.io/network-status` on `pod` (of its UID; none: whichever pod has
    /// the name).
    fn set_network_status(&self, pod: &PodRef, statuses: &[NetworkStatus]) -> Result<(), K8sError>;
    /// Record events about pods, best effort: what the API does not take is logged, never an
    /// error of the request, and nothing holds the request past `deadline`.
    fn record_events(&self, events: &[PodEvent], deadline: plexus_cni::Deadline);
    /// Make plexus's entries of a DRA claim's device status be `devices` (KEP-4817).
    fn set_claim_status(&self, claim: &ClaimRef, devices: &[Value]) -> Result<(), K8sError>;
}

impl ClusterView for ApiClient {
    fn pod(&self, namespace: &str, name: &str, _uid: &str) -> Result<Option<PodInfo>, K8sError> {
        ApiClient::pod(self, namespace, name)
    }
    fn set_network_status(&self, pod: &PodRef, statuses: &[NetworkStatus]) -> Result<(), K8sError> {
        ApiClient::set_network_status(self, pod, statuses)
    }
    fn set_claim_status(&self, claim: &ClaimRef, devices: &[Value]) -> Result<(), K8sError> {
        self.apply_claim_status(claim, devices)
    }
    /// At once, each on a thread of its own (a pod of eight networks waits for one round trip),
    /// one try each within what is left of the request.
    fn record_events(&self, events: &[PodEvent], deadline: plexus_cni::Deadline) {
        let instance = plexus_k8s::events::reporting_instance();
        let within = deadline.remaining();
        let answers: Vec<_> = std::thread::scope(|s| {
            let sent: Vec<_> = events.iter().map(|e| s.spawn(|| self.record_event(e, &instance, within))).collect();
            sent.into_iter().map(|h| h.join()).collect()
        });
        for (e, answer) in events.iter().zip(answers) {
            if let Ok(Err(why)) = answer {
                tracing::warn!("event {} on pod {}/{} not recorded: {why}", e.reason, e.pod.namespace, e.pod.name);
            }
        }
    }
}

/// Where NADs (and the pod's selection) come from: the Kubernetes API (the daemon's caches, or
/// a client of this invocation's when a kubeconfig or the in-cluster service account is there),
/// else `nadDir` (with the config's `networks`), else nowhere.
pub(crate) enum Cluster {
    Api(Arc<dyn ClusterView>),
    Dir(DirSource),
    None,
}

impl NadSource for Cluster {
    fn nad(&self, namespace: &str, name: &str) -> Result<Nad, K8sError> {
        match self {
            Cluster::Api(api) => api.nad(namespace, name),
            Cluster::Dir(d) => d.nad(namespace, name),
            Cluster::None => Err(K8sError::NadNotFound { namespace: namespace.into(), name: name.into() }),
        }
    }
}

/// The most a NAD manifest in `nadDir` may hold: sixteen NADs of the largest `spec.config` the
/// node policy allows (`limits.nadConfigBytes`), read no further.
pub(crate) fn manifest_max_bytes(policy: &plexus_node::Policy) -> u64 {
    16 * policy.limits.nad_config_bytes as u64
}

pub(crate) fn cluster(
    conf: &MetaConf,
    view: Option<&Arc<dyn ClusterView>>,
    policy: &plexus_node::Policy,
) -> Result<Cluster, Error> {
    if let Some(view) = view {
        return Ok(Cluster::Api(view.clone()));
    }
    if let Some(api) = ApiClient::connect(conf.kubeconfig.as_deref(), conf.api_timeout())? {
        return Ok(Cluster::Api(Arc::new(api)));
    }
    match &conf.nad_dir {
        Some(dir) => Ok(Cluster::Dir(DirSource::load(dir, manifest_max_bytes(policy))?)),
        None => Ok(Cluster::None),
    }
}

impl Cluster {
    /// The selection: the pod annotation (API; a pod that is gone selects nothing), else the
    /// config's `networks`. Checks the pod UID the runtime named, when it named one.
    pub(crate) fn selection<'a>(&self, conf: &'a MetaConf, pod: &Pod) -> Result<SelectionSource<'a>, Error> {
        match self {
            Cluster::Api(api) if !pod.name.is_empty() => match api.pod(&pod.namespace, &pod.name, &pod.uid)? {
                Some(p) => {
                    if !pod.uid.is_empty() && !p.uid.is_empty() && p.uid != pod.uid {
                        return Err(Error::try_again_later(format!(
                            "pod {}/{}: the API has UID {}, the runtime said {}",
                            pod.namespace, pod.name, p.uid, pod.uid
                        )));
                    }
                    Ok(SelectionSource::Annotation {
                        networks: plexus_k8s::api::selection_annotation(&p),
                        default_network: plexus_k8s::api::default_network_annotation(&p),
                    })
                }
                // Unlike Multus (a fake result, nothing attached): a pod the API does not know
                // (a static pod before its mirror pod exists, or one already deleted) still gets
                // the cluster and default networks, only no annotation-selected ones.
                None => Ok(SelectionSource::Annotation { networks: None, default_network: None }),
            },
            _ => Ok(SelectionSource::Config(conf.networks.as_deref())),
        }
    }
}

/// network-status for the pod (API only): one element per attachment of its NADs, device-info
/// included; a DRA claim's device goes to the claim's status instead.
pub(crate) fn write_status(
    cluster: &Cluster,
    pod: &Pod,
    attachments: &[Attachment],
    results: &[CniResult],
) -> Result<(), Error> {
    let Cluster::Api(api) = cluster else { return Ok(()) };
    if pod.name.is_empty() {
        return Ok(());
    }
    let mut all = Vec::new();
    let mut claims: BTreeMap<ClaimRef, Vec<Value>> = BTreeMap::new();
    for (a, r) in attachments.iter().zip(results) {
        let info = a
            .device_info_file
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        match &a.claim {
            Some(c) => {
                claims.entry(claim_ref(c)).or_default().push(crate::claimed::ready(c, &a.ifname, r, info.as_ref()))
            }
            None => all.extend(status::statuses(&a.network, &a.ifname, r, a.cluster_network, info.as_ref())),
        }
    }
    api.set_network_status(&pod.status_ref(), &all)?;
    for (claim, devices) in claims {
        api.set_claim_status(&claim, &devices)?;
    }
    Ok(())
}

/// The claim a device's status entry goes to.
pub(crate) fn claim_ref(c: &ClaimedDevice) -> ClaimRef {
    ClaimRef { namespace: c.namespace.clone(), name: c.name.clone(), uid: c.uid.clone() }
}
