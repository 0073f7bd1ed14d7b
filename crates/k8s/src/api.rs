//! The Kubernetes API: the pod (its network selection and UID), NetworkAttachmentDefinitions, and
//! the network-status PATCH. Credentials are read on every invocation (kubeconfig with token,
//! tokenFile, client certificate and CA; or the in-cluster service account), so rotated tokens
//! just work. Every call has a deadline; a slow or failing API server yields `Unavailable` (CNI
//! code 11) instead of a hang, after at most a few quick retries of server errors.
//!
//! A token the API server stops taking (401) while its token file is about to be replaced is
//! waited for: a pod-bound service-account token is void the moment its pod is deleted, and when
//! plexus's DaemonSet rolls, the node's token file holds the deleted pod's token until the new
//! pod's installer writes its own, a few seconds later. A client made from a kubeconfig file
//! ([`ApiClient::connect`]) watches the token file for up to [`TOKEN_RENEWAL_WAIT`], is made
//! again from the new one and tries once more; nothing else waits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::error::K8sError;
use crate::nad::{Nad, NadSource};
use crate::names::{self, ApiPath};
use crate::status::{NetworkStatus, PodRef, annotation_patch};

/// Attempts of one call when the server answers 5xx or the connection fails.
const ATTEMPTS: usize = 3;

/// The longest a call answered 401 waits for its token file to be replaced (a DaemonSet pod's
/// replacement writing its token; see the module's doc).
pub const TOKEN_RENEWAL_WAIT: Duration = Duration::from_secs(20);

/// How often the token file is looked at meanwhile.
const TOKEN_POLL: Duration = Duration::from_millis(200);

/// The whole object in JSON.
pub const ACCEPT_OBJECT: &str = "application/json";
/// Only the object's metadata (`PartialObjectMetadata`): the server encodes and sends a fraction
/// of a large object; JSON itself where a server cannot.
pub const ACCEPT_METADATA: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json";
/// A list answered with its objects' metadata only (`PartialObjectMetadataList`).
pub const ACCEPT_METADATA_LIST: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json";

/// The pod as the meta-plugin needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    pub annotations: BTreeMap<String, String>,
}

pub struct ApiClient {
    rt: Driver,
    client: Mutex<kube::Client>,
    timeout: Duration,
    renewal: Option<Renewal>,
}

/// What a client made from a kubeconfig file needs to be made again with a replaced token.
struct Renewal {
    /// The kubeconfig (`None`: the in-cluster service account).
    kubeconfig: Option<PathBuf>,
    token_file: PathBuf,
    /// The token file's contents the client was made with.
    token: Mutex<Vec<u8>>,
}

/// What runs the client's calls: a runtime of its own (a plugin process), or a long-running
/// process's (the daemon, whose request threads are outside it).
enum Driver {
    Own(tokio::runtime::Runtime),
    Shared(tokio::runtime::Handle),
}

impl Driver {
    fn block_on<F: Future>(&self, f: F) -> F::Output {
        match self {
            Driver::Own(rt) => rt.block_on(f),
            Driver::Shared(handle) => handle.block_on(f),
        }
    }
}

/// The client configuration from `kubeconfig`, else the in-cluster service account when
/// `KUBERNETES_SERVICE_HOST` is set; `None` when neither is there. Every call gets `timeout`.
pub async fn kube_config(kubeconfig: Option<&Path>, timeout: Duration) -> Result<Option<kube::Config>, K8sError> {
    let kubeconfig = kubeconfig.filter(|p| !p.as_os_str().is_empty());
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| K8sError::Config(format!("kubeconfig {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| K8sError::Config(format!("kubeconfig {}: {e}", path.display())))?
        }
        None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
            kube::Config::incluster().map_err(|e| K8sError::Config(format!("in-cluster Kubernetes config: {e}")))?
        }
        None => return Ok(None),
    };
    with_timeouts(&mut config, timeout);
    Ok(Some(config))
}

fn with_timeouts(config: &mut kube::Config, timeout: Duration) {
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
}

/// A runtime for one process's calls.
fn own_runtime() -> Result<tokio::runtime::Runtime, K8sError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| K8sError::Io(format!("start runtime: {e}")))
}

fn pods() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Pod"))
}

fn nads() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"),
        "network-attachment-definitions",
    )
}

/// Why a call failed: gone (404), a conflict (409, or 422 from a JSON Patch `test`), retryable,
/// refused (the request itself), or final.
enum Failure {
    NotFound,
    Conflict(String),
    Retry(String),
    Refused(String),
    /// 401: the token is not (or no longer) taken.
    Unauthorized(String),
    Final(String),
}

