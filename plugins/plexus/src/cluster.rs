//! The cluster as the meta-plugin reads it — the pod's selection and UID, NADs — and the seam it
//! writes through ([`ClusterView`]: network-status, claim status, events): the Kubernetes API
//! (the daemon's watch caches, or a client of this invocation's), else `nadDir`, else nowhere.

use std::sync::Arc;

use plexus_cni::Error;
use plexus_k8s::api::{ApiClient, PodInfo};
use plexus_k8s::claims::ClaimRef;
use plexus_k8s::events::PodEvent;
use plexus_k8s::nad::{DirSource, NadSource};
use plexus_k8s::status::{NetworkStatus, PodRef};
use plexus_k8s::{K8sError, Nad};
use serde_json::Value;

use crate::conf::MetaConf;
use crate::pod::Pod;

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

/// The cluster an invocation reads and writes: the view of the Kubernetes API (the daemon's
/// caches, or a client of this invocation's when a kubeconfig or the in-cluster service account is
/// there), where network-status, claim status and events go; and where NADs are read — the API,
/// else `nadDir` (with the config's `networks`), else nowhere.
pub(crate) struct Cluster {
    pub view: Option<Arc<dyn ClusterView>>,
    pub nads: Arc<dyn NadSource + Send + Sync>,
}

/// No NADs: an invocation with neither an API nor `nadDir`.
struct Nowhere;

impl NadSource for Nowhere {
    fn nad(&self, namespace: &str, name: &str) -> Result<Nad, K8sError> {
        Err(K8sError::NadNotFound { namespace: namespace.into(), name: name.into() })
    }
}

/// The most a NAD manifest in `nadDir` may hold: sixteen NADs of the largest `spec.config` the
/// node policy allows (`limits.nadConfigBytes`), read no further.
pub(crate) fn manifest_max_bytes(policy: &plexus_node::Policy) -> u64 {
    16 * policy.limits.nad_config_bytes as u64
}

/// The cluster (the daemon's `view`, else the API, else `nadDir`, else none) and what `pod`
/// selects in it.
pub(crate) fn read<'a>(
    conf: &'a MetaConf,
    view: Option<&Arc<dyn ClusterView>>,
    policy: &plexus_node::Policy,
    pod: &Pod,
) -> Result<(Cluster, SelectionSource<'a>), Error> {
    let cluster = connect(conf, view, policy)?;
    let selection = selection(&cluster, conf, pod)?;
    Ok((cluster, selection))
}

/// The cluster alone: the daemon's `view`, else a client of the API, else `nadDir`, else none.
pub(crate) fn connect(
    conf: &MetaConf,
    view: Option<&Arc<dyn ClusterView>>,
    policy: &plexus_node::Policy,
) -> Result<Cluster, Error> {
    let view = match view {
        Some(view) => Some(view.clone()),
        None => ApiClient::connect(conf.kubeconfig.as_deref(), conf.api_timeout)?
            .map(|api| Arc::new(api) as Arc<dyn ClusterView>),
    };
    let nads: Arc<dyn NadSource + Send + Sync> = match (&view, &conf.nad_dir) {
        (Some(api), _) => api.clone(),
        (None, Some(dir)) => Arc::new(DirSource::load(dir, manifest_max_bytes(policy))?),
        (None, None) => Arc::new(Nowhere),
    };
    Ok(Cluster { view, nads })
}

/// Where the selection comes from: the pod's annotations (API: `k8s.v1.cni.cncf.io/networks`
/// and `v1.multus-cni.io/default-network`) or the config's `networks`.
pub(crate) enum SelectionSource<'a> {
    Annotation { networks: Option<String>, default_network: Option<String> },
    Config(Option<&'a str>),
}

/// The selection: the pod annotation (API; a pod that is gone selects nothing), else the config's
/// `networks`. Checks the pod UID the runtime named, when it named one.
fn selection<'a>(cluster: &Cluster, conf: &'a MetaConf, pod: &Pod) -> Result<SelectionSource<'a>, Error> {
    match &cluster.view {
        Some(api) if !pod.who.name.is_empty() => match api.pod(&pod.who.namespace, &pod.who.name, &pod.who.uid)? {
            Some(p) => {
                if !pod.who.uid.is_empty() && !p.uid.is_empty() && p.uid != pod.who.uid {
                    return Err(Error::try_again_later(format!(
                        "pod {}/{}: the API has UID {}, the runtime said {}",
                        pod.who.namespace, pod.who.name, p.uid, pod.who.uid
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
