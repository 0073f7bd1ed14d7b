//! The daemon's Prometheus metrics: latency histograms of requests (by CNI verb) and of delegate
//! calls (by verb, network and delegate type), errors by CNI code, Kubernetes API requests,
//! requests refused for a full queue, the watch caches' sizes and the network-status writes
//! pending.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use plexus_cni::Command;

type Labels = Vec<(&'static str, String)>;

/// 0.5 ms to ~8 s: a macvlan ADD takes a few milliseconds, a host-device move up to ~150 ms, an
/// ADD waiting for the readiness file up to 45 s (the last bucket).
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 15))
}

pub struct Metrics {
    registry: Registry,
    requests: Family<Labels, Histogram, fn() -> Histogram>,
    errors: Family<Labels, Counter>,
    delegates: Family<Labels, Histogram, fn() -> Histogram>,
    api: Family<Labels, Counter>,
    refused: Counter,
    overrun: Counter,
    events_dropped: Counter,
    in_flight: Gauge<i64, std::sync::atomic::AtomicI64>,
    cached: Family<Labels, Gauge<u64, AtomicU64>>,
    watch_events: Family<Labels, Counter>,
    status_pending: Gauge<u64, AtomicU64>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("plexus_daemon");
        let requests =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(latency as fn() -> Histogram);
        let delegates =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(latency as fn() -> Histogram);
        let errors = Family::<Labels, Counter>::default();
        let api = Family::<Labels, Counter>::default();
        let refused = Counter::default();
        let overrun = Counter::default();
        let events_dropped = Counter::default();
        let in_flight = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
        let cached = Family::<Labels, Gauge<u64, AtomicU64>>::default();
        let watch_events = Family::<Labels, Counter>::default();
        registry.register("request_duration_seconds", "CNI requests served, by verb", requests.clone());
        registry.register("request_errors", "CNI requests that failed, by verb and CNI error code", errors.clone());
        registry.register(
            "delegate_duration_seconds",
            "Delegate calls, by verb, network and delegate type",
            delegates.clone(),
        );
        registry.register("api_requests", "Kubernetes API requests, by what they asked", api.clone());
        registry.register("requests_refused", "Requests not taken because the queue was full", refused.clone());
        registry.register(
            "requests_overrun",
            "Requests still running at their deadline: answered with code 11, their slot given back",
            overrun.clone(),
        );
        registry.register(
            "events_dropped",
            "Events about pods dropped because the queue of events to write was full",
            events_dropped.clone(),
        );
        registry.register("requests_in_flight", "Requests taken and not yet answered", in_flight.clone());
        registry.register("cached_objects", "Objects in the watch caches, by kind", cached.clone());
        registry.register(
            "watch_events",
            "Watch events applied to the caches, by kind and event (apply, delete, list)",
            watch_events.clone(),
        );
        let status_pending = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "network_status_pending",
            "Pods whose network-status is journaled and not yet written",
            status_pending.clone(),
        );
        Metrics {
            registry,
            requests,
            errors,
            delegates,
            api,
            refused,
            overrun,
            events_dropped,
            in_flight,
            cached,
            watch_events,
            status_pending,
        }
    }

    pub fn request(&self, command: &str, took: Duration, code: Option<u32>) {
        // Labels from a closed set: the CNI verbs, and codes the spec's range holds.
        let command = match Command::parse(command) {
            Ok(c) => c.to_string(),
            Err(_) => "(other)".to_string(),
        };
        self.requests.get_or_create(&vec![("command", command.clone())]).observe(took.as_secs_f64());
        if let Some(code) = code {
            let code = if code <= 999 { code.to_string() } else { "(other)".into() };
            self.errors.get_or_create(&vec![("command", command), ("code", code)]).inc();
        }
    }

    pub fn api_request(&self, what: &'static str) {
        self.api.get_or_create(&vec![("request", what.to_string())]).inc();
    }

    pub fn watch_event(&self, kind: &'static str, event: &'static str) {
        self.watch_events.get_or_create(&vec![("kind", kind.to_string()), ("event", event.to_string())]).inc();
    }

    pub fn refused(&self) {
        self.refused.inc();
    }

    pub fn overrun(&self) {
        self.overrun.inc();
    }

    pub fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    pub fn in_flight(&self, delta: i64) {
        self.in_flight.inc_by(delta);
    }

    /// The exposition, with the caches' sizes and the network-status writes pending as they are
    /// now.
    pub fn render(&self, cached: &[(&'static str, usize)], status_pending: usize) -> String {
        for (kind, n) in cached {
            self.cached.get_or_create(&vec![("kind", kind.to_string())]).set(*n as u64);
        }
        self.status_pending.set(status_pending as u64);
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}

/// The most networks the delegate histograms keep a series for; later ones are counted under
/// [`OTHER_NETWORKS`]. Network names are NADs' (tenants make as many as they like), and a
/// series, once made, lasts as long as the daemon.
pub const MAX_NETWORK_LABELS: usize = 512;

/// The network label of calls past [`MAX_NETWORK_LABELS`].
pub const OTHER_NETWORKS: &str = "(other)";

/// The observer the meta-plugin tells of every delegate call. Its labels are bounded: delegate
/// types only as installed plugins (the meta-plugin says `(not installed)` for the rest),
/// networks up to [`MAX_NETWORK_LABELS`].
pub struct DelegateMetrics {
    metrics: std::sync::Arc<Metrics>,
    networks: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl DelegateMetrics {
    pub fn new(metrics: std::sync::Arc<Metrics>) -> DelegateMetrics {
        DelegateMetrics { metrics, networks: Default::default() }
    }

    /// `network` as a label: itself while there is room (or it has one already), else
    /// [`OTHER_NETWORKS`].
    fn network_label(&self, network: &str) -> String {
        let mut known = self.networks.lock().unwrap_or_else(|p| p.into_inner());
        if known.contains(network) || (known.len() < MAX_NETWORK_LABELS && known.insert(network.to_string())) {
            return network.to_string();
        }
        OTHER_NETWORKS.to_string()
    }
}

impl plexus::Observer for DelegateMetrics {
    /// The call's latency (its errors are counted by code once, for the request).
    fn delegate(&self, call: &plexus::DelegateCall<'_>) {
        let labels = vec![
            ("command", call.command.to_string()),
            ("network", self.network_label(call.network)),
            ("type", call.delegate_type.to_string()),
        ];
        self.metrics.delegates.get_or_create(&labels).observe(call.took.as_secs_f64());
    }
}
