//! plexus-daemon's OpenTelemetry spans, off unless `--otlp-endpoint` names a collector (the
//! admin's flag: where root connects; no request, NAD or pod can name one).
//!
//! One server span for each request, `CNI <verb>`: the child of the runtime's trace context when
//! the request carries one (`TRACEPARENT`, `TRACESTATE`: the shim forwards them), else the root of
//! a trace of its own. The request then runs with *its* context in place of the runtime's, so
//! every delegate it runs — in-process or exec'd — is handed the request span as its parent, and
//! the meta-plugin's delegate calls become client spans `delegate <verb>` under it (network,
//! delegate type, CNI error code). The runtime's sampling decision holds: a trace it did not
//! sample is not recorded here either.
//!
//! Spans go to the collector over OTLP/gRPC from the SDK's batch processor: its own thread, a
//! bounded queue (spans past it are dropped, never waited for), so a slow or absent collector
//! costs a request nothing but the span.

use std::collections::BTreeMap;
use std::time::SystemTime;

use anyhow::Context as _;
use opentelemetry::KeyValue;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use plexus::wire;

/// The most bytes of a value (a container ID, a pod's name, an error message) a span carries.
const VALUE_MAX: usize = 256;

pub struct Spans {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

impl Spans {
    /// Spans for the collector at `endpoint` (`http://host:4317`), the resource naming this node.
    /// Called on the daemon's runtime: the gRPC channel does its I/O there.
    pub fn start(endpoint: &str, node: Option<&str>) -> anyhow::Result<Spans> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .with_context(|| format!("--otlp-endpoint {endpoint}"))?;
        let mut resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name("plexus-daemon")
            .with_attribute(KeyValue::new("service.version", plexus::ABOUT.version));
        if let Some(node) = node {
            resource = resource.with_attribute(KeyValue::new("k8s.node.name", node.to_string()));
        }
        let provider =
            SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build();
        let tracer = provider.tracer("plexus-daemon");
        Ok(Spans { provider, tracer, propagator: TraceContextPropagator::new() })
    }

    /// The span of a request, started now; `env` (the request's) gets its trace context in place
    /// of the runtime's.
    pub fn request(&self, env: &mut BTreeMap<String, String>) -> RequestSpan {
        let parent = self.propagator.extract(&EnvRef(env));
        let var = |k: &str| env.get(k).map(|v| bounded(v)).unwrap_or_default();
        let command = var("CNI_COMMAND");
        let mut attributes = vec![
            KeyValue::new("cni.command", command.clone()),
            KeyValue::new("cni.container_id", var("CNI_CONTAINERID")),
            KeyValue::new("cni.ifname", var("CNI_IFNAME")),
        ];
        // CNI_ARGS as the entry point reads it (one that does not parse names no pod).
        let args = plexus_cni::CniArgs::parse(env.get("CNI_ARGS").map(String::as_str).unwrap_or(""));
        for (key, attribute) in [("K8S_POD_NAMESPACE", "k8s.namespace.name"), ("K8S_POD_NAME", "k8s.pod.name")] {
            if let Some(value) = args.as_ref().ok().and_then(|a| a.get(key)) {
                attributes.push(KeyValue::new(attribute, bounded(value)));
            }
        }
        let span = self
            .tracer
            .span_builder(format!("CNI {command}"))
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        let cx = parent.with_remote_span_context(span.span_context().clone());
        for key in ["TRACEPARENT", "TRACESTATE"] {
            env.remove(key);
        }
        self.propagator.inject_context(&cx, &mut EnvMut(env));
        RequestSpan(span)
    }

    /// Send the spans still queued (at most a few seconds), then stop.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown_with_timeout(std::time::Duration::from_secs(5)) {
            tracing::warn!("spans not all sent at shutdown: {e}");
        }
    }
}

/// A request's span, ended with its answer.
pub struct RequestSpan(opentelemetry_sdk::trace::Span);

impl RequestSpan {
    pub fn end(mut self, response: &wire::Response) {
        if response.exit != 0 {
            let error: serde_json::Value = serde_json::from_str(&response.stdout).unwrap_or_default();
            if let Some(code) = error.get("code").and_then(|c| c.as_i64()) {
                self.0.set_attribute(KeyValue::new("cni.error.code", code));
            }
            let msg = error.get("msg").and_then(|m| m.as_str()).unwrap_or("failed");
            self.0.set_status(Status::error(bounded(msg)));
        }
        self.0.end();
    }
}

impl plexus::Observer for Spans {
    /// A client span under the request's (the trace context the delegate was handed).
    fn delegate(&self, call: &plexus::DelegateCall<'_>) {
        let Some(traceparent) = call.traceparent else { return };
        let carrier = BTreeMap::from([("TRACEPARENT".to_string(), traceparent.to_string())]);
        let parent = self.propagator.extract(&EnvRef(&carrier));
        if !parent.span().span_context().is_valid() {
            return;
        }
        let mut attributes = vec![
            KeyValue::new("cni.command", call.command.to_string()),
            KeyValue::new("cni.network", bounded(call.network)),
            KeyValue::new("cni.delegate.type", bounded(call.delegate_type)),
        ];
        if let Some(e) = call.error {
            attributes.push(KeyValue::new("cni.error.code", i64::from(e.code)));
        }
        let mut span = self
            .tracer
            .span_builder(format!("delegate {}", call.command))
            .with_kind(SpanKind::Client)
            .with_start_time(call.started)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        if let Some(e) = call.error {
            span.set_status(Status::error(bounded(&e.msg)));
        }
        span.end_with_timestamp(call.started.checked_add(call.took).unwrap_or_else(SystemTime::now));
    }
}

/// The request's environment as a carrier of the W3C trace context (`TRACEPARENT`: the
/// propagator's `traceparent`): read, and written.
struct EnvRef<'a>(&'a BTreeMap<String, String>);
struct EnvMut<'a>(&'a mut BTreeMap<String, String>);

impl Extractor for EnvRef<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(&key.to_ascii_uppercase()).map(String::as_str)
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

impl Injector for EnvMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator's own output: a traceparent, and the parent's tracestate as it came.
        self.0.insert(key.to_ascii_uppercase(), value);
    }
}

/// At most [`VALUE_MAX`] bytes of `v`, cut at a character's boundary.
fn bounded(v: &str) -> String {
    let mut end = v.len().min(VALUE_MAX);
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    v[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_cut_at_a_character_boundary() {
        assert_eq!(bounded(&"é".repeat(200)).len(), 256);
        assert_eq!(bounded("short"), "short");
    }
}
