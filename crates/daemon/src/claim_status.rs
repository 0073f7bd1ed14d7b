//! DRA claims' device status (KEP-4817), written after the answer: the meta-plugin hands each
//! claim's entries over and goes on (its ADD no longer waits for an API round trip); one thread
//! writes them through the API in the order they came, so a failed ADD's `Ready: False` never
//! lands after a retry's `Ready: True`. A write the API refuses is tried again a few times. The
//! queue holds at most [`QUEUE_MAX`] claims: past it the request writes its own, as thin mode does.

use std::sync::Arc;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::time::Duration;

use plexus_k8s::K8sError;
use plexus_k8s::api::ApiClient;
use plexus_k8s::claims::ClaimRef;
use serde_json::Value;

use crate::metrics::Metrics;

/// The most claims waiting for their status to be written.
pub const QUEUE_MAX: usize = 1024;

/// How many times a status the API refuses is written, and the pause between.
const ATTEMPTS: usize = 3;
const PAUSE: Duration = Duration::from_secs(1);

/// The writer: a queue and the thread emptying it.
pub struct ClaimStatusWriter {
    queue: SyncSender<(ClaimRef, Vec<Value>)>,
    api: Arc<ApiClient>,
    metrics: Arc<Metrics>,
}

impl ClaimStatusWriter {
    /// Start the writer thread on `api`.
    pub fn start(api: Arc<ApiClient>, metrics: Arc<Metrics>) -> std::io::Result<ClaimStatusWriter> {
        let (queue, claims) = sync_channel::<(ClaimRef, Vec<Value>)>(QUEUE_MAX);
        let (a, m) = (api.clone(), metrics.clone());
        std::thread::Builder::new().name("claim-status".into()).spawn(move || {
            for (claim, devices) in claims {
                for attempt in 1..=ATTEMPTS {
                    m.api_request("apply_claim_status");
                    match a.apply_claim_status(&claim, &devices) {
                        Ok(()) => break,
                        Err(why) if attempt < ATTEMPTS => {
                            tracing::debug!("status of claim {}/{}: {why}; again", claim.namespace, claim.name);
                            std::thread::sleep(PAUSE);
                        }
                        Err(why) => {
                            tracing::warn!("status of claim {}/{} not written: {why}", claim.namespace, claim.name)
                        }
                    }
                }
            }
        })?;
        Ok(ClaimStatusWriter { queue, api, metrics })
    }

    /// Queue `devices` as claim `claim`'s status; written here and now when the queue is full.
    pub fn submit(&self, claim: &ClaimRef, devices: &[Value]) -> Result<(), K8sError> {
        match self.queue.try_send((claim.clone(), devices.to_vec())) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full((claim, devices)) | TrySendError::Disconnected((claim, devices))) => {
                self.metrics.api_request("apply_claim_status");
                self.api.apply_claim_status(&claim, &devices)
            }
        }
    }
}
