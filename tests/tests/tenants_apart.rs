//! Tenant isolation, third round: what tenants share on one node and must not take from each
//! other — the node's own addresses, a directory of NAD files, the node's turn to move whole
//! devices, and what an error tells. Each test mounts one tenant's attack or mistake, through
//! `plexus` in namespaces (thin and through plexus-daemon where the path differs), and shows that
//! another tenant's request and the node are unaffected.

use std::path::Path;

use plexus_tests::daemon::write_gated_delegate;
use plexus_tests::tenant::Node;
use plexus_tests::{DataDir, plugin_bin};
use serde_json::{Value, json};

fn with_networks(meta: &Value, networks: &str) -> Value {
    let mut m = meta.clone();
    m["networks"] = json!(networks);
    m
}

// The node's own addresses.

#[test]
fn the_nodes_own_addresses_and_the_gateway_are_never_a_pods_thin_in_plexus_daemon_from_a_claim_file_or_etcd() {
    let n = Node::new();
    let etcd = n.etcd_store();
    // The node's addresses in each pool: its rail port's own (the first address of the pool) and
    // one on another interface; the gateway is the third.
    for (dev, addr) in
        [("nic0", "198.18.40.1/24"), ("nic1", "198.18.40.2/24"), ("nic0", "198.18.41.1/24"), ("nic1", "198.18.41.2/24")]
    {
        n.lab.node.ip(&["addr", "add", addr, "dev", dev]);
    }
    n.macvlan_nad("file-rail", "nic0", "198.18.40.0/24", json!({}));
    // Four addresses a pool: the node's two, the gateway, and the one a pod may have (whatever
    // order a store picks in).
    let ipam = |range: &str, store: Value| {
        json!({"type": "plexus-ipam", "range": format!("{range}.0/24"), "range_start": format!("{range}.1"),
               "range_end": format!("{range}.4"), "gateway": format!("{range}.3"), "store": store})
    };
    let mut file_ipam = ipam("198.18.40", json!(null));
    file_ipam["dataDir"] = json!(n.ipam);
    file_ipam.as_object_mut().unwrap().remove("store");
    n.nad("file-rail", &json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0", "ipam": file_ipam}));
    n.nad(
        "etcd-rail",
        &json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
        "ipam": ipam("198.18.41", json!("fabric"))}),
    );
    n.claim("rail", json!({"interface": "net1", "ipam": file_ipam}));
    let (_daemon, daemon_meta) = n.daemon(&[], &[]);
    let pod_addr =
        || n.lab.pod.addrs("net1").into_iter().map(|a| format!("{}/{}", a.local, a.prefixlen)).collect::<Vec<_>>();
    for (how, meta) in [("thin", n.meta("")), ("daemon", daemon_meta.clone())] {
        for (network, pool) in [("file-rail", "198.18.40"), ("etcd-rail", "198.18.41"), ("claim", "198.18.40")] {
            let how = format!("{how}, {network}");
            let claim = network == "claim";
            let meta = if claim { n.with_claims(&with_networks(&meta, "")) } else { with_networks(&meta, network) };
            let run = |verb: &str, m: &Value| if claim { n.plexus_for_pod(verb, m) } else { n.plexus(verb, m) };
            let out = run("ADD", &meta);
            assert!(out.success(), "{how}: {}", out.stdout);
            assert_eq!(pod_addr(), [format!("{pool}.4/24")], "{how}: not the node's, nor the gateway");
            assert!(run("DEL", &meta).success(), "{how}");
        }
        // Asked for by name: refused, naming what holds it.
        for (ip, holder) in [
            ("198.18.40.1", "this node (nic0)"),
            ("198.18.40.2", "this node (nic1)"),
            ("198.18.40.3", "the range's gateway"),
        ] {
            let asked = with_networks(
                &meta,
                &json!([{"name": "file-rail", "namespace": "default", "ips": [format!("{ip}/24")]}]).to_string(),
            );
            let (code, msg, _) = n.plexus("ADD", &asked).error();
            assert_eq!(code, 111, "{how}: {msg}");
            assert!(msg.ends_with(&format!("requested address {ip} is already allocated to {holder}")), "{how}: {msg}");
            assert!(n.plexus("DEL", &asked).success());
        }
    }
    assert_eq!(n.held(), 0);
    assert!(etcd.keys("/plexus-test/default/ips/").is_empty());
    assert_eq!(n.pod_links(), ["lo"]);
}

// What an error tells.

