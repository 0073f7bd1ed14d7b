//! Tenant isolation, third round: what tenants share on one node and must not take from each
//! other — the node's own addresses, a directory of NAD files, the node's turn to move whole
//! devices, and what an error tells. Each test mounts one tenant's attack or mistake, through
//! `plexus` in namespaces (thin and through plexus-daemon where the path differs), and shows that
//! another tenant's request and the node are unaffected.

use std::path::Path;

use plexus_tests::DataDir;
use plexus_tests::daemon::write_gated_delegate;
use plexus_tests::tenant::Node;
use serde_json::{Value, json};

fn with_networks(meta: &Value, networks: &str) -> Value {
    let mut m = meta.clone();
    m["networks"] = json!(networks);
    m
}

// The node's turn to move whole devices.

/// A host-device NAD for `device` (L2 only), its state in `state`.
fn host_device_nad(n: &Node, name: &str, device: &str, state: &DataDir) {
    n.nad(name, &json!({"cniVersion": "1.0.0", "type": "plexus-host-device", "device": device, "dataDir": state}));
}

#[test]
fn a_pods_slow_delegate_beside_its_exclusive_port_does_not_hold_another_pods_device_move() {
    // A short deadline: a pod made to wait for the turn gives up on it after half of it (1.5 s)
    // and says so in its log.
    let n = Node::with_policy(json!({"limits": {"requestTimeoutSeconds": 3}}));
    let state = DataDir::new("hd");
    host_device_nad(&n, "port0", "nic0", &state);
    host_device_nad(&n, "port1", "nic1", &state);
    n.spy("spy");
    let gate = n.path("gate");
    std::fs::create_dir_all(&gate).unwrap();
    write_gated_delegate(&n.path("spies").join("slow"), &gate, &n.path("spies").join("spy"));
    n.nad("slow", &json!({"cniVersion": "1.0.0", "type": "slow"}));
    let (_daemon, daemon_meta) = n.daemon(&[], &[]);
    for (how, meta) in [("thin", n.meta("")), ("daemon", daemon_meta.clone())] {
        let _ = std::fs::remove_file(gate.join("open"));
        let mut first = with_networks(&meta, "port0,slow");
        let log = n.path(&format!("{how}-second.log"));
        first["logFile"] = json!(n.path(&format!("{how}-first.log")));
        let mut second = with_networks(&meta, "port1");
        second["logFile"] = json!(log);
        second["logLevel"] = json!("debug");
        let other = n.lab.another_pod();
        let as_other = |r: plexus_tests::PluginRun| {
            r.env("CNI_CONTAINERID", "pod2").env("CNI_NETNS", other.path().to_str().unwrap())
        };
        std::thread::scope(|s| {
            let pod1 = s.spawn(|| n.plexus("ADD", &first));
            // Its port's ADD is done (its result recorded) and its slow delegate waits at the gate.
            wait_for(&gate.join("entered-pod1"));
            let cache = n.path("cache/pod1");
            wait_until(|| std::fs::read_to_string(&cache).is_ok_and(|c| c.contains("\"attachment\":0")));
            let out = n.plexus_with("ADD", &second, as_other);
            assert!(out.success(), "{how}: {}", out.stdout);
            assert!(!gate.join("open").exists(), "{how}: the first pod's slow delegate still runs");
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(!text.contains("no turn in time"), "{how}: the second pod waited for the turn:\n{text}");
            std::fs::write(gate.join("open"), b"").unwrap();
            assert!(pod1.join().unwrap().success(), "{how}");
        });
        assert!(n.plexus_with("DEL", &second, as_other).success(), "{how}");
        assert!(n.plexus("DEL", &first).success(), "{how}");
        assert_eq!(n.pod_links(), ["lo"], "{how}");
        let _ = std::fs::remove_file(gate.join("entered-pod1"));
    }
}

fn wait_for(path: &Path) {
    wait_until(|| path.exists());
}

/// Wait (up to 30 s, failing then) until `done`.
fn wait_until(done: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < std::time::Duration::from_secs(30), "never happened");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
