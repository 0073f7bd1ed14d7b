//! The store's objects on the API server: a range's IPPool (read from etcd or the watch cache,
//! created when missing, within the namespace's cap) and its JSON patches, and the
//! OverlappingRangeIPReservation beside each entry.

use std::net::IpAddr;

use http::Method;
use plexus_k8s::api::{ACCEPT_METADATA, ACCEPT_METADATA_LIST, Reply};
use serde_json::{Value, json};

use super::{JSON, JSON_PATCH, KubernetesStore, Read, unavailable};
use crate::error::IpamError;
use crate::range::IpRange;
use crate::store::kubernetes::batch::removal;
use crate::store::kubernetes::names::{pool_name, reservation_name};
use crate::store::kubernetes::pool::{Pool, reserved_for};
use crate::store::{Allocation, Owner};

impl KubernetesStore {
    /// The pool of `range`; when it does not exist yet, created (empty) if `create`, else
    /// `None`. `Read::Cached` takes it from the API server's watch cache (no etcd read; maybe a
    /// moment old), for a write whose every answer its `test`s check.
    pub(super) fn pool(&self, range: &IpRange, read: Read, create: bool) -> Result<Option<Pool>, IpamError> {
        let name = pool_name(self.network_name.as_deref(), range);
        let mut path = self.path("ippools", Some(&name))?;
        if read == Read::Cached {
            path = path.query("resourceVersion", 0);
        }
        for _ in 0..3 {
            let what = format!("get ippool {}/{name}", self.namespace);
            match self.api.send(&what, Method::GET, &path, JSON, None).map_err(unavailable)? {
                Reply::Ok(obj) => return Ok(Some(Pool::from_object(&name, &obj, range))),
                Reply::NotFound if !create => return Ok(None),
                Reply::NotFound => {
                    self.refuse_past_pool_limit(&name)?;
                    let obj = json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
                        "metadata": {"name": name, "namespace": self.namespace, "annotations": {}},
                        "spec": {"range": range.network.to_string(), "allocations": {}}});
                    let what = format!("create ippool {}/{name}", self.namespace);
                    // Created by another writer meanwhile: read it again (from etcd).
                    path = self.path("ippools", Some(&name))?;
                    self.api
                        .send(&what, Method::POST, &self.path("ippools", None)?, JSON, Some(&obj))
                        .map_err(unavailable)?;
                }
                Reply::Conflict(m) => return Err(unavailable(m)),
            }
        }
        Err(unavailable(format!("ippool {name} could not be read")))
    }

    /// Refuse to create IPPool `name` when the namespace holds [`KubernetesStore::max_pools`]
    /// already (code 7, the policy's `limits.kubernetesPools`): a tenant chooses ranges and
    /// `network_name`, and the node's credentials would create a pool for each.
    pub(super) fn refuse_past_pool_limit(&self, name: &str) -> Result<(), IpamError> {
        let what = format!("list ippools {}", self.namespace);
        let path = self.path("ippools", None)?.query("limit", self.max_pools);
        let listed = self.api.send_accepting(&what, Method::GET, &path, JSON, ACCEPT_METADATA_LIST, None);
        let list = match listed {
            Ok(Reply::Ok(list)) => list,
            Ok(_) => return Ok(()),
            // Without the count the bound cannot hold: no pool is made (a clear refusal, not a retry).
            Err(plexus_k8s::K8sError::Refused(e)) => {
                return Err(IpamError::Refused(format!(
                    "IPPool {name} not created: counting the namespace's IPPools (limits.kubernetesPools): {e}; the \
                     node's RBAC needs \"list\" on ippools (conf-examples/deploy/rbac-ipam-kubernetes.yaml)"
                )));
            }
            Err(e) => return Err(unavailable(e)),
        };
        let listed = list.get("items").and_then(Value::as_array).map_or(0, Vec::len);
        let more = list.pointer("/metadata/continue").and_then(Value::as_str).is_some_and(|c| !c.is_empty());
        if listed >= self.max_pools || more {
            return Err(IpamError::Refused(format!(
                "IPPool {name} not created: namespace {} holds {}{listed} IPPools, the node policy allows at most {} \
                 (limits.kubernetesPools)",
                self.namespace,
                if more { "more than " } else { "" },
                self.max_pools
            )));
        }
        Ok(())
    }

    /// Apply `ops` to the pool; `false` when a `test` failed (or the pool is gone). Every write
    /// also clears the pool's `managedFields` (Kubernetes' documented reset: a list of one empty
    /// entry): the API server's field set of an object written by plain patches lists every
    /// entry, so on a 1,000-entry pool it was 45% of the object, decoded, rebuilt and stored
    /// again on each write. Nothing reads it (pools are never server-side applied). The answer
    /// is the pool's metadata only: nothing here reads the rest.
    pub(super) fn patch_pool(&self, pool: &str, ops: &[Value]) -> Result<bool, IpamError> {
        let what = format!("patch ippool {}/{pool}", self.namespace);
        let mut ops = ops.to_vec();
        ops.push(json!({"op": "add", "path": "/metadata/managedFields", "value": [{}]}));
        match self
            .api
            .send_accepting(
                &what,
                Method::PATCH,
                &self.path("ippools", Some(pool))?,
                JSON_PATCH,
                ACCEPT_METADATA,
                Some(&Value::Array(ops)),
            )
            .map_err(unavailable)?
        {
            Reply::Ok(_) => Ok(true),
            Reply::Conflict(_) | Reply::NotFound => Ok(false),
        }
    }

    /// Remove `owner`'s entry at `offset` (it got it, but cannot keep it).
    pub(super) fn give_back(&self, pool: &str, offset: u128, owner: &Owner) -> Result<(), IpamError> {
        self.patch_pool(pool, &removal(offset, &owner.container_id)).map(|_| ())
    }

    /// Create the address's OverlappingRangeIPReservation; `false` when another attachment
    /// holds it (an overlapping range gave it out).
    pub(super) fn reserve(&self, ip: IpAddr, owner: &Owner) -> Result<bool, IpamError> {
        let name = reservation_name(self.network_name.as_deref(), ip);
        let obj = json!({"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "OverlappingRangeIPReservation",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"containerid": owner.container_id, "podref": owner.pod_ref.clone().unwrap_or_default(), "ifname": owner.ifname}});
        let what = format!("create overlappingrangeipreservation {}/{name}", self.namespace);
        match self
            .api
            .send(&what, Method::POST, &self.path("overlappingrangeipreservations", None)?, JSON, Some(&obj))
            .map_err(unavailable)?
        {
            Reply::Ok(_) => Ok(true),
            Reply::Conflict(_) => {
                // Ours already (a retried ADD)?
                let what = format!("get overlappingrangeipreservation {}/{name}", self.namespace);
                match self
                    .api
                    .send(&what, Method::GET, &self.path("overlappingrangeipreservations", Some(&name))?, JSON, None)
                    .map_err(unavailable)?
                {
                    Reply::Ok(r) => Ok(r.pointer("/spec/containerid").and_then(Value::as_str)
                        == Some(&owner.container_id)
                        && r.pointer("/spec/ifname").and_then(Value::as_str) == Some(&owner.ifname)),
                    _ => Ok(false),
                }
            }
            Reply::NotFound => Err(unavailable("the OverlappingRangeIPReservation resource is not installed")),
        }
    }

    /// The address's reservation passed from the pod's old container to `owner` (created when
    /// it is missing), so the new container's DEL removes it.
    pub(super) fn reown(&self, ip: IpAddr, old_container: &str, owner: &Owner) -> Result<(), IpamError> {
        let name = reservation_name(self.network_name.as_deref(), ip);
        let path = self.path("overlappingrangeipreservations", Some(&name))?;
        let what = format!("overlappingrangeipreservation {}/{name}", self.namespace);
        match self.api.send(&what, Method::GET, &path, JSON, None).map_err(unavailable)? {
            Reply::Ok(r)
                if reserved_for(&r, old_container, owner.pod_ref.as_deref().unwrap_or_default(), &owner.ifname) =>
            {
                let ops = json!([{"op": "add", "path": "/spec/containerid", "value": owner.container_id}]);
                self.api.send(&what, Method::PATCH, &path, JSON_PATCH, Some(&ops)).map_err(unavailable)?;
                Ok(())
            }
            Reply::Ok(_) => Ok(()),
            _ => self.reserve(ip, owner).map(|_| ()),
        }
    }

    /// Delete the address's OverlappingRangeIPReservation if the released allocation `a` holds it.
    pub(super) fn unreserve(&self, a: &Allocation) -> Result<(), IpamError> {
        let name = reservation_name(self.network_name.as_deref(), a.ip);
        let path = self.path("overlappingrangeipreservations", Some(&name))?;
        let what = format!("overlappingrangeipreservation {}/{name}", self.namespace);
        let Reply::Ok(r) = self.api.send(&what, Method::GET, &path, JSON, None).map_err(unavailable)? else {
            return Ok(());
        };
        if !reserved_for(&r, &a.owner.container_id, a.owner.pod_ref.as_deref().unwrap_or_default(), &a.owner.ifname) {
            return Ok(());
        }
        let rv = r.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null);
        let opts = json!({"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": rv}});
        self.api.send(&what, Method::DELETE, &path, JSON, Some(&opts)).map_err(unavailable)?;
        Ok(())
    }
}