/// plexus run for pod `namespace/name` (container `name`) in the pod namespace at `netns`.
fn as_pod<'a>(
    namespace: &'a str,
    name: &'a str,
    netns: &'a Path,
) -> impl Fn(plexus_tests::PluginRun) -> plexus_tests::PluginRun + 'a {
    move |r| {
        r.env("CNI_CONTAINERID", name)
            .env("CNI_NETNS", netns.to_str().unwrap())
            .env("CNI_ARGS", &format!("K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"))
    }
}

#[test]
fn an_address_a_pod_of_another_namespace_holds_is_refused_without_naming_it_in_the_file_and_etcd_stores() {
    let n = Node::new();
    let etcd = n.etcd_store();
    n.macvlan_nad("file-rail", "nic0", "198.18.40.0/24", json!({}));
    n.nad(
        "etcd-rail",
        &json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
        "ipam": {"type": "plexus-ipam", "range": "198.18.41.0/24", "store": "fabric"}}),
    );
    let (bob_ns, carol_ns) = (n.lab.another_pod(), n.lab.another_pod());
    let pod = n.lab.pod.path();
    let (_daemon, daemon_meta) = n.daemon(&[], &[]);
    let cases = [("file-rail", "198.18.40.10"), ("etcd-rail", "198.18.41.10")];
    for ((network, ip), base) in cases.iter().flat_map(|c| [(c, n.meta("")), (c, daemon_meta.clone())]) {
        let selection = json!([{"name": network, "namespace": "default", "ips": [format!("{ip}/24")]}]);
        let meta = with_networks(&base, &selection.to_string());
        let alice = n.plexus_with("ADD", &meta, as_pod("team-a", "alice", &pod));
        assert!(alice.success(), "{network}: {}", alice.stdout);
        let (code, msg, details) = n.plexus_with("ADD", &meta, as_pod("team-b", "bob", &bob_ns.path())).error();
        assert_eq!(code, 111, "{network}: {msg}");
        assert!(
            msg.ends_with(&format!("requested address {ip} is already allocated to a pod of another namespace")),
            "{network}: {msg}"
        );
        assert!(!format!("{msg} {details}").contains("alice"), "{network}: nothing of team-a's pod: {msg} {details}");
        // A pod of the holder's own namespace is told which pod it is.
        let (code, msg, _) = n.plexus_with("ADD", &meta, as_pod("team-a", "carol", &carol_ns.path())).error();
        assert_eq!(code, 111, "{network}: {msg}");
        assert!(msg.ends_with("is already allocated to team-a/alice"), "{network}: {msg}");
        assert!(n.plexus_with("DEL", &meta, as_pod("team-a", "alice", &pod)).success());
        assert_eq!(n.pod_links(), ["lo"]);
    }
    assert!(etcd.keys("/plexus-test/default/ips/").is_empty(), "nothing held");
}

// What reaches the API server.

#[test]
fn a_claims_network_that_is_not_a_name_never_reaches_the_api_servers_url_thin_or_through_plexus_daemon() {
    let n = Node::new();
    let api = plexus_tests::fake_api::FakeApi::start_in(&n.lab.node);
    let kubeconfig = n.path("kubeconfig");
    api.write_kubeconfig(&kubeconfig, true);
    api.add_pod("default", "pod1", plexus_tests::tenant::POD_UID, json!({}));
    let (_daemon, daemon_meta) = n.daemon(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "n1"], &[]);
    let on_api = |meta: &Value| {
        let mut m = n.with_claims(meta);
        m.as_object_mut().unwrap().remove("nadDir");
        m.as_object_mut().unwrap().remove("networks");
        m["kubeconfig"] = json!(kubeconfig);
        m
    };
    // A prepared claim as an earlier plexus (or anything that wrote the file) may have left it.
    n.claim("sneaky", json!({"network": "../../../api/v1/namespaces/kube-system/secrets?watch=1"}));
    for (how, meta) in [("thin", on_api(&n.meta(""))), ("daemon", on_api(&daemon_meta))] {
        let (code, msg, _) = n.plexus_for_pod("ADD", &meta).error();
        assert_eq!(code, 7, "{how}: {msg}");
        assert!(msg.contains("network-attachment-definition name \"../../../api/v1"), "{how}: {msg}");
        assert!(msg.contains("is not a Kubernetes object name"), "{how}: {msg}");
        assert!(n.plexus_for_pod("DEL", &meta).success(), "{how}");
    }
    let asked = api.requests();
    assert!(asked.iter().all(|r| !r.contains("secrets") && !r.contains("watch=1") && !r.contains("..")), "{asked:?}");
    assert_eq!(n.pod_links(), ["lo"]);
}

