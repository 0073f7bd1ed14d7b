//! plexus as a DRA driver (Kubernetes Dynamic Resource Allocation, `resource.k8s.io/v1`).
//!
//! - [`nics`]: which of the node's netdevs are offered (RoCE ports: an RDMA device, not the
//!   uplink, not a bridge port, allowed by the node policy), exclusive or shared;
//! - [`kubelet`]: the kubelet plugin: registration and the DRA gRPC service on unix sockets;
//! - [`slice`]: the node's ResourceSlice of those ports, with the standard `pcieRoot` attribute;
//! - [`ready`]: whether the kubelet can use the driver yet (registered, slices published).

pub mod cdi;
pub mod claims;
pub mod driver;
pub mod error;
pub mod kubelet;
pub mod nics;
pub mod publish;
pub mod ready;
pub mod slice;

/// The driver's name: the `driver` of its ResourceSlices, DeviceClasses' selectors and claims'
/// configs, and the domain of its device attributes.
pub const DRIVER: &str = "plexus.dev";

pub use error::DraError;
