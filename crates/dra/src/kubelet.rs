//! The kubelet plugin: the kubelet's plugin registration (`pluginregistration.Registration` on
//! `<registry>/<driver>-reg.sock`) and the DRA service (`DRAPlugin`, v1 and v1beta1, on
//! `<plugins>/<driver>/dra.sock`), gRPC over unix sockets.
//!
//! Only the messages are declared here, with the field numbers of
//! `k8s.io/kubelet/pkg/apis/dra/v1/api.proto` and `.../pluginregistration/v1/api.proto` (v0.34):
//! no protoc in the build. The kubelet finds the registration socket by watching its registry
//! directory (also when it restarts: the sockets there are registered again), asks `GetInfo`,
//! dials the endpoint named there and calls `NodePrepareResources` before a pod's sandbox is made
//! and `NodeUnprepareResources` once it is gone. Both sockets are the admin's paths, made
//! root-only; a stale socket left by an earlier run is replaced.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

mod authority;
pub mod client;
pub use authority::LocalAuthority;

/// The plugin type the kubelet's DRA manager handles.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA services this plugin speaks, the preferred first (the kubelet takes the first it knows).
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// A claim as the kubelet names it.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct Claim {
    #[prost(string, tag = "1")]
    pub namespace: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePrepareResourcesRequest {
    #[prost(message, repeated, tag = "1")]
    pub claims: Vec<Claim>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePrepareResourcesResponse {
    /// By claim UID; every claim asked for has an answer.
    #[prost(map = "string, message", tag = "1")]
    pub claims: HashMap<String, NodePrepareResourceResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePrepareResourceResponse {
    #[prost(message, repeated, tag = "1")]
    pub devices: Vec<Device>,
    /// Not empty: the claim was not prepared (the kubelet retries, and shows it in the pod's events).
    #[prost(string, tag = "2")]
    pub error: String,
}

/// A prepared device: which requests it serves, and the CDI devices the containers get.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Device {
    #[prost(string, repeated, tag = "1")]
    pub request_names: Vec<String>,
    #[prost(string, tag = "2")]
    pub pool_name: String,
    #[prost(string, tag = "3")]
    pub device_name: String,
    #[prost(string, repeated, tag = "4")]
    pub cdi_device_ids: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnprepareResourcesRequest {
    #[prost(message, repeated, tag = "1")]
    pub claims: Vec<Claim>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnprepareResourcesResponse {
    #[prost(map = "string, message", tag = "1")]
    pub claims: HashMap<String, NodeUnprepareResourceResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnprepareResourceResponse {
    #[prost(string, tag = "1")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct InfoRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginInfo {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub endpoint: String,
    #[prost(string, repeated, tag = "4")]
    pub supported_versions: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegistrationStatus {
    #[prost(bool, tag = "1")]
    pub plugin_registered: bool,
    #[prost(string, tag = "2")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RegistrationStatusResponse {}

/// What the driver does for the kubelet. Called on a blocking thread: it may read the API and
/// write files. Each claim's answer is its own (one claim's failure is not another's).
pub trait Driver: Send + Sync + 'static {
    /// Prepare each claim: `Ok(devices)` or why not.
    fn prepare(&self, claim: &Claim) -> Result<Vec<Device>, String>;
    /// Undo [`Driver::prepare`] of each claim; a claim never prepared, or already unprepared, is
    /// success.
    fn unprepare(&self, claim: &Claim) -> Result<(), String>;
    /// The kubelet's word on the registration (logged).
    fn registered(&self, status: &RegistrationStatus) {
        if status.plugin_registered {
            tracing::info!("registered with the kubelet");
        } else {
            tracing::error!("the kubelet refused the registration: {}", status.error);
        }
    }
}

/// Where the sockets go (the kubelet's defaults: `/var/lib/kubelet/plugins_registry` and
/// `/var/lib/kubelet/plugins/<driver>`).
#[derive(Clone, Debug)]
pub struct Sockets {
    pub registry_dir: PathBuf,
    pub plugin_dir: PathBuf,
}

impl Sockets {
    pub fn under(kubelet_dir: &Path, driver: &str) -> Sockets {
        Sockets {
            registry_dir: kubelet_dir.join("plugins_registry"),
            plugin_dir: kubelet_dir.join("plugins").join(driver),
        }
    }
    pub fn registration(&self, driver: &str) -> PathBuf {
        self.registry_dir.join(format!("{driver}-reg.sock"))
    }
    pub fn dra(&self) -> PathBuf {
        self.plugin_dir.join("dra.sock")
    }
}

const PREPARE_V1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
const UNPREPARE_V1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";
const PREPARE_V1BETA1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources";
const UNPREPARE_V1BETA1: &str = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources";
const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
const NOTIFY: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";

/// The kubelet's calls answered by `driver` (both services: the kubelet dials one socket per
/// service, either would do for both).
#[derive(Clone)]
pub struct Service {
    driver: Arc<dyn Driver>,
    info: Arc<PluginInfo>,
}

impl Service {
    pub fn new(driver: Arc<dyn Driver>, name: &str, sockets: &Sockets) -> Service {
        let info = PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: name.into(),
            endpoint: sockets.dra().display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        };
        Service { driver, info: Arc::new(info) }
    }

    fn prepare(&self, req: NodePrepareResourcesRequest) -> NodePrepareResourcesResponse {
        let claims = req
            .claims
            .iter()
            .map(|c| {
                let answer = match self.driver.prepare(c) {
                    Ok(devices) => NodePrepareResourceResponse { devices, error: String::new() },
                    Err(error) => {
                        tracing::warn!("claim {}/{} ({}) not prepared: {error}", c.namespace, c.name, c.uid);
                        NodePrepareResourceResponse { devices: Vec::new(), error }
                    }
                };
                (c.uid.clone(), answer)
            })
            .collect();
        NodePrepareResourcesResponse { claims }
    }

    fn unprepare(&self, req: NodeUnprepareResourcesRequest) -> NodeUnprepareResourcesResponse {
        let claims = req
            .claims
            .iter()
            .map(|c| {
                let error = self.driver.unprepare(c).err().unwrap_or_default();
                if !error.is_empty() {
                    tracing::warn!("claim {}/{} ({}) not unprepared: {error}", c.namespace, c.name, c.uid);
                }
                (c.uid.clone(), NodeUnprepareResourceResponse { error })
            })
            .collect();
        NodeUnprepareResourcesResponse { claims }
    }
}

/// A unary gRPC method as a closure (what tonic's generated servers write out per method).
struct Unary<F>(F);

impl<Req, Resp, F> tonic::server::UnaryService<Req> for Unary<F>
where
    Req: Send + 'static,
    Resp: Send + 'static,
    F: FnMut(Req) -> BoxFuture<'static, Result<Resp, tonic::Status>>,
{
    type Response = Resp;
    type Future = BoxFuture<'static, Result<tonic::Response<Resp>, tonic::Status>>;
    fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
        let answer = (self.0)(request.into_inner());
        Box::pin(async move { answer.await.map(tonic::Response::new) })
    }
}

/// Run a blocking call of the driver off the runtime's threads.
fn blocking<Resp: Send + 'static>(
    f: impl FnOnce() -> Resp + Send + 'static,
) -> BoxFuture<'static, Result<Resp, tonic::Status>> {
    Box::pin(async move {
        tokio::task::spawn_blocking(f).await.map_err(|e| tonic::Status::internal(format!("the driver panicked: {e}")))
    })
}

fn unary<Req, Resp, B, F>(req: http::Request<B>, f: F) -> BoxFuture<'static, http::Response<tonic::body::Body>>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    F: FnMut(Req) -> BoxFuture<'static, Result<Resp, tonic::Status>> + Send + 'static,
{
    Box::pin(async move {
        let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::<Resp, Req>::default());
        grpc.unary(Unary(f), req).await
    })
}

