//! Events about pods, written after the answer (`plexus_k8s::events`): the meta-plugin hands them
//! over and goes on; one thread writes them through the API, in order. The queue holds at most
//! [`QUEUE_MAX`] events: past it an event is dropped (logged, counted), so a slow or unreachable
//! API never holds a request nor grows the daemon's memory.

use std::sync::Arc;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};

use plexus_k8s::api::ApiClient;
use plexus_k8s::events::PodEvent;

use crate::metrics::Metrics;

/// The most events waiting to be written.
pub const QUEUE_MAX: usize = 1024;

/// How long one event's write may take (one try; the API client's own timeout if shorter).
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub struct EventWriter {
    queue: SyncSender<PodEvent>,
    metrics: Arc<Metrics>,
}

impl EventWriter {
    /// Start the writer thread on `api`.
    pub fn start(api: Arc<ApiClient>, metrics: Arc<Metrics>) -> std::io::Result<EventWriter> {
        let (queue, events) = sync_channel::<PodEvent>(QUEUE_MAX);
        let instance = plexus_k8s::events::reporting_instance();
        let m = metrics.clone();
        std::thread::Builder::new().name("events".into()).spawn(move || {
            for e in events {
                m.api_request("create_event");
                if let Err(why) = api.record_event(&e, &instance, WRITE_TIMEOUT) {
                    tracing::warn!("event {} on pod {}/{} not recorded: {why}", e.reason, e.pod.namespace, e.pod.name);
                }
            }
        })?;
        Ok(EventWriter { queue, metrics })
    }

    /// Queue `events`; those the queue has no room for are dropped.
    pub fn submit(&self, events: &[PodEvent]) {
        for e in events {
            match self.queue.try_send(e.clone()) {
                Ok(()) => {}
                Err(TrySendError::Full(e)) | Err(TrySendError::Disconnected(e)) => {
                    self.metrics.event_dropped();
                    tracing::warn!(
                        "event {} on pod {}/{} dropped: {QUEUE_MAX} events wait already",
                        e.reason,
                        e.pod.namespace,
                        e.pod.name
                    );
                }
            }
        }
    }
}
