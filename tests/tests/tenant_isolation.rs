//! Tenant isolation, second round: a tenant who cannot take root must still not wedge, starve or
//! poison what other tenants and the node share — locks, daemon slots, ports, stores, pools,
//! memory, logs. Each test mounts one attack, through `plexus` and (for delegates) directly, and
//! shows the CNI error or the bound, and that another tenant and the node are unaffected. (The
//! `kubernetes` store's attacks on a real API server: `tests/tests/cluster.rs`.)

use std::path::Path;
use std::time::{Duration, Instant};

use plexus_tests::tenant::{Node, bin_dir, macvlan_conf};
use plexus_tests::{DataDir, PluginRun, plugin_bin};
use serde_json::{Value, json};

/// A short request deadline (3 s), so an attack that would hold on shows its bound quickly.
fn short_limits() -> Value {
    json!({"limits": {"requestTimeoutSeconds": 3}})
}

/// Processes still running for pod `netns` (`CNI_NETNS=<it>` in their environment): a delegate,
/// or anything a delegate left. A process killed a moment ago may still be on its way out
/// (SIGKILL is delivered, not waited for): looked for again for up to a second.
fn processes_of(netns: &Path) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let left = processes_now(netns);
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn processes_now(netns: &Path) -> Vec<String> {
    let needle = format!("CNI_NETNS={}\0", netns.display());
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("environ"))
                .map(|env| env.windows(needle.len()).any(|w| w == needle.as_bytes()))
                .unwrap_or(false)
        })
        .map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            format!("{} {}", e.file_name().to_string_lossy(), String::from_utf8_lossy(&cmd).replace('\0', " "))
        })
        .collect()
}

/// A delegate `name` in the node's spy directory running `body` (sh).
fn script(n: &Node, name: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = n.path("spies").join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

// 1. Every loop and wait a tenant drives ends, and gives way.

#[test]
fn a_kubernetes_store_range_with_nothing_below_offset_2_63_is_refused_at_once_before_any_api_call() {
    // The policy names an API that is never reached: the config is refused before any call.
    let n = Node::with_policy(json!({"kubernetes": {"kubeconfig": "/nonexistent/plexus-test/kubeconfig"}}));
    for (what, extra) in [
        ("range_start above 2^63", json!({"range_start": "2001:db8:1:0:8000::"})),
        ("exclude covering the lower half", json!({"exclude": ["2001:db8:1::/65"]})),
    ] {
        let mut ipam = json!({"type": "plexus-ipam", "range": "2001:db8:1::/64", "store": "kubernetes"});
        ipam.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let c = json!({"cniVersion": "1.0.0", "name": "rail0", "type": "plexus-macvlan", "master": "nic0",
                       "ipam": ipam});
        let started = Instant::now();
        let (code, msg, _) = n.direct("plexus-ipam", "ADD", &c).error();
        assert_eq!(code, 7, "{what}: {msg}");
        assert!(msg.starts_with("range 2001:db8:1::/64 (usable "), "{what}: {msg}");
        assert!(msg.contains("holds offsets below 2^63 only"), "{what}: {msg}");
        assert!(started.elapsed() < Duration::from_secs(2), "{what}: at once, took {:?}", started.elapsed());
        assert!(n.direct("plexus-ipam", "DEL", &c).success(), "{what}: nothing held, DEL succeeds");
        // Through plexus: the pod gets the error, the node nothing.
        n.nad("hostile", &c);
        let (code, msg, _) = n.plexus("ADD", &n.meta("hostile")).error();
        assert_eq!(code, 7, "{what}: {msg}");
        assert!(msg.contains("below 2^63"), "{msg}");
        assert_eq!(n.pod_links(), ["lo"]);
        assert!(n.plexus("DEL", &n.meta("hostile")).success());
    }
}

#[test]
fn a_store_lock_held_forever_holds_no_other_request_past_its_deadline() {
    let n = Node::with_policy(short_limits());
    let c = macvlan_conf(&n, json!({}));
    assert!(n.direct("plexus-ipam", "ADD", &c).success(), "the store and its domain exist");
    // A wedged holder of the domain's lock (a process stopped while it held it).
    let lock = std::fs::File::open(n.ipam.path().join("default/lock")).unwrap();
    lock.lock().unwrap();
    let other = |r: PluginRun| r.env("CNI_CONTAINERID", "c2");
    let started = Instant::now();
    let (code, msg, _) = n.direct_with("plexus-ipam", "ADD", &c, other).error();
    let took = started.elapsed();
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("is still held at this request's deadline"), "{msg}");
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(5), "ends at its deadline: {took:?}");
    // Through plexus (macvlan, its IPAM waiting): the request ends in time and leaves nothing.
    n.macvlan_nad("rail0", "nic0", "198.18.40.0/24", json!({}));
    let started = Instant::now();
    let (code, msg, _) = n.plexus("ADD", &n.meta("rail0")).error();
    assert_eq!(code, 11, "{msg}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(n.pod_links(), ["lo"]);
    // The holder goes: everyone is served again.
    drop(lock);
    assert!(n.direct_with("plexus-ipam", "ADD", &c, other).success());
    for cid in ["c1", "c2"] {
        assert!(n.direct_with("plexus-ipam", "DEL", &c, |r| r.env("CNI_CONTAINERID", cid)).success());
    }
    assert!(n.plexus("DEL", &n.meta("rail0")).success());
    assert!(!n.ipam.path().exists(), "the store went with its last attachment");
}

