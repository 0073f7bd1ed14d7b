//! whereabouts' Lease (`coordination.k8s.io/v1`, `whereabouts` in the IPAM namespace), for a
//! `kubernetes` store with `"leaderElection": true`: taken as client-go's leader election takes
//! it (free, expired, or already ours → update with the read resourceVersion), held for one
//! change, released by clearing the holder — so plexus-ipam and whereabouts take turns exactly as
//! whereabouts' own writers do.

use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use plexus_k8s::api::{ApiClient, Reply};
use plexus_k8s::names::ApiPath;
use serde_json::{Value, json};

use crate::error::IpamError;

const NAME: &str = "whereabouts";
/// whereabouts' defaults: lease 1500 ms (1 s as the object's whole seconds), retry 500 ms.
const LEASE_SECONDS: i64 = 1;
const RETRY: Duration = Duration::from_millis(500);

pub struct Lease {
    path: ApiPath,
    object: Value,
}

fn unavailable(e: impl std::fmt::Display) -> IpamError {
    IpamError::Unavailable(format!("Kubernetes lease {NAME}: {e}"))
}

fn now() -> Value {
    serde_json::to_value(MicroTime(Timestamp::now())).expect("time")
}

impl Lease {
    pub fn acquire(api: &ApiClient, namespace: &str, me: &str, deadline: Instant) -> Result<Lease, IpamError> {
        let config = |e: plexus_k8s::K8sError| IpamError::Config(e.to_string());
        let base = ApiPath::collection("/apis/coordination.k8s.io/v1", namespace, "leases").map_err(config)?;
        let path =
            ApiPath::object("/apis/coordination.k8s.io/v1", namespace, "leases", "lease", NAME).map_err(config)?;
        loop {
            let got = match api.send("get lease", Method::GET, &path, "application/json", None).map_err(unavailable)? {
                Reply::NotFound => {
                    let obj = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": NAME, "namespace": namespace},
                        "spec": {"holderIdentity": me, "leaseDurationSeconds": LEASE_SECONDS,
                                 "acquireTime": now(), "renewTime": now(), "leaseTransitions": 0}});
                    api.send("create lease", Method::POST, &base, "application/json", Some(&obj))
                        .map_err(unavailable)?
                }
                Reply::Ok(mut obj) => {
                    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
                    let holder = spec.get("holderIdentity").and_then(Value::as_str).unwrap_or_default();
                    let renewed =
                        spec.get("renewTime").and_then(Value::as_str).and_then(|t| t.parse::<Timestamp>().ok());
                    let seconds = spec.get("leaseDurationSeconds").and_then(Value::as_i64).unwrap_or(LEASE_SECONDS);
                    let expired =
                        renewed.is_none_or(|r| r.as_millisecond() + seconds * 1000 < Timestamp::now().as_millisecond());
                    if holder.is_empty() || holder == me || expired {
                        let transitions = spec.get("leaseTransitions").and_then(Value::as_i64).unwrap_or(0);
                        obj["spec"] = json!({"holderIdentity": me, "leaseDurationSeconds": LEASE_SECONDS,
                            "acquireTime": now(), "renewTime": now(),
                            "leaseTransitions": transitions + i64::from(holder != me)});
                        api.send("update lease", Method::PUT, &path, "application/json", Some(&obj))
                            .map_err(unavailable)?
                    } else {
                        Reply::Conflict(format!("held by {holder}"))
                    }
                }
                other => other,
            };
            if let Reply::Ok(object) = got {
                return Ok(Lease { path, object });
            }
            if Instant::now() + RETRY >= deadline {
                return Err(unavailable("not acquired in time"));
            }
            std::thread::sleep(RETRY);
        }
    }

    /// Give the lease up (as client-go's ReleaseOnCancel): the holder cleared. A failure only
    /// leaves it to expire.
    pub fn release(mut self, api: &ApiClient) {
        self.object["spec"]["holderIdentity"] = json!("");
        self.object["spec"]["renewTime"] = now();
        if let Err(e) = api.send("release lease", Method::PUT, &self.path, "application/json", Some(&self.object)) {
            tracing::warn!("{e}");
        }
    }
}
