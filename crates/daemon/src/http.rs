//! `/healthz` (the daemon serves), `/readyz` (its caches are synced, it is not stopping and, with
//! `--dra`, the kubelet can use the DRA driver: registered, slices published) and `/metrics`
//! (Prometheus text), on the admin's local address.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};

use crate::cluster::Caches;
use crate::server::Daemon;

#[derive(Clone)]
pub struct Endpoints {
    pub daemon: Arc<Daemon>,
    pub caches: Option<Arc<Caches>>,
    /// The DRA driver's readiness, with `--dra`.
    pub dra: Option<Arc<plexus_dra::ready::Readiness>>,
}

impl Endpoints {
    fn answer(&self, path: &str) -> (StatusCode, String) {
        match path {
            "/healthz" => (StatusCode::OK, "ok\n".into()),
            "/readyz" => {
                let synced = self.caches.as_ref().is_none_or(|c| c.synced());
                if self.daemon.stopping.load(Ordering::SeqCst) {
                    (StatusCode::SERVICE_UNAVAILABLE, "stopping\n".into())
                } else if !synced {
                    (StatusCode::SERVICE_UNAVAILABLE, "watch caches not synced\n".into())
                } else if let Some(Err(why)) = self.dra.as_ref().map(|d| d.check()) {
                    (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n"))
                } else {
                    (StatusCode::OK, "ok\n".into())
                }
            }
            "/metrics" => {
                let sizes = self.caches.as_ref().map(|c| c.sizes().to_vec()).unwrap_or_default();
                let pending = self.caches.as_ref().map_or(0, |c| c.status.pending());
                (StatusCode::OK, self.daemon.metrics.render(&sizes, pending))
            }
            _ => (StatusCode::NOT_FOUND, "not found\n".into()),
        }
    }
}

pub async fn serve(address: SocketAddr, endpoints: Endpoints) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(%address, "health and metrics");
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { continue };
            let e = endpoints.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (status, body) = e.answer(req.uri().path());
                    let mut resp = Response::new(Full::new(Bytes::from(body)));
                    *resp.status_mut() = status;
                    if req.uri().path() == "/metrics" {
                        resp.headers_mut().insert(
                            hyper::header::CONTENT_TYPE,
                            hyper::header::HeaderValue::from_static(
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            ),
                        );
                    }
                    async move { Ok::<_, Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    Ok(())
}