/// How one call ended, short of an error.
enum Outcome<T> {
    Done(T),
    NotFound,
    Conflict(String),
}

/// The answer to [`ApiClient::send`].
#[derive(Debug)]
pub enum Reply {
    Ok(serde_json::Value),
    NotFound,
    /// 409 (already exists, conflict) or 422 (invalid: a JSON Patch `test` failed).
    Conflict(String),
}

fn classify(e: kube::Error) -> Failure {
    match e {
        kube::Error::Api(s) if s.code == 404 => Failure::NotFound,
        kube::Error::Api(s) if s.code == 409 || s.code == 422 => Failure::Conflict(format!("{} {}", s.code, s.message)),
        kube::Error::Api(s) if s.code >= 500 || s.code == 429 => Failure::Retry(format!("{} {}", s.code, s.message)),
        // Credentials, RBAC and timeouts can be mended without changing the request.
        kube::Error::Api(s) if s.code == 401 => Failure::Unauthorized(format!("{} {}", s.code, s.message)),
        kube::Error::Api(s) if matches!(s.code, 403 | 408) => Failure::Final(format!("{} {}", s.code, s.message)),
        kube::Error::Api(s) => Failure::Refused(format!("{} {}", s.code, s.message)),
        kube::Error::HyperError(e) => Failure::Retry(e.to_string()),
        // The connection failed under the request (closed, refused): worth another attempt.
        kube::Error::Service(e) => Failure::Retry(e.to_string()),
        other => Failure::Final(other.to_string()),
    }
}

