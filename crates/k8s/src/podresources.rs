//! The kubelet's pod-resources API (`v1.PodResourcesLister`, gRPC over the kubelet's unix socket):
//! which device IDs the kubelet allocated to a pod, per resource — what Multus reads, and the
//! kubelet's supported interface (its checkpoint file, read as the fallback, is internal).
//!
//! `Get` for the pod (beta and on by default since Kubernetes 1.34), `List` when `Get` is
//! unavailable (older kubelets, the feature gate off). Only the fields plexus reads are declared,
//! with the field numbers of `k8s.io/kubelet/pkg/apis/podresources/v1`; protobuf skips the rest.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::K8sError;

/// The kubelet's default pod-resources socket.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// The longest a lookup may take unless the caller says otherwise.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(2);

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPodResourcesRequest {
    #[prost(string, tag = "1")]
    pub pod_name: String,
    #[prost(string, tag = "2")]
    pub pod_namespace: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPodResourcesResponse {
    #[prost(message, optional, tag = "1")]
    pub pod_resources: Option<PodResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    #[prost(string, tag = "1")]
    pub resource_name: String,
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
}

impl PodResources {
    /// The IDs of `resource` over all containers, sorted (one order: attachment N gets the Nth).
    pub fn device_ids(&self, resource: &str) -> Vec<String> {
        let mut ids: Vec<String> = self
            .containers
            .iter()
            .flat_map(|c| &c.devices)
            .filter(|d| d.resource_name == resource)
            .flat_map(|d| d.device_ids.iter().cloned())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }
}

/// Where the answer came from (the caller logs it).
#[derive(Debug, PartialEq, Eq)]
pub enum Source {
    Get,
    List,
}

fn unavailable(socket: &Path, e: impl std::fmt::Display) -> K8sError {
    K8sError::Unavailable(format!("kubelet pod-resources {}: {e}", socket.display()))
}

/// The devices of `resource` the kubelet allocated to pod `namespace/name`, sorted; `Ok(None)`
/// when the kubelet does not list the pod. Bounded by `deadline` as a whole.
pub fn device_ids(
    socket: &Path,
    namespace: &str,
    name: &str,
    resource: &str,
    deadline: Duration,
) -> Result<Option<(Vec<String>, Source)>, K8sError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| unavailable(socket, format!("runtime: {e}")))?;
    rt.block_on(async {
        tokio::time::timeout(deadline, lookup(socket.to_path_buf(), namespace, name, resource))
            .await
            .map_err(|_| unavailable(socket, format!("no answer within {deadline:?}")))?
    })
}

/// A gRPC channel to a kubelet's unix socket (its authority a placeholder: the socket is the
/// address). The pod-resources client's, and the kubelet's side of plexus's DRA plugin
/// (`plexus_dra::kubelet::client`).
pub async fn unix_channel(socket: &std::path::Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let socket = socket.to_path_buf();
    tonic::transport::Endpoint::from_static("http://kubelet.invalid")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = socket.clone();
            async move { tokio::net::UnixStream::connect(path).await.map(hyper_util::rt::TokioIo::new) }
        }))
        .await
}

async fn lookup(
    socket: PathBuf,
    namespace: &str,
    name: &str,
    resource: &str,
) -> Result<Option<(Vec<String>, Source)>, K8sError> {
    let channel = unix_channel(&socket).await.map_err(|e| unavailable(&socket, e))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| unavailable(&socket, e))?;
    let get = GetPodResourcesRequest { pod_name: name.into(), pod_namespace: namespace.into() };
    let path = http::uri::PathAndQuery::from_static("/v1.PodResourcesLister/Get");
    let codec = tonic_prost::ProstCodec::<GetPodResourcesRequest, GetPodResourcesResponse>::default();
    match grpc.unary(tonic::Request::new(get), path, codec).await {
        Ok(r) => return Ok(r.into_inner().pod_resources.map(|p| (p.device_ids(resource), Source::Get))),
        Err(status) => tracing::debug!("pod-resources Get: {}; trying List", status.message()),
    }
    grpc.ready().await.map_err(|e| unavailable(&socket, e))?;
    let path = http::uri::PathAndQuery::from_static("/v1.PodResourcesLister/List");
    let codec = tonic_prost::ProstCodec::<ListPodResourcesRequest, ListPodResourcesResponse>::default();
    let all = grpc
        .unary(tonic::Request::new(ListPodResourcesRequest {}), path, codec)
        .await
        .map_err(|s| unavailable(&socket, format!("List: {}", s.message())))?
        .into_inner();
    Ok(all
        .pod_resources
        .into_iter()
        .find(|p| p.namespace == namespace && p.name == name)
        .map(|p| (p.device_ids(resource), Source::List)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn device_ids_of_a_resource_come_from_every_container_sorted_and_once() {
        let pod = PodResources {
            name: "trainer".into(),
            namespace: "default".into(),
            containers: vec![
                ContainerResources {
                    name: "a".into(),
                    devices: vec![
                        ContainerDevices {
                            resource_name: "nvidia.com/rdma".into(),
                            device_ids: vec!["0000:3b:00.3".into()],
                        },
                        ContainerDevices { resource_name: "nvidia.com/gpu".into(), device_ids: vec!["GPU-1".into()] },
                    ],
                },
                ContainerResources {
                    name: "b".into(),
                    devices: vec![ContainerDevices {
                        resource_name: "nvidia.com/rdma".into(),
                        device_ids: vec!["0000:3b:00.2".into(), "0000:3b:00.3".into()],
                    }],
                },
            ],
        };
        assert_eq!(pod.device_ids("nvidia.com/rdma"), ["0000:3b:00.2", "0000:3b:00.3"]);
        assert!(pod.device_ids("example.com/none").is_empty());
    }

    #[test]
    fn messages_decode_the_kubelets_wire_form_skipping_fields_not_declared() {
        // PodResources{name: "p", namespace: "ns", containers: [{name: "c", devices:
        // [{resource_name: "r", device_ids: ["d"]}], cpu_ids: [3]}]} as the kubelet encodes it
        // (cpu_ids, field 3 of ContainerResources, is not declared here).
        let device = [0x0a, 0x01, b'r', 0x12, 0x01, b'd'];
        let mut container = vec![0x0a, 0x01, b'c', 0x12, device.len() as u8];
        container.extend_from_slice(&device);
        container.extend_from_slice(&[0x1a, 0x01, 0x03]);
        let mut pod = vec![0x0a, 0x01, b'p', 0x12, 0x02, b'n', b's', 0x1a, container.len() as u8];
        pod.extend_from_slice(&container);
        let decoded = PodResources::decode(pod.as_slice()).unwrap();
        assert_eq!((decoded.name.as_str(), decoded.namespace.as_str()), ("p", "ns"));
        assert_eq!(decoded.device_ids("r"), ["d"]);
    }

    #[test]
    fn an_absent_socket_is_unavailable_quickly() {
        let dir = tempfile::tempdir().unwrap();
        let start = std::time::Instant::now();
        let e = device_ids(&dir.path().join("kubelet.sock"), "default", "p", "r", Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, K8sError::Unavailable(_)), "{e}");
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}
