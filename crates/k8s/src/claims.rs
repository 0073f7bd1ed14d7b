//! A ResourceClaim's device status (KEP-4817, `status.devices[]`), as plexus's DRA driver writes
//! it: by server-side apply of the status subresource with field manager `plexus.dev`, so each
//! driver's entries (keyed by driver, pool, device and share) stay its own. An apply that names no
//! entry removes the ones plexus wrote. The claim's UID is in the applied object: a later claim of
//! the same name is not written to (the API refuses the apply).

use serde_json::{Value, json};

use crate::K8sError;
use crate::api::{ApiClient, Reply};
use crate::names::ApiPath;

/// The API group and version of ResourceClaims.
const RESOURCE_API: &str = "/apis/resource.k8s.io/v1";

/// The field manager of plexus's entries.
pub const FIELD_MANAGER: &str = "plexus.dev";

/// A claim, as its status is written.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// A `Ready` condition (`status` "True" or "False") with its reason and message, as of now.
pub fn ready_condition(status: &str, reason: &str, message: &str) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now().round(k8s_openapi::jiff::Unit::Second).unwrap_or_default();
    json!({"type": "Ready", "status": status, "reason": reason, "message": message, "lastTransitionTime": now.to_string()})
}

/// The apply configuration of `claim`'s status with `devices`.
pub fn apply_body(claim: &ClaimRef, devices: &[Value]) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
        "status": {"devices": devices},
    })
}

impl ApiClient {
    /// ResourceClaim `namespace/name`; `None` when there is none.
    pub fn resource_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::resource::v1::ResourceClaim>, K8sError> {
        let path = ApiPath::object(RESOURCE_API, namespace, "resourceclaims", "resourceclaim", name)?;
        let what = format!("get resourceclaim {namespace}/{name}");
        match self.send(&what, http::Method::GET, &path, "application/json", None)? {
            Reply::Ok(v) => serde_json::from_value(v).map(Some).map_err(|e| K8sError::Refused(format!("{what}: {e}"))),
            Reply::NotFound => Ok(None),
            Reply::Conflict(m) => Err(K8sError::Refused(format!("{what}: {m}"))),
        }
    }

    /// Make plexus's entries of `claim`'s `status.devices` be `devices` (none: removed). A claim
    /// that is gone is not an error.
    pub fn apply_claim_status(&self, claim: &ClaimRef, devices: &[Value]) -> Result<(), K8sError> {
        let path = ApiPath::object(RESOURCE_API, &claim.namespace, "resourceclaims", "resourceclaim", &claim.name)?
            .subresource("status")
            .query("fieldManager", FIELD_MANAGER)
            .query("force", true);
        let what = format!("apply status of resourceclaim {}/{}", claim.namespace, claim.name);
        match self.send(
            &what,
            http::Method::PATCH,
            &path,
            "application/apply-patch+yaml",
            Some(&apply_body(claim, devices)),
        )? {
            Reply::Ok(_) | Reply::NotFound => Ok(()),
            Reply::Conflict(m) => Err(K8sError::Refused(format!("{what}: {m}"))),
        }
    }
}