#[test]
fn a_delegate_that_hangs_spins_or_prints_nothing_is_killed_with_its_group_at_the_deadline() {
    let n = Node::with_policy(short_limits());
    script(&n, "stuck", "sleep 1000");
    script(&n, "spinning", "while :; do :; done");
    // Exits at once, but leaves a process behind holding its output open.
    script(
        &n,
        "leaves-a-child",
        "sleep 1000 &\n[ \"$CNI_COMMAND\" = ADD ] && echo '{\"cniVersion\":\"1.0.0\"}'\nexit 0",
    );
    for name in ["stuck", "spinning"] {
        n.nad(name, &json!({"cniVersion": "1.0.0", "type": name}));
        let started = Instant::now();
        let (code, msg, _) = n.plexus("ADD", &n.meta(name)).error();
        let took = started.elapsed();
        assert_eq!(code, 11, "{name}: {msg}");
        assert!(msg.contains(&format!("plugin \"{name}\" (ADD) did not finish: killed")), "{name}: {msg}");
        assert!(took < Duration::from_secs(5), "{name}: within the 3 s deadline and a moment: {took:?}");
        assert_eq!(processes_of(&n.lab.pod.path()), Vec::<String>::new(), "{name}: nothing of it outlives the request");
        // plexus-macvlan run directly (as Multus would) with it as its IPAM: the same bound.
        let c = macvlan_conf(&n, json!({"ipam": {"type": name}}));
        let started = Instant::now();
        let (code, msg, _) = n.direct("plexus-macvlan", "ADD", &c).error();
        assert_eq!(code, 11, "{name} as IPAM: {msg}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert_eq!((n.pod_links(), processes_of(&n.lab.pod.path())), (vec!["lo".to_string()], Vec::<String>::new()));
    }
    n.nad("leaves-a-child", &json!({"cniVersion": "1.0.0", "type": "leaves-a-child"}));
    let started = Instant::now();
    let out = n.plexus("ADD", &n.meta("leaves-a-child"));
    assert!(out.success(), "{}", out.stdout);
    assert!(started.elapsed() < Duration::from_secs(2), "its exit is seen: {:?}", started.elapsed());
    assert_eq!(processes_of(&n.lab.pod.path()), Vec::<String>::new(), "the child it left was killed with its group");
    assert!(n.plexus("DEL", &n.meta("leaves-a-child")).success());
    assert_eq!(processes_of(&n.lab.pod.path()), Vec::<String>::new());
}

fn with_networks(meta: &Value, networks: &str) -> Value {
    let mut m = meta.clone();
    m["networks"] = json!(networks);
    m
}

#[test]
fn through_plexus_daemon_a_stuck_delegate_gives_its_slot_back_at_the_deadline() {
    let n = Node::with_policy(short_limits());
    script(&n, "stuck", "sleep 1000");
    n.nad("stuck", &json!({"cniVersion": "1.0.0", "type": "stuck"}));
    n.macvlan_nad("rail0", "nic0", "198.18.40.0/24", json!({}));
    // One slot, no queue: a request that kept its slot would make the next one "busy".
    let (d, meta) = n.daemon(&["--max-concurrent", "1", "--max-queued", "0"], &[]);
    let started = Instant::now();
    let (code, msg, _) = n.plexus("ADD", &with_networks(&meta, "stuck")).error();
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("\"stuck\""), "{msg}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(processes_of(&n.lab.pod.path()), Vec::<String>::new());
    // The slot is free: the next request is the daemon's, not run thin beside it.
    let ok = n.plexus("ADD", &with_networks(&meta, "rail0"));
    assert!(ok.success(), "{}", ok.stdout);
    let shim = std::fs::read_to_string(n.path("shim.log")).unwrap_or_default();
    assert!(!shim.contains("thin mode"), "served by the daemon: {shim}");
    assert_eq!(d.sample("plexus_daemon_requests_overrun_total"), 0.0, "it ended by itself, at its deadline");
    assert!(n.plexus("DEL", &with_networks(&meta, "rail0")).success());
    // Its DEL hangs as well: it too ends at its deadline, and leaves no process.
    let started = Instant::now();
    let (code, msg, details) = n.plexus("DEL", &with_networks(&meta, "stuck")).error();
    // Its delegates' failures together, keeping their code: out of time (11), as one DEL's.
    assert_eq!(code, 11, "{msg}: {details}");
    assert!(msg.contains("DEL failed for 1 attachment(s)"), "{msg}");
    assert!(details.contains("code 11: plugin \"stuck\" (DEL) did not finish: killed"), "{details}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(processes_of(&n.lab.pod.path()), Vec::<String>::new());
    assert_eq!(n.pod_links(), ["lo"]);
}

#[test]
fn through_plexus_daemon_an_in_process_delegate_that_spins_is_answered_at_the_deadline_and_never_run_in_process_again()
{
    let n = Node::with_policy(short_limits());
    n.macvlan_nad("rail0", "nic0", "198.18.40.0/24", json!({}));
    n.macvlan_nad("rail1", "nic1", "198.18.41.0/24", json!({}));
    // Where the in-process plexus-macvlan runs: the first injection point after the meta-plugin
    // starts it (counted on a daemon of its own, with the points logged).
    let points = n.path("points");
    let first = {
        let (_d, meta) = n.daemon(&[], &[("PLEXUS_FAULT_LOG", &points)]);
        assert!(n.plexus("ADD", &with_networks(&meta, "rail0")).success());
        assert!(n.plexus("DEL", &with_networks(&meta, "rail0")).success());
        let text = std::fs::read_to_string(&points).unwrap();
        let exec = text.lines().position(|l| l.ends_with(" Exec")).expect("the meta-plugin started a delegate");
        exec + 2
    };
    let spin = format!("plexus-daemon:{first}:spin");
    let (d, meta) = n.daemon(&["--max-concurrent", "1", "--max-queued", "0"], &[("PLEXUS_FAULT", Path::new(&spin))]);
    let started = Instant::now();
    let (code, msg, _) = n.plexus("ADD", &with_networks(&meta, "rail0")).error();
    let took = started.elapsed();
    assert_eq!(code, 11, "{msg}");
    assert!(msg.starts_with("plexus-daemon: the ADD still runs: the request's deadline passed"), "{msg}");
    assert!(took >= Duration::from_secs(3) && took < Duration::from_secs(7), "deadline and a second: {took:?}");
    assert_eq!(d.sample("plexus_daemon_requests_overrun_total"), 1.0);
    assert!(d.log_text().contains("every delegate is exec'd from now on"), "{}", d.log_text());
    // Its slot is back, and the next request's delegates are processes (which a deadline kills).
    let pod2 = n.lab.another_pod();
    let second = |r: PluginRun| r.env("CNI_CONTAINERID", "pod2").env("CNI_NETNS", pod2.path().to_str().unwrap());
    let ok = n.plexus_with("ADD", &with_networks(&meta, "rail1"), second);
    assert!(ok.success(), "{}", ok.stdout);
    let log = std::fs::read_to_string(n.path("shim.log")).unwrap_or_default();
    assert!(log.contains("delegating plugin=\"plexus-macvlan\""), "exec'd, not in-process: {log}");
    assert!(!log.contains("thin mode"), "served by the daemon: {log}");
    assert!(n.plexus_with("DEL", &with_networks(&meta, "rail1"), second).success());
    assert_eq!(pod2.links().len(), 1, "only lo left in the second pod");
}

// 2. Nobody takes over a port or the node's uplink.

#[test]
fn passthru_and_the_default_route_interface_are_a_tenants_only_where_the_policy_names_them() {
    let n = Node::with_policy(json!({"allow": {"namespaces": {"team-a": {"macvlanModes": ["bridge", "passthru"]}}}}));
    let team_a = |r: PluginRun| r.env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=p");
    let node_before = n.lab.node.state();
    // passthru: refused node-wide (not named), directly and through plexus.
    let passthru = macvlan_conf(&n, json!({"mode": "passthru"}));
    let (code, msg, details) = n.direct("plexus-macvlan", "ADD", &passthru).error();
    assert_eq!((code, msg.as_str()), (7, "mode \"passthru\" is not allowed by the node policy"));
    assert!(details.contains("takes the parent over"), "{details}");
    n.macvlan_nad("takeover", "nic0", "198.18.40.0/24", json!({"mode": "passthru"}));
    let (code, msg, _) = n.plexus("ADD", &n.meta("takeover")).error();
    assert_eq!(code, 7);
    assert!(msg.ends_with("mode \"passthru\" is not allowed by the node policy"), "{msg}");
    assert_eq!((n.pod_links(), n.held()), (vec!["lo".to_string()], 0), "IPAM never ran");
    assert_eq!(n.lab.node.state(), node_before, "nic0 untouched");
    // Named for team-a: its pods may.
    let ok = n.direct_with("plexus-macvlan", "ADD", &passthru, team_a);
    assert!(ok.success(), "{}", ok.stdout);
    assert_eq!(n.lab.pod.link("net1").unwrap().macvlan_mode(), Some("passthru"));
    assert!(n.direct_with("plexus-macvlan", "DEL", &passthru, team_a).success());
    // No master: the node's default-route interface is nobody's implicit parent.
    n.lab.node.ip(&["addr", "add", "198.18.9.2/24", "dev", "nic1"]);
    n.lab.node.ip(&["route", "add", "default", "via", "198.18.9.1"]);
    let mut implicit = macvlan_conf(&n, json!({}));
    implicit.as_object_mut().unwrap().remove("master");
    let (code, msg, _) = n.direct("plexus-macvlan", "ADD", &implicit).error();
    assert_eq!(code, 7);
    assert_eq!(
        msg,
        "\"master\" is not set, and the node's default-route interface \"nic1\" is not a parent the node policy names"
    );
    let mut nad = implicit.clone();
    nad.as_object_mut().unwrap().remove("name");
    n.nad("uplink", &nad);
    let (code, msg, _) = n.plexus("ADD", &n.meta("uplink")).error();
    assert_eq!(code, 7);
    assert!(msg.contains("default-route interface \"nic1\""), "{msg}");
    assert_eq!(n.pod_links(), ["lo"]);
    // A broadcast queue beyond the policy's bound on the shared parent.
    let loud = macvlan_conf(&n, json!({"bcqueuelen": 100_000}));
    let (code, msg, _) = n.direct("plexus-macvlan", "ADD", &loud).error();
    assert_eq!((code, msg.as_str()), (7, "bcqueuelen 100000 is more than the node policy allows (10000)"));
    assert_eq!(n.pod_links(), ["lo"]);
    // The legitimate use beside it: bridge mode on an explicit master.
    let ok = n.direct("plexus-macvlan", "ADD", &macvlan_conf(&n, json!({"mode": "bridge", "bcqueuelen": 1000})));
    assert!(ok.success(), "{}", ok.stdout);
    assert!(n.direct("plexus-macvlan", "DEL", &macvlan_conf(&n, json!({}))).success());
}

// 3. No tenant config plants state in another store.

#[test]
fn a_data_dir_inside_another_stores_tree_is_refused_and_the_victims_allocation_stands() {
    let n = Node::new();
    // The victim: 198.18.7.10 held in its store, pod ns/victim's net1 indexed there.
    let victim = json!({"cniVersion": "1.0.0", "name": "rail0", "type": "plexus-macvlan", "master": "nic0",
        "ipam": {"type": "plexus-ipam", "range": "198.18.7.0/24", "dataDir": n.ipam}});
    let as_victim =
        |r: PluginRun| r.env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=victim;IP=198.18.7.10");
    assert!(n.direct_with("plexus-ipam", "ADD", &victim, as_victim).success());
    let store = n.ipam.path().to_path_buf();
    let root = store.parent().unwrap().to_path_buf();
    let planted = [
        store.join("default/ips/198.18.7.10"),
        store.join("default/lock"),
        store.join("default/pods/ns=victim=net1"),
        root.join(".plexus-ipam-kubernetes.lock"),
        root.join(".plexus-ipam-kubernetes.spool"),
    ];
    for path in &planted {
        let attack = json!({"cniVersion": "1.0.0", "name": "evil", "type": "plexus-macvlan", "master": "nic0",
            "ipam": {"type": "plexus-ipam", "range": "198.18.8.0/24", "dataDir": path}});
        let existed = path.exists();
        let (code, msg, details) =
            n.direct_with("plexus-ipam", "ADD", &attack, |r| r.env("CNI_CONTAINERID", "evil")).error();
        assert_eq!(code, 7, "{}: {msg}", path.display());
        assert!(msg.starts_with(&format!("dataDir {:?}", path.display().to_string())), "{msg}");
        assert!(format!("{msg} {details}").contains("direct child of a data root"), "{msg} {details}");
        assert_eq!(path.exists(), existed, "{}: nothing made there", path.display());
        // And through plexus, as a NAD.
        let mut nad = attack.clone();
        nad.as_object_mut().unwrap().remove("name");
        n.nad("evil", &nad);
        let (code, _, _) = n.plexus("ADD", &n.meta("evil")).error();
        assert_eq!(code, 7, "{}", path.display());
        assert_eq!(path.exists(), existed);
    }
    // The same, for plexus-host-device's state directory.
    let hd = json!({"cniVersion": "1.0.0", "name": "rail0", "type": "plexus-host-device", "device": "nic1",
                    "dataDir": store.join("default/ips/198.18.7.11")});
    let (code, msg, _) = n.direct("plexus-host-device", "ADD", &hd).error();
    assert_eq!(code, 7, "{msg}");
    assert!(n.lab.node.link("nic1").is_some(), "the device stays");
    // One store as two kinds: the victim's store is no state directory.
    let hd = json!({"cniVersion": "1.0.0", "name": "rail0", "type": "plexus-host-device", "device": "nic1", "dataDir": store});
    let (code, msg, _) = n.direct("plexus-host-device", "ADD", &hd).error();
    assert_eq!(code, 7);
    assert!(msg.ends_with("cannot be used: it is a plexus-ipam file store"), "{msg}");
    // The victim is unaffected: its address, its index, its next ADD (idempotent) and its DEL.
    let again = n.direct_with("plexus-ipam", "ADD", &victim, as_victim);
    assert_eq!(again.result()["ips"][0]["address"], "198.18.7.10/24");
    let fresh = n.direct_with("plexus-ipam", "ADD", &victim, |r| r.env("CNI_CONTAINERID", "c2"));
    assert_eq!(fresh.result()["ips"][0]["address"], "198.18.7.1/24", "others are handed out as before");
    for cid in ["c1", "c2"] {
        assert!(n.direct_with("plexus-ipam", "DEL", &victim, |r| r.env("CNI_CONTAINERID", cid)).success());
    }
    assert!(!store.exists(), "the victim's store went with its last attachment, nothing else left there");
}

#[test]
fn nothing_a_config_makes_outlives_its_attachments() {
    let n = Node::new();
    let rails: Vec<(DataDir, Value)> = (0..3)
        .map(|i| {
            let d = DataDir::new(&format!("t{i}"));
            let c = json!({"cniVersion": "1.0.0", "name": "rail0", "type": "plexus-macvlan", "master": "nic0",
                "ipam": {"type": "plexus-ipam", "range": format!("198.18.{}.0/24", 50 + i), "dataDir": d,
                         "network_name": format!("net-{i}")}});
            (d, c)
        })
        .collect();
    for (i, (d, c)) in rails.iter().enumerate() {
        assert!(n.direct("plexus-ipam", "ADD", c).success());
        assert!(d.path().join(format!("net-{i}/attachments")).exists(), "its domain");
    }
    // A failed ADD leaves no directory it made: one that fails after its store's directory and
    // domain were made (debug builds: the fault-injection point of its record's write), and one
    // whose requested address another attachment holds.
    let failing = DataDir::new("failing");
    let c = json!({"cniVersion": "1.0.0", "name": "rail0", "type": "x",
        "ipam": {"type": "plexus-ipam", "range": "198.18.60.0/24", "dataDir": failing, "network_name": "lonely"}});
    let mut failed = 0;
    for n_th in 1..=4 {
        let fault = format!("plexus-ipam:{n_th}");
        let out = n.direct_with("plexus-ipam", "ADD", &c, |r| r.env("PLEXUS_FAULT", &fault));
        if out.success() {
            // A point whose failure is harmless (the cursor is a hint): the ADD stands, its DEL
            // removes it all.
            assert!(n.direct("plexus-ipam", "DEL", &c).success());
        } else {
            failed += 1;
        }
        assert!(!failing.path().exists(), "point {n_th}: a failed ADD left {:?}", failing.entries());
    }
    assert!(failed >= 3, "the mark, the record and the address file failed their ADD");
    let (held, c2) = &rails[0];
    let want = |r: PluginRun| r.env("CNI_CONTAINERID", "c9").env("CNI_ARGS", "IP=198.18.50.1");
    assert_eq!(n.direct_with("plexus-ipam", "ADD", c2, want).error().0, 111, "held by c1");
    assert_eq!(held.entries(), ["net-0"], "the failed ADD took nothing of the store it shares");
    // plexus-host-device's state directory too.
    let state = DataDir::new("state");
    let hd = json!({"cniVersion": "1.0.0", "name": "rail1", "type": "plexus-host-device", "device": "nic1",
                    "dataDir": state});
    let out = n.direct("plexus-host-device", "ADD", &hd);
    assert!(out.success(), "{}", out.stdout);
    assert_eq!(state.entries(), ["c1=net1"]);
    assert!(n.direct("plexus-host-device", "DEL", &hd).success());
    assert!(n.lab.node.link("nic1").is_some() && !state.path().exists(), "the device back, the directory gone");
    // DEL and GC: each directory goes with its last attachment.
    let (first, rest) = rails.split_first().unwrap();
    assert!(n.direct("plexus-ipam", "DEL", &first.1).success());
    assert!(!first.0.path().exists(), "DEL");
    for (d, c) in rest {
        let mut gc = c.clone();
        gc["cniVersion"] = json!("1.1.0");
        gc["cni.dev/valid-attachments"] = json!([]);
        let out = PluginRun::new(plugin_bin("plexus-ipam"), "GC")
            .env("CNI_PATH", &bin_dir().display().to_string())
            .env("PLEXUS_POLICY", n.policy.to_str().unwrap())
            .stdin(&gc)
            .in_netns(&n.lab.node)
            .run();
        assert!(out.success(), "{}", out.stdout);
        assert!(!d.path().exists(), "GC");
    }
}

// 4. Only delegates are delegates.

#[test]
fn plexus_own_binaries_that_are_not_plugins_are_never_run_as_a_delegate() {
    let n = Node::new();
    n.spy("spy");
    n.macvlan_nad("rail0", "nic0", "198.18.40.0/24", json!({}));
    n.nad("daemon", &json!({"cniVersion": "1.0.0", "type": "plexus-daemon"}));
    n.nad("ctl-ipam", &json!({"cniVersion": "1.0.0", "type": "spy", "ipam": {"type": "plexusctl"}}));
    for (network, name) in [("daemon", "plexus-daemon"), ("ctl-ipam", "plexusctl")] {
        let started = Instant::now();
        let (code, msg, _) = n.plexus("ADD", &n.meta(&format!("rail0,{network}"))).error();
        assert_eq!(code, 7, "{msg}");
        assert!(msg.contains(&format!("plugin type \"{name}\" is not a CNI plugin")), "{msg}");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(n.pod_links(), ["lo"], "refused before rail0 ran");
        assert!(n.spied("net2", "ADD").is_none());
    }
    // Installed under another name (a plain copy): its role note says what it is, and it is
    // refused before it runs; run anyway (with a CNI environment, as another meta-plugin would),
    // it refuses at once, binding nothing.
    for (bin, name) in [("plexus-daemon", "innocent-d"), ("plexusctl", "innocent-c")] {
        let copy = n.path("spies").join(name);
        std::fs::copy(plugin_bin(bin), &copy).unwrap();
        n.nad(name, &json!({"cniVersion": "1.0.0", "type": name}));
        let started = Instant::now();
        let (code, msg, _) = n.plexus("ADD", &n.meta(name)).error();
        assert_eq!(code, 7, "{msg}");
        assert!(msg.contains(&format!("plugin type {name:?} is not a CNI plugin")), "{msg}");
        assert!(started.elapsed() < Duration::from_secs(2), "no hang: {:?}", started.elapsed());
        let out = PluginRun::new(&copy, "ADD")
            .attachment("c1", &n.lab.pod.path(), "net1", &n.cni_path())
            .stdin(&json!({"cniVersion": "1.0.0", "name": "x", "type": name}))
            .in_netns(&n.lab.node)
            .run();
        assert_eq!(out.error().0, 7, "{}", out.stdout);
    }
    assert_eq!(processes_of(&n.lab.pod.path()), Vec::<String>::new());
    assert!(n.plexus("ADD", &n.meta("rail0")).success(), "the legitimate network beside it");
    assert!(n.plexus("DEL", &n.meta("rail0")).success());
}

// 5. The daemon's memory is bounded whatever tenants write.

#[test]
fn an_oversized_nad_is_refused_and_unknown_delegate_types_share_one_metric_label() {
    // A cap below the default (64 KiB): the daemon's watch cache keeps to its policy's.
    let n = Node::with_policy(json!({"limits": {"nadConfigBytes": 32768}}));
    let api = plexus_tests::fake_api::FakeApi::start_in(&n.lab.node);
    let kubeconfig = n.path("kubeconfig");
    api.write_kubeconfig(&kubeconfig, true);
    let padding = "x".repeat(70 * 1024);
    api.add_nad("ml", "huge", &json!({"cniVersion": "1.0.0", "type": "spy", "padding": padding}), json!({}));
    let between = "x".repeat(40 * 1024);
    api.add_nad("ml", "between", &json!({"cniVersion": "1.0.0", "type": "spy", "padding": between}), json!({}));
    for i in 0..20 {
        api.add_nad(
            "ml",
            &format!("typo{i}"),
            &json!({"cniVersion": "1.0.0", "type": format!("no-such-plugin-{i}")}),
            json!({}),
        );
    }
    let mut annotations =
        vec![("huge".to_string(), "huge".to_string()), ("between".to_string(), "between".to_string())];
    annotations.extend((0..20).map(|i| (format!("p{i}"), format!("typo{i}"))));
    for (pod, networks) in &annotations {
        api.add_pod("ml", pod, &format!("uid-{pod}"), json!({"k8s.v1.cni.cncf.io/networks": networks}));
    }
    let (d, mut meta) =
        n.daemon(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "n1"], &[("PLEXUS_POLICY", &n.policy)]);
    meta.as_object_mut().unwrap().remove("nadDir");
    meta.as_object_mut().unwrap().remove("networks");
    meta["kubeconfig"] = json!(kubeconfig);
    let as_pod = |pod: &str| {
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=ml;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}");
        move |r: PluginRun| r.env("CNI_ARGS", &args)
    };
    let (code, msg, _) = n.plexus_with("ADD", &meta, as_pod("huge")).error();
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("network-attachment-definition ml/huge: spec.config is 717"), "{msg}");
    assert!(msg.ends_with("the node policy allows at most 32768 (limits.nadConfigBytes)"), "{msg}");
    let (code, msg, _) = n.plexus_with("ADD", &meta, as_pod("between")).error();
    assert_eq!(code, 7, "{msg}");
    // The watch cache dropped both while decoding, at its policy's cap (the requests read them
    // from the API), and kept the small ones (never read one by one).
    let read = |nad: &str| {
        api.requests()
            .iter()
            .any(|r| r.starts_with("GET") && r.contains(&format!("network-attachment-definitions/{nad}")))
    };
    assert!(read("huge") && read("between") && !read("typo0"), "{:?}", api.requests());
    for i in 0..20 {
        let (code, _, _) = n.plexus_with("ADD", &meta, as_pod(&format!("p{i}"))).error();
        assert_eq!(code, 100, "no such plugin");
    }
    let metrics = d.metrics();
    assert!(!metrics.contains("no-such-plugin"), "a tenant's type never becomes a label");
    let unknown = "plexus_daemon_delegate_duration_seconds_count{command=\"ADD\",network=";
    let series: Vec<&str> = metrics.lines().filter(|l| l.starts_with(unknown)).collect();
    assert_eq!(series.len(), 20, "one per network: {series:?}");
    assert!(series.iter().all(|l| l.contains("type=\"(not installed)\"")), "{series:?}");
}

