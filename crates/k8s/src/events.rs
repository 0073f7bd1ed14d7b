//! Events on a pod, as the meta-plugin records them: `AddedInterface` for every interface an ADD
//! attached (Multus's event, with its message), and a warning naming the network and the cause
//! when an ADD failed or a DEL could not release something. Written through the events API
//! (`events.k8s.io/v1`; `kubectl describe pod` shows them), best effort: an event the API does
//! not take is logged, never fails the request.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

use crate::status::PodRef;

/// The component that reports plexus's events (`reportingController`).
pub const REPORTING_CONTROLLER: &str = "plexus";
/// The most bytes of an event's note the API takes.
pub const NOTE_MAX_BYTES: usize = 1024;

/// One event about a pod.
#[derive(Clone, Debug)]
pub struct PodEvent {
    pub pod: PodRef,
    /// `Normal` or `Warning`.
    pub kind: &'static str,
    pub reason: &'static str,
    /// What plexus did (`action`): `Add` or `Delete`.
    pub action: &'static str,
    pub note: String,
}

impl PodEvent {
    /// An interface attached: `Add <ifname> [<addresses>] from <network>`, Multus's words.
    pub fn added_interface(pod: &PodRef, ifname: &str, addresses: &[String], network: &str) -> PodEvent {
        let note = format!("Add {ifname} [{}] from {network}", addresses.join(" "));
        PodEvent { pod: pod.clone(), kind: "Normal", reason: "AddedInterface", action: "Add", note }
    }

    /// An ADD that failed (and was rolled back): `why` names the network and the cause.
    pub fn add_failed(pod: &PodRef, why: &str) -> PodEvent {
        PodEvent { pod: pod.clone(), kind: "Warning", reason: "FailedAddInterface", action: "Add", note: why.into() }
    }

    /// A DEL that could not release everything: `why` names each network and its cause.
    pub fn delete_failed(pod: &PodRef, why: &str) -> PodEvent {
        PodEvent {
            pod: pod.clone(),
            kind: "Warning",
            reason: "FailedDeleteInterface",
            action: "Delete",
            note: why.into(),
        }
    }

    /// The events.k8s.io/v1 object, reported by `instance` (the node's plexus) at `now`; a note
    /// longer than the API takes is cut at a character boundary.
    pub fn object(&self, instance: &str, now: k8s_openapi::jiff::Timestamp) -> Event {
        let mut note = self.note.clone();
        if note.len() > NOTE_MAX_BYTES {
            let mut end = NOTE_MAX_BYTES - 3;
            while !note.is_char_boundary(end) {
                end -= 1;
            }
            note.truncate(end);
            note.push_str("...");
        }
        Event {
            metadata: ObjectMeta {
                // The API makes the name: the pod's and five characters (an RFC 1123 subdomain:
                // the prefix must not end in a dot).
                generate_name: Some(format!("{}-", self.pod.name)),
                namespace: Some(self.pod.namespace.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(self.action.into()),
            reason: Some(self.reason.into()),
            note: Some(note),
            type_: Some(self.kind.into()),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(instance.chars().take(128).collect()),
            regarding: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(self.pod.namespace.clone()),
                name: Some(self.pod.name.clone()),
                uid: (!self.pod.uid.is_empty()).then(|| self.pod.uid.clone()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// The reporting instance of this node's plexus: `plexus-<hostname>`.
pub fn reporting_instance() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{REPORTING_CONTROLLER}-{}", host.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodRef {
        PodRef { namespace: "ml".into(), name: "trainer-0".into(), uid: "uid-1".into() }
    }

    #[test]
    fn an_added_interface_reads_as_multus_writes_it_about_the_pod_of_its_uid() {
        let addrs = ["198.18.0.2/24".to_string(), "2001:db8::2/64".to_string()];
        let e = PodEvent::added_interface(&pod(), "net1", &addrs, "ml/rail0");
        let v =
            serde_json::to_value(e.object("plexus-node-1", "2026-12-05T19:10:00.123456Z".parse().unwrap())).unwrap();
        assert_eq!(v["apiVersion"], "events.k8s.io/v1");
        assert_eq!(v["kind"], "Event");
        assert_eq!(v["metadata"]["generateName"], "trainer-0-");
        assert_eq!(v["metadata"]["namespace"], "ml");
        assert_eq!(v["eventTime"], "2026-12-05T19:10:00.123456Z");
        assert_eq!(
            (&v["type"], &v["reason"], &v["action"]),
            (&"Normal".into(), &"AddedInterface".into(), &"Add".into())
        );
        assert_eq!(v["note"], "Add net1 [198.18.0.2/24 2001:db8::2/64] from ml/rail0");
        assert_eq!((&v["reportingController"], &v["reportingInstance"]), (&"plexus".into(), &"plexus-node-1".into()));
        assert_eq!(
            v["regarding"],
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "namespace": "ml", "name": "trainer-0", "uid": "uid-1"})
        );
    }

    #[test]
    fn a_failure_is_a_warning_whose_note_the_api_takes_whatever_its_length() {
        let long = "é".repeat(2000);
        let e = PodEvent::add_failed(&pod(), &long);
        let v = serde_json::to_value(e.object("plexus-n", k8s_openapi::jiff::Timestamp::now())).unwrap();
        assert_eq!((&v["type"], &v["reason"]), (&"Warning".into(), &"FailedAddInterface".into()));
        let note = v["note"].as_str().unwrap();
        assert!(note.len() <= NOTE_MAX_BYTES && note.ends_with("..."), "{}", note.len());
        let d = PodEvent::delete_failed(&PodRef { uid: String::new(), ..pod() }, "network ml/rail0 (net1): busy");
        let v = serde_json::to_value(d.object("plexus-n", k8s_openapi::jiff::Timestamp::now())).unwrap();
        assert_eq!((&v["reason"], &v["action"]), (&"FailedDeleteInterface".into(), &"Delete".into()));
        assert!(v["regarding"].get("uid").is_none(), "no UID named when the runtime named none");
    }
}
