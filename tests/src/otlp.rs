//! An OpenTelemetry collector for tests: the OTLP/gRPC trace service, generated from the
//! protocol's own definitions (opentelemetry-proto) and served by tonic on the loopback of a test's
//! node namespace, keeping every span it is sent. What it receives is what a real collector would.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
pub use opentelemetry_proto::tonic::trace::v1::Span;

use crate::Netns;

pub struct Collector {
    /// `http://127.0.0.1:PORT`, in the namespace it was started in.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<Span>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Receiver(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request.into_inner().resource_spans.into_iter().flat_map(|r| r.scope_spans).flat_map(|s| s.spans);
        self.0.lock().unwrap().extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl Collector {
    /// Listen on the loopback of `netns`.
    pub fn start_in(netns: &Netns) -> Collector {
        let listener = crate::netns::loopback_listener(&netns.path());
        listener.set_nonblocking(true).unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let receiver = Receiver(spans.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let incoming =
                    tonic::transport::server::TcpIncoming::from(tokio::net::TcpListener::from_std(listener).unwrap());
                let _ = tonic::transport::Server::builder()
                    .add_service(TraceServiceServer::new(receiver))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        Collector { endpoint, spans, stop: Some(stop), thread: Some(thread) }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans once `done` says they are all there; panics after `within`.
    pub fn wait_for(&self, within: Duration, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let started = Instant::now();
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(started.elapsed() < within, "spans received within {within:?}: {spans:#?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A string attribute of `span`.
pub fn attribute(span: &Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    })
}

/// Lowercase hex of an ID.
pub fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