// 6. Shared pools are the admin's to hand out.

#[test]
fn a_range_outside_the_namespaces_allowed_ranges_is_refused_before_any_store_is_opened() {
    let n = Node::with_policy(json!({"allow": {"ranges": ["198.18.0.0/16"],
        "namespaces": {"team-a": {"ranges": ["198.18.40.0/24"]}}}}));
    let team = |ns: &'static str| {
        move |r: PluginRun| r.env("CNI_ARGS", &format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME=p"))
    };
    let theirs =
        macvlan_conf(&n, json!({"ipam": {"type": "plexus-ipam", "range": "198.18.41.0/24", "dataDir": n.ipam}}));
    let (code, msg, details) = n.direct_with("plexus-ipam", "ADD", &theirs, team("team-a")).error();
    assert_eq!((code, msg.as_str()), (7, "range \"198.18.41.0/24\" is not allowed by the node policy"));
    assert!(details.starts_with("allow.ranges for namespace team-a: [\"198.18.40.0/24\"]"), "{details}");
    assert!(!n.ipam.path().exists(), "refused before the store was opened");
    let off_node =
        macvlan_conf(&n, json!({"ipam": {"type": "plexus-ipam", "range": "198.20.0.0/24", "dataDir": n.ipam}}));
    let (code, _, details) = n.direct_with("plexus-ipam", "ADD", &off_node, team("team-b")).error();
    assert_eq!(code, 7);
    assert!(details.starts_with("allow.ranges: [\"198.18.0.0/16\"]"), "node-wide for the others: {details}");
    // Through plexus, and the allowed range beside it.
    n.macvlan_nad("theirs", "nic0", "198.18.41.0/24", json!({}));
    let (code, _, _) = n.plexus_with("ADD", &n.meta("theirs"), team("team-a")).error();
    assert_eq!(code, 7);
    assert_eq!(n.pod_links(), ["lo"]);
    let own = macvlan_conf(&n, json!({}));
    assert!(n.direct_with("plexus-ipam", "ADD", &own, team("team-a")).success());
    assert!(n.direct_with("plexus-ipam", "DEL", &own, team("team-a")).success());
}

