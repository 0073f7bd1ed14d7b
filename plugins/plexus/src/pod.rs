//! The pod a request is for, as the runtime names it in `CNI_ARGS` (`K8S_POD_NAMESPACE`,
//! `K8S_POD_NAME`, `K8S_POD_UID`, `K8S_POD_INFRA_CONTAINER_ID`): where its NADs are looked up,
//! what its network-status and events are written to.

use plexus_k8s::DEFAULT_NAMESPACE;
use plexus_k8s::status::PodRef;
use plexus_plugin::Request;

/// The pod, as the runtime names it in `CNI_ARGS`.
#[derive(Clone, Debug)]
pub struct Pod {
    /// Its namespace, name and UID: where its NADs are looked up, what its network-status and
    /// events are written to.
    pub who: PodRef,
    pub infra_container_id: String,
}

impl Default for Pod {
    /// No pod (STATUS, GC, standalone use): NADs are looked up in `default`.
    fn default() -> Pod {
        Pod {
            who: PodRef { namespace: DEFAULT_NAMESPACE.into(), name: String::new(), uid: String::new() },
            infra_container_id: String::new(),
        }
    }
}

impl Pod {
    pub fn from_request(req: &Request) -> Pod {
        let arg = |k: &str| req.env.args.get(k).unwrap_or_default().to_string();
        let namespace = arg("K8S_POD_NAMESPACE");
        Pod {
            who: PodRef {
                namespace: if namespace.is_empty() { DEFAULT_NAMESPACE.into() } else { namespace },
                name: arg("K8S_POD_NAME"),
                uid: arg("K8S_POD_UID"),
            },
            infra_container_id: arg("K8S_POD_INFRA_CONTAINER_ID"),
        }
    }
}
