//! The kubelet's side of the plugin's sockets: a gRPC call as the kubelet makes it, and its
//! registration of a plugin (`GetInfo`, then `NotifyRegistrationStatus`). Not used by plexus's
//! binaries: the unit tests call the plugin through it, and so does the hollow nodes' kubelet
//! stand-in (plexus-tests), which registers each node's plexus-daemon as the kubelet would.

use std::path::Path;

use super::{GET_INFO, InfoRequest, NOTIFY, PluginInfo, RegistrationStatus, RegistrationStatusResponse};

/// One unary call of `path` (`/package.Service/Method`) on the unix socket `socket`.
pub async fn call<Req, Resp>(socket: &Path, path: &'static str, req: Req) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let channel = plexus_k8s::podresources::unix_channel(socket)
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect {}: {e}", socket.display())))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    grpc.unary(tonic::Request::new(req), http::uri::PathAndQuery::from_static(path), codec)
        .await
        .map(|r| r.into_inner())
}

/// What the kubelet's plugin watcher does with a registration socket it finds: asks what the
/// plugin is, then tells it that it is registered. The plugin's answer to the first.
pub async fn register(registration_socket: &Path) -> Result<PluginInfo, tonic::Status> {
    let info: PluginInfo = call(registration_socket, GET_INFO, InfoRequest {}).await?;
    let _: RegistrationStatusResponse =
        call(registration_socket, NOTIFY, RegistrationStatus { plugin_registered: true, error: String::new() }).await?;
    Ok(info)
}