// 7. What reaches logs and terminals is escaped.

#[test]
fn control_characters_in_an_interface_name_reach_no_log_or_terminal_raw() {
    let n = Node::new();
    n.macvlan_nad("rail0", "nic0", "198.18.40.0/24", json!({}));
    let log = n.path("admin.log");
    let mut meta = n.meta("rail0@e\u{1b}]0;x\u{7}1");
    meta["logFile"] = json!(log);
    meta["logLevel"] = json!("debug");
    let out = n.plexus("ADD", &meta);
    assert!(out.success(), "{}", out.stdout);
    let text = std::fs::read(&log).unwrap();
    assert!(!text.contains(&0x1b) && !text.contains(&0x07), "raw control characters in the log");
    assert!(String::from_utf8_lossy(&text).contains("e\\x1b]0;x\\x071"), "escaped, still readable");
    // plexusctl's listing of the store the name reached.
    let netconf = n.path("net.d");
    std::fs::create_dir_all(&netconf).unwrap();
    std::fs::write(netconf.join("rail0.conf"), macvlan_conf(&n, json!({})).to_string()).unwrap();
    let listing = std::process::Command::new(plugin_bin("plexusctl"))
        .args(["ipam", "list", "rail0"])
        .env("NETCONFPATH", &netconf)
        .env("PLEXUS_POLICY", &n.policy)
        .output()
        .unwrap();
    assert!(listing.status.success(), "{}", String::from_utf8_lossy(&listing.stderr));
    assert!(!listing.stdout.contains(&0x1b), "raw ESC on the terminal");
    assert!(String::from_utf8_lossy(&listing.stdout).contains("\\x1b"), "{}", String::from_utf8_lossy(&listing.stdout));
    assert!(n.plexus("DEL", &meta).success());
}