// A directory of NAD files.

/// The peak of process `pid`'s resident memory so far, in KiB (`VmHWM`).
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_tenants_broken_or_huge_nad_file_neither_breaks_nor_bloats_another_tenants_add_thin_or_in_plexus_daemon() {
    let n = Node::new();
    n.macvlan_nad("rail0", "nic0", "198.18.40.0/24", json!({}));
    // Another tenant's files beside it: one that does not parse, one of 96 MiB (sparse).
    std::fs::write(n.path("nads/broken.yaml"), "kind: NetworkAttachmentDefinition\n{{{ not yaml").unwrap();
    std::fs::File::create(n.path("nads/huge.yaml")).unwrap().set_len(96 << 20).unwrap();
    // Thin: plexus with at most 64 MiB of data (the manifests were all read and parsed before
    // any was looked up: the huge one alone is more).
    let limited = n.path("spies/plexus-limited");
    std::fs::write(&limited, format!("#!/bin/sh\nulimit -d 65536\nexec {} \"$@\"\n", plugin_bin("plexus").display()))
        .unwrap();
    std::fs::set_permissions(&limited, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let run = |verb: &str, meta: &Value| {
        plexus_tests::PluginRun::new(&limited, verb)
            .attachment("pod1", &n.lab.pod.path(), "eth0", &n.cni_path())
            .env("PLEXUS_POLICY", n.policy.to_str().unwrap())
            .stdin(meta)
            .in_netns(&n.lab.node)
            .run()
    };
    let out = run("ADD", &n.meta("rail0"));
    assert!(out.success(), "thin: {}", out.stdout);
    assert!(run("DEL", &n.meta("rail0")).success());
    // Through plexus-daemon (nadDir read by the daemon for each request): its peak memory stays
    // far below the huge file's size.
    let (daemon, daemon_meta) = n.daemon(&[], &[]);
    let meta = with_networks(&daemon_meta, "rail0");
    let out = n.plexus("ADD", &meta);
    assert!(out.success(), "daemon: {}", out.stdout);
    assert!(n.plexus("DEL", &meta).success());
    let peak = peak_rss_kib(daemon.pid());
    assert!(peak < 64 * 1024, "the daemon's peak RSS is {peak} KiB");
    // A claim taking its config from the NAD (the claim's network), beside them.
    n.claim("rail", json!({"interface": "net1", "network": "rail0"}));
    let claimed = n.with_claims(&with_networks(&daemon_meta, ""));
    let out = n.plexus_for_pod("ADD", &claimed);
    assert!(out.success(), "claim: {}", out.stdout);
    assert!(n.plexus_for_pod("DEL", &claimed).success());
    assert!(peak_rss_kib(daemon.pid()) < 64 * 1024);
    std::fs::remove_dir_all(n.path("claims")).unwrap();
    // The broken file is its own network's error, and only its own.
    for meta in [n.meta("broken"), with_networks(&daemon_meta, "broken")] {
        let (code, msg, _) = n.plexus("ADD", &meta).error();
        assert_eq!(code, 7, "{msg}");
        assert!(msg.contains("network-attachment-definition default/broken: manifest"), "{msg}");
        assert!(msg.contains("broken.yaml") && !msg.contains("huge"), "{msg}");
    }
    assert_eq!(n.pod_links(), ["lo"]);
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
    // The first pod's port from a claim: the port0 NAD's config (its state directory) on the
    // allocated port.
    n.claim_port("port", "nic0", "exclusive", json!({"interface": "net2", "network": "port0"}));
    let (_daemon, daemon_meta) = n.daemon(&[], &[]);
    let cases = [
        ("thin", with_networks(&n.meta(""), "port0,slow"), 0),
        ("daemon", with_networks(&daemon_meta, "port0,slow"), 0),
        ("claim", n.with_claims(&with_networks(&daemon_meta, "slow")), 1),
    ];
    for (how, first, port) in cases {
        let _ = std::fs::remove_file(gate.join("open"));
        let mut first = first;
        let meta = if how == "thin" { n.meta("") } else { daemon_meta.clone() };
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
            // Should an assertion fail, the gate opens and the first pod's ADD ends.
            let _opens = OpenOnDrop(gate.join("open"));
            let pod1 = s.spawn(|| n.plexus_for_pod("ADD", &first));
            // Its port's ADD is done (its result recorded), its slow delegate waits at the gate,
            // and the node's turn comes free (it was held until the slow delegate ended).
            wait_for(&gate.join("entered-pod1"));
            let cache = n.path("cache/pod1");
            let recorded = format!("\"attachment\":{port}");
            wait_until(&format!("{how}: {recorded} in the cache"), || {
                std::fs::read_to_string(&cache).is_ok_and(|c| c.contains(&recorded))
            });
            wait_until(&format!("{how}: the turn free while the slow delegate runs"), || {
                let dir = std::fs::File::open(n.path("cache")).unwrap();
                nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
            });
            let out = n.plexus_with("ADD", &second, as_other);
            assert!(out.success(), "{how}: {}", out.stdout);
            assert!(!gate.join("open").exists(), "{how}: the first pod's slow delegate still runs");
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(!text.contains("no turn in time"), "{how}: the second pod waited for the turn:\n{text}");
            std::fs::write(gate.join("open"), b"").unwrap();
            assert!(pod1.join().unwrap().success(), "{how}");
        });
        assert!(n.plexus_with("DEL", &second, as_other).success(), "{how}");
        assert!(n.plexus_for_pod("DEL", &first).success(), "{how}");
        assert_eq!(n.pod_links(), ["lo"], "{how}");
        let _ = std::fs::remove_file(gate.join("entered-pod1"));
    }
}