impl<B> tower::Service<http::Request<B>> for Service
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let this = self.clone();
        let answer = match req.uri().path() {
            PREPARE_V1 | PREPARE_V1BETA1 => unary(req, move |r: NodePrepareResourcesRequest| {
                let this = this.clone();
                blocking(move || this.prepare(r))
            }),
            UNPREPARE_V1 | UNPREPARE_V1BETA1 => unary(req, move |r: NodeUnprepareResourcesRequest| {
                let this = this.clone();
                blocking(move || this.unprepare(r))
            }),
            GET_INFO => unary(req, move |_: InfoRequest| {
                let info = (*this.info).clone();
                Box::pin(async move { Ok(info) })
            }),
            NOTIFY => unary(req, move |status: RegistrationStatus| {
                this.driver.registered(&status);
                Box::pin(async move {
                    match status.plugin_registered {
                        true => Ok(RegistrationStatusResponse {}),
                        false => Err(tonic::Status::internal(status.error)),
                    }
                })
            }),
            _ => Box::pin(async { tonic::Status::unimplemented("not a method of this plugin").into_http() }),
        };
        Box::pin(async move { Ok(answer.await) })
    }
}

/// The service under each name tonic's router routes by (`/<name>/<method>`): one type per name.
macro_rules! named {
    ($($ty:ident => $name:literal),*) => {$(
        #[derive(Clone)]
        struct $ty(Service);
        impl tonic::server::NamedService for $ty {
            const NAME: &'static str = $name;
        }
        impl<B> tower::Service<http::Request<B>> for $ty
        where
            B: http_body::Body + Send + 'static,
            B::Data: Send,
            B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
        {
            type Response = http::Response<tonic::body::Body>;
            type Error = std::convert::Infallible;
            type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;
            fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                <Service as tower::Service<http::Request<B>>>::poll_ready(&mut self.0, cx)
            }
            fn call(&mut self, req: http::Request<B>) -> Self::Future {
                self.0.call(req)
            }
        }
    )*};
}

