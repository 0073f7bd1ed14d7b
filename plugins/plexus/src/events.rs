//! What the meta-plugin tells a pod (`plexus_k8s::events`): an `AddedInterface` event for each
//! attachment an ADD made, a warning when an ADD failed or a DEL could not release everything
//! — and, when an ADD failed, its DRA claims (`status.rs`). Best effort, as Multus's: the cluster
//! view writes them (thin mode: at once, in parallel; the daemon: in the background) and logs
//! what the API did not take.

use plexus_cni::{CniResult, Deadline, Error};
use plexus_k8s::events::PodEvent;

use crate::attach::Added;
use crate::attachment::Attachment;
use crate::cluster::ClusterView;
use crate::conf::MetaConf;
use crate::pod::Pod;
use crate::status;

/// After an ADD of `pod` (no API: nothing to tell): an `AddedInterface` per interface it
/// attached, or the warning of its failure, and then each device of its claims says it is not
/// ready, and why.
pub(crate) fn report(
    view: Option<&dyn ClusterView>,
    conf: &MetaConf,
    pod: &Pod,
    added: Result<&Added, &Error>,
    deadline: Deadline,
) {
    let Some(view) = view else { return };
    match added {
        Ok(a) => tell(view, &self::added(pod, &a.attachments, &a.results), deadline),
        Err(e) => {
            tell(view, &add_failed(pod, e), deadline);
            status::claims_failed(view, conf, pod, e);
        }
    }
}

/// Tell the pod `events` (none for a request of no pod), while the request has time left: an
/// event never holds a request past its deadline.
pub(crate) fn tell(view: &dyn ClusterView, events: &[PodEvent], deadline: Deadline) {
    if events.is_empty() {
        return;
    }
    if deadline.passed() {
        tracing::warn!("{} event(s) not recorded: the request's deadline has passed", events.len());
        return;
    }
    view.record_events(events, deadline);
}

/// One `AddedInterface` per attachment, named by its interface in the pod, with the addresses
/// of its result (as Multus words it).
pub(crate) fn added(pod: &Pod, attachments: &[Attachment], results: &[CniResult]) -> Vec<PodEvent> {
    if pod.who.name.is_empty() {
        return Vec::new();
    }
    let who = &pod.who;
    attachments
        .iter()
        .zip(results)
        .map(|(a, r)| {
            let addresses: Vec<String> = r.ips.iter().map(|ip| ip.address.to_string()).collect();
            PodEvent::added_interface(who, &a.ifname, &addresses, &a.network)
        })
        .collect()
}

/// The warning of an ADD that failed: its error's message names the network and the cause (its
/// details — a delegate's output, node paths — stay in the runtime's log).
pub(crate) fn add_failed(pod: &Pod, e: &Error) -> Vec<PodEvent> {
    if pod.who.name.is_empty() {
        return Vec::new();
    }
    vec![PodEvent::add_failed(&pod.who, &e.msg)]
}

/// The warning of a DEL that could not release everything, naming each network and its cause.
pub(crate) fn delete_failed(pod: &Pod, e: &Error) -> Vec<PodEvent> {
    if pod.who.name.is_empty() {
        return Vec::new();
    }
    // The message says how many; its details name each network with its cause.
    let note = if e.details.is_empty() { e.msg.clone() } else { format!("{}: {}", e.msg, e.details) };
    vec![PodEvent::delete_failed(&pod.who, &note)]
}
