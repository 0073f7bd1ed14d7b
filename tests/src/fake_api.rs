//! A fake Kubernetes API server for tests: HTTPS with a generated CA, bearer-token auth from a
//! generated kubeconfig, the real REST paths for pods and network-attachment-definitions, JSON
//! merge PATCH of pods (recorded), and 404/409/500/slow answers on demand. It listens on the
//! loopback of a namespace the test made (the node namespace, where the plugins run).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};

use crate::netns::Netns;

/// A scripted misbehaviour: requests whose method and path match answer `status` (or wait
/// `delay` first), `times` times (`usize::MAX`: always).
#[derive(Clone, Debug)]
pub struct Fault {
    pub method: &'static str,
    pub path_contains: String,
    pub status: Option<u16>,
    pub delay: Option<Duration>,
    pub times: usize,
}

#[derive(Default)]
struct State {
    token: String,
    pods: BTreeMap<(String, String), Value>,
    nads: BTreeMap<(String, String), Value>,
    daemonsets: BTreeMap<(String, String), Value>,
    patches: Vec<(String, Value)>,
    /// Events created (events.k8s.io/v1), as sent.
    events: Vec<Value>,
    requests: Vec<String>,
    faults: Vec<Fault>,
}

pub struct FakeApi {
    state: Arc<Mutex<State>>,
    port: u16,
    token: String,
    dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn respond(code: u16, body: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())))
        .unwrap()
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

impl FakeApi {
    /// Start the server on the loopback of `netns`.
    pub fn start_in(netns: &Netns) -> FakeApi {
        FakeApi::start_at(&netns.path())
    }