/// Creates its file when dropped (a panic included).
struct OpenOnDrop(std::path::PathBuf);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, b"");
    }
}

fn wait_for(path: &Path) {
    wait_until(&path.display().to_string(), || path.exists());
}

/// Wait (up to 30 s, failing then) until `done`.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < std::time::Duration::from_secs(30), "never happened: {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

// A refused ADD's DEL.

#[test]
fn the_del_of_an_add_the_node_policy_refused_succeeds_thin_in_plexus_daemon_and_from_a_claim() {
    let n = Node::with_policy(json!({"allow": {"parents": ["nic0", "nic1"], "ranges": ["198.18.40.0/24"]}}));
    let state = DataDir::new("hd-refused");
    let forbidden = "/etc/plexus-test-forbidden";
    let macvlan = |extra: Value, ipam: Value| {
        let mut c = json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
            "ipam": {"type": "plexus-ipam", "range": "198.18.40.0/24", "dataDir": n.ipam}});
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c["ipam"].as_object_mut().unwrap().extend(ipam.as_object().unwrap().clone());
        c
    };
    let refused = [
        ("ipam-datadir", macvlan(json!({}), json!({"dataDir": forbidden}))),
        ("passthru", macvlan(json!({"mode": "passthru"}), json!({}))),
        ("parent", macvlan(json!({"master": "lo"}), json!({}))),
        ("range", macvlan(json!({}), json!({"range": "198.18.41.0/24"}))),
        (
            "hd-datadir",
            json!({"cniVersion": "1.0.0", "type": "plexus-host-device", "device": "nic1", "dataDir": forbidden}),
        ),
    ];
    for (name, conf) in &refused {
        n.nad(name, conf);
    }
    n.nad("hd", &json!({"cniVersion": "1.0.0", "type": "plexus-host-device", "device": "nic1", "dataDir": state}));
    n.claim(
        "refused",
        json!({"interface": "net1", "ipam": {"type": "plexus-ipam", "range": "198.18.40.0/24", "dataDir": forbidden}}),
    );
    let (_daemon, daemon_meta) = n.daemon(&[], &[]);
    for (how, meta) in [("thin", n.meta("")), ("daemon", daemon_meta.clone())] {
        for (name, _) in &refused {
            let how = format!("{how}, {name}");
            let m = with_networks(&meta, name);
            let (code, msg, _) = n.plexus("ADD", &m).error();
            assert_eq!(code, 7, "{how}: {msg}");
            let del = n.plexus("DEL", &m);
            assert!(del.success(), "{how}: the DEL of what never was: {}", del.stdout);
            assert_eq!(n.pod_links(), ["lo"], "{how}");
        }
        let claimed = n.with_claims(&with_networks(&meta, ""));
        let (code, msg, _) = n.plexus_for_pod("ADD", &claimed).error();
        assert_eq!(code, 7, "{how}, claim: {msg}");
        let del = n.plexus_for_pod("DEL", &claimed);
        assert!(del.success(), "{how}, claim: {}", del.stdout);
    }
    assert_eq!(n.held(), 0);
    assert!(!Path::new(forbidden).exists(), "nothing made where the policy refused");
}