named!(DraV1 => "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", DraV1beta1 => "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin", Registration => "pluginregistration.Registration");

/// Listen on `path` (root-only directory made, a stale socket replaced, the socket 0600).
fn listen(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new().recursive(true).mode(0o750).create(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{}: exists and is not a socket: left alone", path.display()),
            ));
        }
        Err(_) => {}
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serve `service` on `path` until `stop` resolves; the socket is removed after.
async fn serve_on(
    path: PathBuf,
    listener: tokio::net::UnixListener,
    service: Service,
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let incoming = futures::stream::unfold(listener, |l| async move {
        let next = l.accept().await.map(|(s, _)| LocalAuthority::new(s));
        Some((next, l))
    });
    let served = tonic::transport::Server::builder()
        .add_service(DraV1(service.clone()))
        .add_service(DraV1beta1(service.clone()))
        .add_service(Registration(service))
        .serve_with_incoming_shutdown(incoming, stop)
        .await
        .map_err(std::io::Error::other);
    let _ = std::fs::remove_file(&path);
    served
}

/// Serve the DRA service, then the registration (the kubelet dials the endpoint as soon as it
/// sees the registration socket), until `stop` resolves. The sockets are removed at the end, so
/// the kubelet deregisters the plugin.
pub async fn serve(
    name: String,
    sockets: Sockets,
    driver: Arc<dyn Driver>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let service = Service::new(driver, &name, &sockets);
    let (tx, rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // Both bound before either is served: the DRA socket listens by the time the kubelet, told by
    // the registration socket, dials it.
    let (dra_path, registration_path) = (sockets.dra(), sockets.registration(&name));
    let (dra_listener, registration_listener) = (listen(&dra_path)?, listen(&registration_path)?);
    let dra = tokio::spawn(serve_on(dra_path, dra_listener, service.clone(), stopped(rx.clone())));
    let registration = tokio::spawn(serve_on(registration_path, registration_listener, service, stopped(rx)));
    stop.await;
    let _ = tx.send(true);
    let (a, b) = (dra.await.map_err(std::io::Error::other)?, registration.await.map_err(std::io::Error::other)?);
    a.and(b)
}

#[cfg(test)]
mod tests;