    /// Start the server on the loopback of the namespace at `netns_path`.
    pub fn start_at(netns_path: &Path) -> FakeApi {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        // A CA and a server certificate for 127.0.0.1.
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "plexus-test-ca");
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
        let srv_key = rcgen::KeyPair::generate().unwrap();
        let srv_params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let srv_cert = srv_params.signed_by(&srv_key, &ca).unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca.pem()).unwrap();

        let listener = crate::netns::loopback_listener(netns_path);
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let token = format!("plexus-test-token-{}", std::process::id());
        let state = Arc::new(Mutex::new(State { token: token.clone(), ..Default::default() }));
        let tls = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![srv_cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(srv_key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    tokio::select! {
                        _ = &mut stop_rx => break,
                        accepted = listener.accept() => {
                            let Ok((tcp, _)) = accepted else { continue };
                            let (acceptor, st) = (acceptor.clone(), st.clone());
                            tokio::spawn(async move {
                                let Ok(tls) = acceptor.accept(tcp).await else { return };
                                let svc = hyper::service::service_fn(move |req| handle(req, st.clone()));
                                let _ = hyper::server::conn::http1::Builder::new()
                                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                                    .await;
                            });
                        }
                    }
                }
            });
        });
        let api = FakeApi { state, port, token, dir, stop: Some(stop_tx), thread: Some(thread) };
        api.write_kubeconfig(&api.kubeconfig(), false);
        api
    }

    pub fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Rotate the accepted token (and the token file of a `token_file` kubeconfig).
    pub fn rotate_token(&mut self, new: &str) {
        self.revoke_token(new);
        let tf = self.token_file();
        if tf.exists() {
            std::fs::write(tf, new).unwrap();
        }
    }

    /// The server takes only `new` from now on; [`FakeApi::token_file`] keeps the old one until
    /// the test replaces it (a pod-bound token, void once its pod is deleted, before the next
    /// pod's installer writes its own).
    pub fn revoke_token(&mut self, new: &str) {
        self.token = new.to_string();
        self.state.lock().unwrap().token = new.to_string();
    }

    /// The token file of a `token_file` kubeconfig.
    pub fn token_file(&self) -> PathBuf {
        self.dir.path().join("token")
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A kubeconfig with the CA inline and the bearer token.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// Write a kubeconfig at `path`; with `token_file`, the token is read from a file (rotation).
    pub fn write_kubeconfig(&self, path: &Path, token_file: bool) {
        let ca = base64::engine::general_purpose::STANDARD.encode(std::fs::read(self.ca_file()).unwrap());
        let user = if token_file {
            let tf = self.token_file();
            std::fs::write(&tf, &self.token).unwrap();
            format!("tokenFile: {}", tf.display())
        } else {
            format!("token: {}", self.token)
        };
        let kc = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: plexus\n  user:\n    {user}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: plexus\n    namespace: default\ncurrent-context: fake\n",
            self.server()
        );
        std::fs::write(path, kc).unwrap();
    }

    pub fn add_pod(&self, namespace: &str, name: &str, uid: &str, annotations: Value) {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1", "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        self.state.lock().unwrap().pods.insert((namespace.into(), name.into()), pod);
    }

    pub fn remove_pod(&self, namespace: &str, name: &str) {
        self.state.lock().unwrap().pods.remove(&(namespace.into(), name.into()));
    }

    /// A NAD with `config` as its `spec.config` (JSON text) and optional annotations.
    pub fn add_nad(&self, namespace: &str, name: &str, config: &Value, annotations: Value) {
        let nad = json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {"config": config.to_string()}});
        self.state.lock().unwrap().nads.insert((namespace.into(), name.into()), nad);
    }

    /// A DaemonSet (only its metadata matters: `plexusctl install` asks whether it is there, and
    /// whether it is being deleted).
    pub fn set_daemonset(&self, namespace: &str, name: &str, deleting: bool) {
        let mut meta = json!({"name": name, "namespace": namespace, "uid": "ds-uid"});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-12-05T00:00:00Z");
        }
        let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta, "spec": {}});
        self.state.lock().unwrap().daemonsets.insert((namespace.into(), name.into()), ds);
    }

    pub fn remove_daemonset(&self, namespace: &str, name: &str) {
        self.state.lock().unwrap().daemonsets.remove(&(namespace.into(), name.into()));
    }

    /// The server's CA, PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.ca_file()).unwrap()
    }

    /// The token the server accepts now.
    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.state.lock().unwrap().pods.get(&(namespace.into(), name.into())).cloned()
    }

    /// PATCH bodies received, with their paths.
    pub fn patches(&self) -> Vec<(String, Value)> {
        self.state.lock().unwrap().patches.clone()
    }

    /// The events created, as sent.
    pub fn events(&self) -> Vec<Value> {
        self.state.lock().unwrap().events.clone()
    }

    /// `METHOD path` of every request received.
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }

    pub fn fault(&self, f: Fault) {
        self.state.lock().unwrap().faults.push(f);
    }

    /// Answer every network-status PATCH of pod `pod` (any namespace) with 503 (overloaded,
    /// restarting) until the faults are cleared.
    pub fn refuse_status_patches(&self, pod: &str) {
        self.fault(Fault {
            method: "PATCH",
            path_contains: format!("/pods/{pod}"),
            status: Some(503),
            delay: None,
            times: usize::MAX,
        });
    }

    pub fn clear_faults(&self) {
        self.state.lock().unwrap().faults.clear();
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn list<'a>(kind: &str, api_version: &str, items: impl Iterator<Item = &'a Value>) -> Value {
    json!({"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": "1"},
           "items": items.cloned().collect::<Vec<_>>()})
}