impl ApiClient {
    /// A client from `kubeconfig`, else the in-cluster service account when
    /// `KUBERNETES_SERVICE_HOST` is set; `None` when neither is there (standalone use).
    pub fn connect(kubeconfig: Option<&Path>, timeout: Duration) -> Result<Option<ApiClient>, K8sError> {
        let kubeconfig = kubeconfig.filter(|p| !p.as_os_str().is_empty());
        if kubeconfig.is_none() && std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
            return Ok(None); // standalone: no runtime, no client
        }
        let rt = own_runtime()?;
        let Some(config) = rt.block_on(kube_config(kubeconfig, timeout))? else { return Ok(None) };
        let renewal = config.auth_info.token_file.as_ref().map(|f| Renewal {
            kubeconfig: kubeconfig.map(Path::to_path_buf),
            token: Mutex::new(std::fs::read(f).unwrap_or_default()),
            token_file: PathBuf::from(f),
        });
        let mut client = ApiClient::on_own_runtime(rt, config, timeout)?;
        client.renewal = renewal;
        Ok(Some(client))
    }

    /// A client from a kubeconfig held in memory (YAML or JSON), never written anywhere: the
    /// installer's, made from its service account with the token inline.
    pub fn from_kubeconfig_text(text: &str, timeout: Duration) -> Result<ApiClient, K8sError> {
        let kc = Kubeconfig::from_yaml(text).map_err(|e| K8sError::Config(format!("kubeconfig: {e}")))?;
        let rt = own_runtime()?;
        let mut config = rt
            .block_on(kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()))
            .map_err(|e| K8sError::Config(format!("kubeconfig: {e}")))?;
        with_timeouts(&mut config, timeout);
        ApiClient::on_own_runtime(rt, config, timeout)
    }

    fn on_own_runtime(
        rt: tokio::runtime::Runtime,
        config: kube::Config,
        timeout: Duration,
    ) -> Result<ApiClient, K8sError> {
        let client = {
            let _guard = rt.enter();
            kube::Client::try_from(config).map_err(|e| K8sError::Config(format!("Kubernetes client: {e}")))?
        };
        Ok(ApiClient { rt: Driver::Own(rt), client: Mutex::new(client), timeout, renewal: None })
    }

    /// A client whose calls run on `handle`'s runtime (which `client` was made on), for threads
    /// outside it: the daemon's request threads.
    pub fn on_runtime(client: kube::Client, handle: tokio::runtime::Handle, timeout: Duration) -> ApiClient {
        ApiClient { rt: Driver::Shared(handle), client: Mutex::new(client), timeout, renewal: None }
    }

    /// The client to make a call with (made again when its token was replaced).
    fn client(&self) -> kube::Client {
        self.client.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// After a 401: wait up to [`TOKEN_RENEWAL_WAIT`] for the token file to hold another token,
    /// then make the client again from it. `false` when it was not replaced (or the client has
    /// no token file, or cannot be made again).
    async fn renew(&self) -> bool {
        let Some(r) = &self.renewal else { return false };
        let started = tokio::time::Instant::now();
        loop {
            let now = std::fs::read(&r.token_file).unwrap_or_default();
            let replaced = !now.is_empty() && now != *r.token.lock().unwrap_or_else(|p| p.into_inner());
            if replaced {
                let Ok(Some(config)) = kube_config(r.kubeconfig.as_deref(), self.timeout).await else { return false };
                let Ok(client) = kube::Client::try_from(config) else { return false };
                *self.client.lock().unwrap_or_else(|p| p.into_inner()) = client;
                *r.token.lock().unwrap_or_else(|p| p.into_inner()) = now;
                return true;
            }
            let left = TOKEN_RENEWAL_WAIT.saturating_sub(started.elapsed());
            if left.is_zero() {
                return false;
            }
            tokio::time::sleep(left.min(TOKEN_POLL)).await;
        }
    }

    /// Run `call` with the deadline, retrying server errors and failed connections a few
    /// times; 404 and conflicts come back as [`Reply`]-like outcomes, the rest as `Unavailable`.
    fn attempt<T, F, Fut>(&self, what: &str, call: F) -> Result<Outcome<T>, K8sError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        self.attempt_within(what, ATTEMPTS, self.timeout, true, call)
    }

    /// [`ApiClient::attempt`] with at most `tries` and `timeout` each; a 401 waits for a
    /// replaced token (once) only when `renew`.
    fn attempt_within<T, F, Fut>(
        &self,
        what: &str,
        tries: usize,
        timeout: Duration,
        renew: bool,
        call: F,
    ) -> Result<Outcome<T>, K8sError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        plexus_node::fault::at(plexus_node::fault::Point::Api)
            .map_err(|e| K8sError::Unavailable(format!("{what}: {e}")))?;
        self.rt.block_on(async {
            let mut last = String::new();
            let mut renew = renew && self.renewal.is_some();
            for attempt in 0..tries {
                match tokio::time::timeout(timeout, call()).await {
                    Err(_) => {
                        return Err(K8sError::Unavailable(format!("{what}: no answer within {timeout:?}")));
                    }
                    Ok(Ok(v)) => return Ok(Outcome::Done(v)),
                    Ok(Err(e)) => match classify(e) {
                        Failure::NotFound => return Ok(Outcome::NotFound),
                        Failure::Conflict(m) => return Ok(Outcome::Conflict(m)),
                        Failure::Final(m) => return Err(K8sError::Unavailable(format!("{what}: {m}"))),
                        Failure::Unauthorized(m) if renew => {
                            renew = false;
                            if self.renew().await {
                                continue;
                            }
                            let file = self.renewal.as_ref().map(|r| r.token_file.display().to_string());
                            let file = file.unwrap_or_default();
                            return Err(K8sError::Unavailable(format!(
                                "{what}: {m} (the token in {file} was not replaced within {TOKEN_RENEWAL_WAIT:?})"
                            )));
                        }
                        Failure::Unauthorized(m) => return Err(K8sError::Unavailable(format!("{what}: {m}"))),
                        Failure::Refused(m) => return Err(K8sError::Refused(format!("{what}: {m}"))),
                        Failure::Retry(m) => last = m,
                    },
                }
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
            Err(K8sError::Unavailable(format!("{what}: {last} (after {tries} attempts)")))
        })
    }

    /// [`ApiClient::attempt`] where a conflict is an error. `Ok(None)` is 404.
    fn call<T, F, Fut>(&self, what: &str, call: F) -> Result<Option<T>, K8sError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        match self.attempt(what, call)? {
            Outcome::Done(v) => Ok(Some(v)),
            Outcome::NotFound => Ok(None),
            Outcome::Conflict(m) => Err(K8sError::Refused(format!("{what}: {m}"))),
        }
    }

    /// One request to `path` (JSON in, JSON out) with the deadline and the retries of server
    /// errors; 404 and conflicts are answers, not errors.
    pub fn send(
        &self,
        what: &str,
        method: http::Method,
        path: &ApiPath,
        content_type: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Reply, K8sError> {
        self.send_accepting(what, method, path, content_type, ACCEPT_OBJECT, body)
    }

    /// [`ApiClient::send`] asking for the answer in `accept`: [`ACCEPT_METADATA`] has the
    /// server answer a write with the object's metadata only, for a caller that needs no more.
    pub fn send_accepting(
        &self,
        what: &str,
        method: http::Method,
        path: &ApiPath,
        content_type: &str,
        accept: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Reply, K8sError> {
        let bytes = body.map(|b| serde_json::to_vec(b).expect("json")).unwrap_or_default();
        let request = || {
            let req = http::Request::builder()
                .method(method.clone())
                .uri(path.as_str())
                .header(http::header::CONTENT_TYPE, content_type)
                .header(http::header::ACCEPT, accept)
                .body(bytes.clone())
                .expect("request");
            let client = self.client();
            async move { client.request::<serde_json::Value>(req).await }
        };
        Ok(match self.attempt(what, request)? {
            Outcome::Done(v) => Reply::Ok(v),
            Outcome::NotFound => Reply::NotFound,
            Outcome::Conflict(m) => Reply::Conflict(m),
        })
    }

    /// The pod's UID and annotations; `None` when the pod is gone.
    pub fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodInfo>, K8sError> {
        let (namespace, name) = (names::namespace(namespace)?, names::object("pod", name)?);
        let api = || Api::<DynamicObject>::namespaced_with(self.client(), namespace, &pods());
        let obj = self.call(&format!("get pod {namespace}/{name}"), || {
            let api = api();
            async move { api.get(name).await }
        })?;
        Ok(obj.map(|o| PodInfo {
            uid: o.metadata.uid.unwrap_or_default(),
            annotations: o.metadata.annotations.unwrap_or_default().into_iter().collect(),
        }))
    }

    /// Record `event`, one try of at most `within` (and the client's timeout): best effort, the
    /// caller logs what the API did not take.
    pub fn record_event(
        &self,
        event: &crate::events::PodEvent,
        instance: &str,
        within: Duration,
    ) -> Result<(), K8sError> {
        let ns = &event.pod.namespace;
        let body = serde_json::to_vec(&event.object(instance, k8s_openapi::jiff::Timestamp::now()))
            .map_err(|e| K8sError::Config(e.to_string()))?;
        let what = format!("create event {} on pod {ns}/{}", event.reason, event.pod.name);
        let path = ApiPath::collection("/apis/events.k8s.io/v1", ns, "events")?;
        let request = || {
            let req = http::Request::builder()
                .method(http::Method::POST)
                .uri(path.as_str())
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(http::header::ACCEPT, ACCEPT_OBJECT)
                .body(body.clone())
                .expect("request");
            let client = self.client();
            async move { client.request::<serde_json::Value>(req).await }
        };
        match self.attempt_within(&what, 1, within.min(self.timeout), false, request)? {
            Outcome::Done(_) => Ok(()),
            Outcome::NotFound => Err(K8sError::Refused(format!("{what}: not found"))),
            Outcome::Conflict(m) => Err(K8sError::Refused(format!("{what}: {m}"))),
        }
    }

    /// Set `k8s.v1.cni.cncf.io/network-status` with a JSON merge patch; a pod that is gone is
    /// not an error. With the pod's `uid` (when known) the patch names it: a later pod of the same
    /// name is not patched (the API refuses the patch, 422: `metadata.uid` is immutable).
    pub fn set_network_status(&self, pod: &PodRef, statuses: &[NetworkStatus]) -> Result<(), K8sError> {
        let (namespace, name) = (names::namespace(&pod.namespace)?, names::object("pod", &pod.name)?);
        let patch = Patch::Merge(annotation_patch(statuses, &pod.uid));
        let params = PatchParams::default();
        self.call(&format!("patch pod {namespace}/{name}"), || {
            let api = Api::<DynamicObject>::namespaced_with(self.client(), namespace, &pods());
            let (params, patch) = (&params, &patch);
            async move { api.patch(name, params, patch).await }
        })?;
        Ok(())
    }
}

impl NadSource for ApiClient {
    fn nad(&self, namespace: &str, name: &str) -> Result<Nad, K8sError> {
        let (namespace, name) = (names::namespace(namespace)?, names::object("network-attachment-definition", name)?);
        let obj = self
            .call(&format!("get network-attachment-definition {namespace}/{name}"), || {
                let api = Api::<DynamicObject>::namespaced_with(self.client(), namespace, &nads());
                async move { api.get(name).await }
            })?
            .ok_or_else(|| K8sError::NadNotFound { namespace: namespace.into(), name: name.into() })?;
        let value = serde_json::to_value(&obj).map_err(|e| K8sError::Config(e.to_string()))?;
        Nad::from_object(&value)
    }
}

/// The pod annotation that selects networks, if any.
pub fn selection_annotation(pod: &PodInfo) -> Option<String> {
    pod.annotations.get(crate::selection::NETWORKS_ANNOTATION).cloned()
}

/// The pod's `v1.multus-cni.io/default-network` annotation, if any.
pub fn default_network_annotation(pod: &PodInfo) -> Option<String> {
    pod.annotations.get(crate::selection::DEFAULT_NETWORK_ANNOTATION).cloned()
}
