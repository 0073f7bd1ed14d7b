//! The Grafana dashboard shipped in the chart (deploy/helm/plexus/files/) against a live
//! plexus-daemon's /metrics: every metric a query names is one the daemon exports, with the
//! suffix its type gives it, and every label a query groups by is one its series carry.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use plexus_tests::fake_api::FakeApi;
use plexus_tests::{DaemonProcess, DataDir, Lab, PluginRun, plugin_bin};
use serde_json::{Value, json};

fn dashboard() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/plexus/files/plexus-daemon-dashboard.json");
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// Every `expr` of every panel.
fn queries(d: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for panel in d["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            out.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    out
}

/// Words of `expr` that look like metric names of the daemon.
fn metric_names(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("plexus_daemon_"))
        .map(str::to_string)
        .collect()
}

/// The labels of every `by (...)` in `expr`.
fn grouped_by(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for part in expr.split("by (").skip(1) {
        let list = part.split(')').next().unwrap();
        out.extend(list.split(',').map(|l| l.trim().to_string()).filter(|l| !l.is_empty()));
    }
    out
}

/// From the exposition: family → type, and sample name → the labels its series carry.
fn exposition(text: &str) -> (BTreeMap<String, String>, BTreeMap<String, BTreeSet<String>>) {
    let mut types = BTreeMap::new();
    let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut w = rest.split_whitespace();
            types.insert(w.next().unwrap().to_string(), w.next().unwrap().to_string());
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = line.split(['{', ' ']).next().unwrap().to_string();
            let set = labels.entry(name).or_default();
            if let Some(inner) = line.split_once('{').and_then(|(_, r)| r.split_once('}')).map(|(l, _)| l) {
                set.extend(inner.split(',').filter_map(|kv| kv.split_once('=')).map(|(k, _)| k.to_string()));
            }
        }
    }
    (types, labels)
}

/// The family a sample name belongs to, given the types: `_bucket`/`_sum`/`_count` of a histogram,
/// `_total` of a counter, the name itself for a gauge.
fn family_of(name: &str, types: &BTreeMap<String, String>) -> Option<(String, String)> {
    for (suffix, kind) in
        [("_bucket", "histogram"), ("_sum", "histogram"), ("_count", "histogram"), ("_total", "counter")]
    {
        if let Some(base) = name.strip_suffix(suffix)
            && types.get(base).is_some_and(|t| t == kind)
        {
            return Some((base.to_string(), kind.to_string()));
        }
    }
    types.get(name).filter(|t| *t == "gauge").map(|t| (name.to_string(), t.clone()))
}

#[test]
fn every_dashboard_query_names_a_metric_and_labels_the_live_daemon_exports() {
    plexus_tests::require_root();
    let lab = Lab::new();
    lab.add_nic("nic0", 9000);
    let dir = tempfile::tempdir().unwrap();
    let ipam = DataDir::new("ipam");
    // The daemon with an API server (its watch caches, API requests, network-status writes).
    let api = FakeApi::start_in(&lab.node);
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig, true);
    let nad = json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
                     "ipam": {"type": "plexus-ipam", "range": "198.18.60.0/24", "dataDir": ipam.path()}});
    api.add_nad("default", "rail0", &nad, json!({}));
    api.add_pod("default", "trainer", "uid-trainer", json!({"k8s.v1.cni.cncf.io/networks": "rail0"}));
    api.add_pod("default", "broken", "uid-broken", json!({"k8s.v1.cni.cncf.io/networks": "missing"}));
    let socket = dir.path().join("daemon.sock");
    let args = ["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node-a"];
    let d = DaemonProcess::start(&lab.node.path(), &socket, &dir.path().join("daemon.log"), &args);
    let bin = plugin_bin("plexus").parent().unwrap().display().to_string();
    let conf = json!({"cniVersion": "1.1.0", "name": "plexus", "type": "plexus", "kubeconfig": kubeconfig,
                      "cniDir": dir.path().join("cache"), "binDir": bin, "daemonSocket": socket});
    let run = |verb: &str, pod: &str| {
        PluginRun::new(plugin_bin("plexus"), verb)
            .attachment(&format!("sandbox-{pod}"), &lab.pod.path(), "eth0", &bin)
            .env(
                "CNI_ARGS",
                &format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"),
            )
            .stdin(&conf)
            .in_netns(&lab.node)
            .run()
    };
    // A request of each verb, and one that fails (its NAD missing: an error by code).
    assert!(run("ADD", "trainer").success());
    assert!(run("DEL", "trainer").success());
    assert!(!run("ADD", "broken").success());
    assert!(run("DEL", "broken").success());
    let (types, labels) = exposition(&d.metrics());

    let d = dashboard();
    let exprs = queries(&d);
    assert!(exprs.len() >= 10, "{exprs:?}");
    let mut families = BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "a query of no plexus-daemon metric: {expr}");
        for name in names {
            let (family, kind) =
                family_of(&name, &types).unwrap_or_else(|| panic!("{name} (in {expr}) is not exported: {types:?}"));
            if expr.contains("histogram_quantile") {
                assert!(name.ends_with("_bucket") && kind == "histogram", "{expr}");
            }
            families.insert(family);
            // Labels grouped by: on the series the daemon wrote in this run (Prometheus adds
            // `instance` and `job`; `le` is every bucket's).
            if let Some(carried) = labels.get(&name).filter(|l| !l.is_empty()) {
                for l in grouped_by(expr) {
                    assert!(
                        carried.contains(&l) || ["instance", "job"].contains(&l.as_str()),
                        "{expr}: {name} has no label {l:?} ({carried:?})"
                    );
                }
            }
        }
    }
    // What the issue asks the dashboard to show, each from the daemon's own families.
    for needed in [
        "plexus_daemon_request_duration_seconds",
        "plexus_daemon_delegate_duration_seconds",
        "plexus_daemon_request_errors",
        "plexus_daemon_api_requests",
        "plexus_daemon_cached_objects",
        "plexus_daemon_network_status_pending",
    ] {
        assert!(families.contains(needed), "no panel shows {needed}");
    }
    // The errors panel's series exist in this run: it groups by labels they really carry.
    assert!(labels.contains_key("plexus_daemon_request_errors_total"), "{labels:?}");
    // The node variable's query too.
    let var = d["templating"]["list"][1]["definition"].as_str().unwrap();
    assert!(metric_names(var).iter().all(|m| family_of(m, &types).is_some()), "{var}");
}