async fn handle(req: Request<Incoming>, state: Arc<Mutex<State>>) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let watch = req.uri().query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let auth = req.headers().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let fault = {
        let mut s = state.lock().unwrap();
        s.requests.push(format!("{method} {path}"));
        let hit = s.faults.iter_mut().find(|f| f.method == method && path.contains(&f.path_contains) && f.times > 0);
        hit.map(|f| {
            if f.times != usize::MAX {
                f.times -= 1;
            }
            f.clone()
        })
    };
    if let Some(f) = &fault {
        if let Some(d) = f.delay {
            tokio::time::sleep(d).await;
        }
        if let Some(code) = f.status {
            let reason = match code {
                404 => "NotFound",
                409 => "Conflict",
                _ => "InternalError",
            };
            return Ok(respond(code, &status_body(code, reason, &format!("scripted {code}"))));
        }
    }
    let token = state.lock().unwrap().token.clone();
    if auth != format!("Bearer {token}") {
        return Ok(respond(401, &status_body(401, "Unauthorized", "Unauthorized")));
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let listing = matches!(
        (method.as_str(), parts.as_slice()),
        ("GET", ["api", "v1", "pods"]) | ("GET", ["apis", "k8s.cni.cncf.io", "v1", "network-attachment-definitions"])
    );
    if listing && watch {
        // A watch (plexus-daemon's reflectors): nothing ever changes here, so it stays open,
        // quiet, until the server goes.
        tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
        return Ok(respond(200, &json!({})));
    }
    let mut s = state.lock().unwrap();
    let reply = match (method.as_str(), parts.as_slice()) {
        ("GET", ["apis", "apps", "v1", "namespaces", ns, "daemonsets", name]) => {
            match s.daemonsets.get(&(ns.to_string(), name.to_string())) {
                Some(ds) => respond(200, ds),
                None => respond(404, &status_body(404, "NotFound", &format!("daemonsets.apps \"{name}\" not found"))),
            }
        }
        ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => match s.pods.get(&(ns.to_string(), name.to_string()))
        {
            Some(p) => respond(200, p),
            None => respond(404, &status_body(404, "NotFound", &format!("pods \"{name}\" not found"))),
        },
        ("PATCH", ["api", "v1", "namespaces", ns, "pods", name]) => {
            let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            s.patches.push((path.clone(), patch.clone()));
            match s.pods.get_mut(&(ns.to_string(), name.to_string())) {
                // As kube-apiserver: a patch naming another UID (an earlier pod of the name) is
                // refused, metadata.uid being immutable.
                Some(p) if patch["metadata"]["uid"].as_str().is_some_and(|u| p["metadata"]["uid"] != u) => {
                    let message = format!(
                        "Pod \"{name}\" is invalid: metadata.uid: Invalid value: {}: field is immutable",
                        patch["metadata"]["uid"]
                    );
                    respond(422, &status_body(422, "Invalid", &message))
                }
                Some(p) => {
                    merge(p, &patch);
                    respond(200, p)
                }
                None => respond(404, &status_body(404, "NotFound", &format!("pods \"{name}\" not found"))),
            }
        }
        // A whole pod written back (client-go's UpdateStatus, how Multus writes network-status):
        // its annotations are taken.
        ("PUT", ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
            let sent: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let patch = json!({"metadata": {"annotations": sent["metadata"]["annotations"].clone()}});
            s.patches.push((path.clone(), patch.clone()));
            match s.pods.get_mut(&(ns.to_string(), name.to_string())) {
                Some(p) => {
                    merge(p, &patch);
                    respond(200, p)
                }
                None => respond(404, &status_body(404, "NotFound", &format!("pods \"{name}\" not found"))),
            }
        }
        ("POST", ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"]) => {
            let sent: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            // As kube-apiserver: the prefix, a trailing dash masked, is an RFC 1123 subdomain.
            let prefix = sent["metadata"]["generateName"].as_str().unwrap_or_default();
            let generated = match prefix.strip_suffix('-') {
                Some(p) => format!("{p}a"),
                None => prefix.to_string(),
            };
            let subdomain = generated.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
            if sent["metadata"]["namespace"] != *ns || sent["regarding"]["namespace"] != *ns {
                respond(422, &status_body(422, "Invalid", "event namespace does not match"))
            } else if !subdomain {
                respond(
                    422,
                    &status_body(422, "Invalid", &format!("metadata.generateName: Invalid value: {generated:?}")),
                )
            } else {
                s.events.push(sent.clone());
                respond(201, &sent)
            }
        }
        // Lists of every namespace (the daemon's reflectors; a field selector is not applied).
        ("GET", ["api", "v1", "pods"]) => respond(200, &list("PodList", "v1", s.pods.values())),
        ("GET", ["apis", "k8s.cni.cncf.io", "v1", "network-attachment-definitions"]) => {
            respond(200, &list("NetworkAttachmentDefinitionList", "k8s.cni.cncf.io/v1", s.nads.values()))
        }
        ("GET", ["apis", "k8s.cni.cncf.io", "v1", "namespaces", ns, "network-attachment-definitions", name]) => {
            match s.nads.get(&(ns.to_string(), name.to_string())) {
                Some(n) => respond(200, n),
                None => respond(
                    404,
                    &status_body(
                        404,
                        "NotFound",
                        &format!("network-attachment-definitions.k8s.cni.cncf.io \"{name}\" not found"),
                    ),
                ),
            }
        }
        _ => respond(404, &status_body(404, "NotFound", "the server could not find the requested resource")),
    };
    Ok(reply)
}
