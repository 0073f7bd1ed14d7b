//! The driver's side of the kubelet's calls: prepare a claim (read it from the API, work out its
//! devices, write its CDI spec, keep it for the meta-plugin's ADD), unprepare it (forget both).
//! Prepare is idempotent: a claim prepared already is answered from what was kept (the kubelet
//! asks again after it restarts).

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::claims::{self, Prepared, Store};
use crate::error::{DraError, Result};
use crate::kubelet::{self, Claim};
use crate::nics::Nic;

/// Where the driver reads claims from: the API (a fake in tests).
pub trait ClaimSource: Send + Sync + 'static {
    fn claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim>;
    /// Remove plexus's entries of the claim's device status (what the meta-plugin's ADD wrote).
    fn clear_status(&self, claim: &Claim) -> Result<()>;
}

/// The node's offered ports now.
pub trait Ports: Send + Sync + 'static {
    fn nics(&self) -> Vec<Nic>;
}

/// plexus's DRA driver on one node.
pub struct Driver {
    pub node: String,
    pub claims: Arc<dyn ClaimSource>,
    pub ports: Arc<dyn Ports>,
    pub store: Store,
    /// Where CDI specs go (containerd's `/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// The host's `/dev` (its `infiniband/` nodes).
    pub dev_root: PathBuf,
    /// Told when the kubelet registers the plugin (plexus-daemon's readiness waits for it).
    pub ready: Arc<crate::ready::Readiness>,
}

fn answer(p: &Prepared) -> Vec<kubelet::Device> {
    p.devices
        .iter()
        .map(|d| kubelet::Device {
            request_names: vec![d.request.clone()],
            pool_name: d.pool.clone(),
            device_name: d.device.clone(),
            cdi_device_ids: d.cdi_device_ids.clone(),
        })
        .collect()
}

impl Driver {
    fn prepare_new(&self, claim: &Claim) -> Result<Prepared> {
        let refused =
            |why: String| DraError::Claim { namespace: claim.namespace.clone(), name: claim.name.clone(), why };
        let object = self.claims.claim(&claim.namespace, &claim.name)?;
        if object.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            let api = object.metadata.uid.as_deref().unwrap_or("none");
            return Err(refused(format!("the API has UID {api}, the kubelet asked for {}", claim.uid)));
        }
        let nics = self.ports.nics();
        let mut prepared = claims::prepare(&object, &self.node, &nics)?;
        if prepared.devices.is_empty() {
            return Ok(prepared);
        }
        let nodes: Vec<(String, Vec<String>)> = prepared
            .devices
            .iter()
            .map(|d| {
                let uverbs = nics.iter().find(|n| n.device == d.device).map(|n| n.uverbs.clone()).unwrap_or_default();
                (d.device.clone(), uverbs)
            })
            .collect();
        let spec = crate::cdi::spec(&claim.uid, &nodes, &self.dev_root).map_err(|e| refused(e.to_string()))?;
        crate::cdi::write(&self.cdi_dir, &claim.uid, &spec)?;
        for d in &mut prepared.devices {
            d.cdi_device_ids = vec![crate::cdi::device_id(&claim.uid, &d.device)];
        }
        if let Err(e) = self.store.save(&prepared) {
            // Nothing half-made stays.
            let _ = crate::cdi::remove(&self.cdi_dir, &claim.uid);
            return Err(e);
        }
        Ok(prepared)
    }
}

impl kubelet::Driver for Driver {
    fn registered(&self, status: &kubelet::RegistrationStatus) {
        if status.plugin_registered {
            tracing::info!("registered with the kubelet");
        } else {
            tracing::error!("the kubelet refused the registration: {}", status.error);
        }
        self.ready.set_registered(status.plugin_registered);
    }

    fn prepare(&self, claim: &Claim) -> std::result::Result<Vec<kubelet::Device>, String> {
        if let Some(kept) = self.store.load(&claim.uid).map_err(|e| e.to_string())? {
            return Ok(answer(&kept));
        }
        let prepared = self.prepare_new(claim).map_err(|e| e.to_string())?;
        tracing::info!(
            "claim {}/{} ({}) prepared: {} device(s) for pod(s) {:?}",
            claim.namespace,
            claim.name,
            claim.uid,
            prepared.devices.len(),
            prepared.pods
        );
        Ok(answer(&prepared))
    }

    fn unprepare(&self, claim: &Claim) -> std::result::Result<(), String> {
        // The claim's status says no more than what is there: best effort (the API server drops
        // the entries itself once the devices are deallocated).
        if let Err(e) = self.claims.clear_status(claim) {
            tracing::warn!("claim {}/{}: status not cleared: {e}", claim.namespace, claim.name);
        }
        crate::cdi::remove(&self.cdi_dir, &claim.uid).map_err(|e| e.to_string())?;
        self.store.remove(&claim.uid).map_err(|e| e.to_string())?;
        tracing::info!("claim {}/{} ({}) unprepared", claim.namespace, claim.name, claim.uid);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
