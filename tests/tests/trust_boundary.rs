//! The trust boundary: a NetworkAttachmentDefinition is tenant-written, every plexus binary runs
//! as root. Each test performs an attack a tenant could mount with a NAD, a pod annotation or a
//! config a meta-plugin passes on — through `plexus` and, where the delegate is reachable on its
//! own (as Multus would run it), directly — and shows it fails with a clear CNI error naming the
//! key, the value and the rule, with nothing touched; beside it, the legitimate use still works.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use plexus_tests::tenant::{Node, assert_untouched, macvlan_conf};
use plexus_tests::{DataDir, PluginRun, plugin_bin, test_policy};
use serde_json::{Value, json};

// 1. The meta-plugin as a delegate.

#[test]
fn a_nad_whose_type_is_the_meta_plugin_is_refused_before_any_delegate_runs() {
    let n = Node::new();
    n.spy("sh");
    n.macvlan_nad("rail0", "nic0", "198.18.40.0/24", json!({}));
    let evil = json!({"cniVersion": "1.0.0", "type": "plexus", "binDir": n.path("spies"),
        "delegates": [{"cniVersion": "1.0.0", "name": "x", "type": "sh"}], "readinessindicatorfile": "/nonexistent"});
    n.nad("nested", &evil);
    let started = Instant::now();
    let (code, msg, _) = n.plexus("ADD", &n.meta("rail0,nested")).error();
    assert_eq!(code, 7);
    assert_eq!(msg, "network default/nested: plugin type \"plexus\" is a meta-plugin: a network may not run one");
    assert!(started.elapsed() < Duration::from_secs(5), "the readiness file is never waited for");
    assert!(n.spied("eth0", "ADD").is_none() && n.spied("net2", "ADD").is_none(), "the tenant's delegate never ran");
    assert_eq!(n.pod_links(), ["lo"], "refused before rail0 ran too");
    assert_eq!(n.held(), 0);
    // The same NAD as the second plugin of a chain, and under another name (a link to plexus).
    n.nad("chained", &json!({"cniVersion": "1.0.0", "name": "chained", "plugins": [{"type": "sh"}, evil]}));
    let (code, msg, _) = n.plexus("ADD", &n.meta("chained")).error();
    assert_eq!((code, msg.contains("\"plexus\" is a meta-plugin")), (7, true), "{msg}");
    std::os::unix::fs::symlink(plugin_bin("plexus"), n.path("spies").join("innocent")).unwrap();
    n.nad("renamed", &json!({"cniVersion": "1.0.0", "type": "innocent", "delegates": []}));
    let (code, msg, _) = n.plexus("ADD", &n.meta("renamed")).error();
    assert_eq!((code, msg.contains("\"innocent\" is a meta-plugin")), (7, true), "{msg}");
    assert!(n.spied("net1", "ADD").is_none());
    // The legitimate use: the same selection without the nested network.
    let ok = n.plexus("ADD", &n.meta("rail0"));
    assert!(ok.success(), "{}", ok.stdout);
    assert!(n.plexus("DEL", &n.meta("rail0")).success());
    assert_eq!(n.held(), 0);
}

#[test]
fn plexus_run_as_a_delegate_of_plexus_refuses_before_reading_any_path_it_was_given() {
    let n = Node::new();
    n.spy("sh");
    let log = n.path("tenant.log");
    let evil = json!({"cniVersion": "1.1.0", "name": "x", "type": "plexus", "binDir": n.path("spies"),
        "delegates": [{"cniVersion": "1.0.0", "name": "x", "type": "sh"}], "logFile": log, "logLevel": "debug",
        "readinessindicatorfile": "/nonexistent", "cniDir": n.path("tenant-cache")});
    for verb in ["ADD", "CHECK", "STATUS"] {
        let started = Instant::now();
        let out = n.plexus_with(verb, &evil, |r| r.env("PLEXUS_META_DELEGATE", "1"));
        let (code, msg, _) = out.error();
        assert_eq!(code, 7, "{verb}: {msg}");
        assert!(msg.contains("plexus runs as a delegate of plexus"), "{msg}");
        assert!(started.elapsed() < Duration::from_secs(5), "{verb}: no readiness wait");
    }
    // DEL and GC: it never did anything, so there is nothing to release, and the runtime's DEL
    // of the pod is not failed by it.
    for verb in ["DEL", "GC"] {
        let out = n.plexus_with(verb, &evil, |r| r.env("PLEXUS_META_DELEGATE", "1"));
        assert!(out.success(), "{verb}: {}", out.stdout);
    }
    assert!(n.spied("eth0", "ADD").is_none() && n.spied("eth0", "DEL").is_none());
    assert!(!log.exists(), "the logFile it was given is never opened");
    assert!(!n.path("tenant-cache").exists());
}

#[test]
fn del_from_a_cache_written_before_the_refusal_never_runs_a_nested_meta_plugin() {
    let n = Node::new();
    n.spy("sh");
    n.macvlan_nad("rail0", "nic0", "198.18.40.0/24", json!({}));
    let meta = n.meta("rail0");
    assert!(n.plexus("ADD", &meta).success());
    // A cache as an older plexus wrote it, with a nested plexus attachment after rail0.
    let cache = n.path("cache/pod1");
    let bytes = std::fs::read(&cache).unwrap();
    let mut values: Vec<Value> = serde_json::Deserializer::from_slice(&bytes).into_iter().map(Result::unwrap).collect();
    values[0]["attachments"].as_array_mut().unwrap().push(json!({"network": "default/nested", "ifname": "net2",
        "conf": {"cniVersion": "1.0.0", "name": "nested", "type": "plexus", "binDir": n.path("spies"),
                 "delegates": [{"cniVersion": "1.0.0", "name": "x", "type": "sh"}]}}));
    let text: Vec<String> = values.iter().map(Value::to_string).collect();
    std::fs::write(&cache, text.join("\n")).unwrap();
    let out = n.plexus("DEL", &meta);
    assert!(out.success(), "{}", out.stdout);
    assert!(n.spied("eth0", "DEL").is_none() && n.spied("net2", "DEL").is_none(), "the nested one never ran");
    assert_eq!(n.pod_links(), ["lo"], "rail0 was deleted");
    assert_eq!(n.held(), 0);
}

/// `meta` with the selection `networks`.
fn with_networks(meta: &Value, networks: &str) -> Value {
    let mut m = meta.clone();
    m["networks"] = json!(networks);
    m
}

/// A meta config a tenant writes into a network's IPAM section (or a claim's): its own plugin
/// directory, NAD directory, cache and delegates.
fn nested_meta(n: &Node, plugin_type: &str) -> Value {
    json!({"type": plugin_type, "binDir": n.path("spies"), "nadDir": n.path("nads"), "networks": "rail0",
           "cniDir": n.path("tenant-cache"), "logFile": n.path("tenant.log"),
           "delegates": [{"cniVersion": "1.0.0", "name": "x", "type": "sh"}]})
}

#[test]
fn the_meta_plugin_as_a_networks_ipam_runs_nothing_thin_through_plexus_daemon_or_from_a_claim_and_del_succeeds() {
    let n = Node::new();
    n.spy("sh");
    // The meta-plugin under its own name, a link and a copy: what an admin may have installed.
    std::os::unix::fs::symlink(plugin_bin("plexus"), n.path("spies").join("linked")).unwrap();
    std::fs::copy(plugin_bin("plexus"), n.path("spies").join("copied")).unwrap();
    n.macvlan_nad("rail0", "nic0", "198.18.40.0/24", json!({}));
    let (_daemon, daemon_meta) = n.daemon(&[], &[]);
    let refused = |how: &str, out: plexus_tests::Outcome, network: &str, t: &str| {
        let (code, msg, _) = out.error();
        assert_eq!(code, 7, "{how}: {msg}");
        assert!(msg.contains(&format!("network {network}: plugin type {t:?} is a meta-plugin")), "{how}: {msg}");
        assert!(n.spied("eth0", "ADD").is_none() && n.spied("net1", "ADD").is_none(), "{how}: nothing ran");
        assert_eq!(n.pod_links(), ["lo"], "{how}: rail0 beside it was not attached either");
        assert_eq!(n.held(), 0, "{how}");
    };
    for t in ["plexus", "linked", "copied"] {
        let network = format!("via-{t}");
        let conf =
            json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0", "ipam": nested_meta(&n, t)});
        n.nad(&network, &conf);
        let selection = format!("rail0,{network}");
        for (how, meta) in [("thin", n.meta(&selection)), ("daemon", with_networks(&daemon_meta, &selection))] {
            let how = format!("{how}, {t}");
            refused(&how, n.plexus("ADD", &meta), &format!("default/{network}"), t);
            let del = n.plexus("DEL", &meta);
            assert!(del.success(), "{how}: the runtime's DEL after the failed ADD: {}", del.stdout);
        }
    }
    // The same in a claim's parameters (a ResourceClaim is tenant input too).
    n.claim("evil", json!({"ipam": nested_meta(&n, "copied")}));
    for (how, meta) in [("thin", n.meta("")), ("daemon", with_networks(&daemon_meta, ""))] {
        let meta = n.with_claims(&meta);
        let how = format!("{how}, claim");
        refused(&how, n.plexus_for_pod("ADD", &meta), "default/dra-evil-rail", "copied");
        assert!(n.plexus_for_pod("DEL", &meta).success(), "{how}");
    }
    assert!(!n.path("tenant-cache").exists() && !n.path("tenant.log").exists(), "nothing it named was touched");
    let shim = std::fs::read_to_string(n.path("shim.log")).unwrap_or_default();
    assert!(!shim.contains("thin mode"), "the daemon's requests were the daemon's: {shim}");
}

#[test]
fn run_directly_as_multus_would_an_attaching_plugin_never_runs_the_meta_plugin_as_its_ipam() {
    let n = Node::new();
    n.spy("sh");
    std::fs::copy(plugin_bin("plexus"), n.path("spies").join("copied")).unwrap();
    for t in ["plexus", "copied"] {
        let c = macvlan_conf(&n, json!({"ipam": nested_meta(&n, t)}));
        let (code, msg, _) = n.direct("plexus-macvlan", "ADD", &c).error();
        assert_eq!(code, 7, "{t}: {msg}");
        assert!(msg.contains(&format!("plugin type {t:?} is a meta-plugin")), "{msg}");
        assert_eq!(n.pod_links(), ["lo"], "the macvlan was undone");
        // No plexus process ran, so none can fail the DEL.
        assert!(n.direct("plexus-macvlan", "DEL", &c).success(), "{t}");
    }
    assert!(n.spied("net1", "ADD").is_none() && !n.path("tenant-cache").exists());
}

#[test]
fn a_wrapper_the_seam_cannot_see_through_still_finds_plexus_refusing_thin_and_in_process() {
    let n = Node::new();
    n.spy("sh");
    // An admin's wrapper around plexus, as IPAM: the seam cannot tell what a script runs; the
    // plexus it execs finds the delegation's mark in its environment and refuses.
    let wrapper = n.path("spies").join("ipam-wrapper");
    std::fs::write(&wrapper, format!("#!/bin/sh\nexec {} \"$@\"\n", plugin_bin("plexus").display())).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    n.nad(
        "wrapped",
        &json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
                             "ipam": nested_meta(&n, "ipam-wrapper")}),
    );
    let (_daemon, daemon_meta) = n.daemon(&[], &[]);
    for (how, meta) in [("thin", n.meta("wrapped")), ("daemon", with_networks(&daemon_meta, "wrapped"))] {
        let (code, msg, _) = n.plexus("ADD", &meta).error();
        assert_eq!(code, 7, "{how}: {msg}");
        assert!(msg.contains("plexus runs as a delegate of plexus"), "{how}: {msg}");
        assert_eq!(n.pod_links(), ["lo"], "{how}");
        assert!(n.plexus("DEL", &meta).success(), "{how}: the nested plexus's DEL has nothing to release");
    }
    assert!(n.spied("net1", "ADD").is_none() && !n.path("tenant-cache").exists());
    assert!(!n.path("tenant.log").exists());
}

#[test]
fn every_plexus_binary_says_in_its_role_note_whether_it_is_a_delegate() {
    use plexus_plugin::role::{Role, of_file};
    for (binary, role) in [
        ("plexus", Role::Meta),
        ("plexus-macvlan", Role::Delegate),
        ("plexus-host-device", Role::Delegate),
        ("plexus-ipam", Role::Delegate),
        ("plexus-daemon", Role::Tool),
        ("plexusctl", Role::Tool),
    ] {
        assert_eq!(of_file(&plugin_bin(binary)), Some(role), "{binary}");
    }
    assert_eq!(of_file(&plexus_tests::reference_plugin("macvlan")), None, "another project's plugin has none");
}

// 2. Log files.

#[test]
fn a_nads_log_file_is_ignored_by_every_delegate_and_the_admins_log_gets_their_lines() {
    let n = Node::new();
    let victim = n.victim("ld.so.preload");
    let tenant_log = json!({"logFile": victim, "logLevel": "debug"});
    // Directly, as Multus would run them.
    let c = macvlan_conf(&n, tenant_log.clone());
    let mut ipam = c.clone();
    ipam["ipam"]["log_file"] = json!(victim); // whereabouts' spelling
    for (plugin, conf) in [("plexus-macvlan", &c), ("plexus-ipam", &ipam)] {
        let out = n.direct(plugin, "ADD", conf);
        assert!(out.success(), "{plugin}: {}", out.stdout);
        assert!(n.direct(plugin, "DEL", conf).success());
    }
    assert_untouched(&victim);
    // Through plexus: the NAD's logFile is dropped; the admin's log (the meta config) gets the
    // delegates' lines through the environment plexus gives them.
    n.macvlan_nad("rail0", "nic0", "198.18.41.0/24", tenant_log);
    let admin_log = n.path("admin/plexus.log");
    let mut meta = n.meta("rail0");
    meta["logFile"] = json!(admin_log);
    meta["logLevel"] = json!("debug");
    assert!(n.plexus("ADD", &meta).success());
    assert!(n.plexus("DEL", &meta).success());
    assert_untouched(&victim);
    let log = std::fs::read_to_string(&admin_log).unwrap();
    assert!(log.contains("create macvlan") || log.contains("delegating"), "{log}");
    assert!(log.contains("allocated"), "plexus-ipam (a delegate's delegate) logs there too: {log}");
}

// 3. Device-info files.

#[test]
fn a_device_info_file_outside_the_device_info_dir_is_refused_and_never_written_or_deleted() {
    let n = Node::new();
    let victim = n.victim("kubelet.kubeconfig");
    let c = macvlan_conf(&n, json!({"runtimeConfig": {"CNIDeviceInfoFile": victim}}));
    let (code, msg, details) = n.direct("plexus-macvlan", "ADD", &c).error();
    assert_eq!(code, 7);
    assert_eq!(msg, format!("runtimeConfig.CNIDeviceInfoFile {:?} is refused", victim.display().to_string()));
    assert!(details.contains("/var/run/k8s.cni.cncf.io/devinfo/cni"), "{details}");
    assert_eq!(n.pod_links(), ["lo"]);
    assert_eq!(n.held(), 0);
    assert!(n.direct("plexus-macvlan", "DEL", &c).success(), "DEL succeeds and leaves the file alone");
    for traversal in ["/var/run/k8s.cni.cncf.io/devinfo/cni/../../../../../etc/shadow", "/run/k8s.cni.cncf.io/x"] {
        let c = macvlan_conf(&n, json!({"runtimeConfig": {"CNIDeviceInfoFile": traversal}}));
        assert_eq!(n.direct("plexus-macvlan", "ADD", &c).error().0, 7, "{traversal}");
    }
    // Through plexus: a NAD's own runtimeConfig never reaches the delegate, on a failing ADD
    // (rollback) nor on a succeeding one.
    n.spy("spy");
    n.nad("own-rc", &json!({"cniVersion": "1.0.0", "type": "spy", "runtimeConfig": {"CNIDeviceInfoFile": victim}}));
    assert!(n.plexus("ADD", &n.meta("own-rc")).success());
    let seen = n.spied("net1", "ADD").unwrap();
    assert!(seen.get("runtimeConfig").is_none(), "dropped: {seen}");
    assert!(n.plexus("DEL", &n.meta("own-rc")).success());
    n.macvlan_nad(
        "failing",
        "nic0",
        "198.18.42.0/24",
        json!({"mtu": 65000,
        "runtimeConfig": {"CNIDeviceInfoFile": victim}}),
    );
    assert_eq!(n.plexus("ADD", &n.meta("failing")).error().0, 7, "mtu above the parent's");
    assert_untouched(&victim);
}

// 4. IPAM data directories.

#[test]
fn an_ipam_data_dir_outside_the_data_roots_is_refused_naming_key_value_and_rule() {
    let n = Node::with_policy(json!({"dataRoots": ["/var/lib/cni/plexus-ipam"]}));
    for (key, ipam) in [
        ("dataDir", json!({"type": "plexus-ipam", "range": "198.18.43.0/24", "dataDir": n.path("ipam")})),
        (
            "store.file.dataDir",
            json!({"type": "plexus-ipam", "range": "198.18.43.0/24", "store": {"file": {"dataDir": "/etc"}}}),
        ),
    ] {
        let c = json!({"cniVersion": "1.0.0", "name": "rail0", "type": "x", "ipam": ipam});
        let (code, msg, details) = n.direct("plexus-ipam", "ADD", &c).error();
        assert_eq!(code, 7, "{msg}");
        assert!(msg.starts_with(&format!("{key} \"")), "{msg}");
        assert!(msg.contains("is not beneath the node policy's dataRoots"), "{msg}");
        let rule = format!("{msg} {details}");
        assert!(rule.contains("/var/lib/cni/plexus-ipam") && rule.contains("policy.json"), "{rule}");
        assert!(n.direct("plexus-ipam", "DEL", &c).success(), "nothing held there: DEL succeeds");
    }
    assert!(!n.path("ipam").exists(), "nothing created");
}

#[test]
fn a_planted_symlink_in_the_ipam_store_is_never_followed() {
    let n = Node::new();
    let victim_dir = n.path("victim-dir");
    std::fs::create_dir_all(&victim_dir).unwrap();
    let victim = n.victim("victim-dir/precious");
    // tmp -> a victim directory: the store would have emptied it under its lock.
    let store = n.ipam.path().join("default");
    std::fs::create_dir_all(&store).unwrap();
    std::os::unix::fs::symlink(&victim_dir, store.join("tmp")).unwrap();
    let c = macvlan_conf(&n, json!({}));
    let (code, msg, _) = n.direct("plexus-ipam", "ADD", &c).error();
    assert_eq!(code, 5);
    assert!(msg.contains("ipam/default/tmp: is a symbolic link: refused"), "{msg}");
    assert_untouched(&victim);
    // The cursor -> a victim file: replaced by rename, the victim keeps its bytes.
    std::fs::remove_file(store.join("tmp")).unwrap();
    assert!(n.direct("plexus-ipam", "ADD", &c).success());
    let cursor = std::fs::read_dir(store.join("cursors")).unwrap().next().unwrap().unwrap().path();
    std::fs::remove_file(&cursor).unwrap();
    let cursor_victim = n.victim("cursor-victim");
    std::os::unix::fs::symlink(&cursor_victim, &cursor).unwrap();
    let out = n.direct_with("plexus-ipam", "ADD", &c, |r| r.env("CNI_CONTAINERID", "c2"));
    assert!(out.success(), "{}", out.stdout);
    assert_untouched(&cursor_victim);
    assert!(!cursor.is_symlink(), "the planted link was replaced, not written through");
    // A symlinked data dir itself (a direct child of an allowed root) is refused too.
    let linked = DataDir::new("linked");
    std::os::unix::fs::symlink(&victim_dir, linked.path()).unwrap();
    let c = json!({"cniVersion": "1.0.0", "name": "rail0", "type": "x",
        "ipam": {"type": "plexus-ipam", "range": "198.18.44.0/24", "dataDir": linked}});
    let (_, msg, _) = n.direct("plexus-ipam", "ADD", &c).error();
    assert!(msg.contains("linked: is a symbolic link: refused"), "{msg}");
    assert_eq!(std::fs::read_dir(&victim_dir).unwrap().count(), 1, "nothing created in the victim dir");
}

// 5. etcd endpoints and credentials.

#[test]
fn etcd_endpoints_and_credentials_come_only_from_a_policy_profile() {
    let n = Node::new();
    // A listener the tenant would like root to connect to, with a root-only secret.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let secret = n.victim("kubelet-client.key");
    let c = json!({"cniVersion": "1.0.0", "name": "rail0", "type": "x", "ipam": {"type": "plexus-ipam",
        "range": "198.18.45.0/24", "store": {"etcd": {"endpoints": [endpoint], "username": "root",
        "passwordFile": secret, "tls": {"certFile": secret, "keyFile": secret}}}}});
    let (code, msg, _) = n.direct("plexus-ipam", "ADD", &c).error();
    assert_eq!(code, 7);
    assert!(msg.starts_with("store.etcd in a network config is refused"), "{msg}");
    assert!(listener.accept().is_err(), "no connection was made");
    let mut named = c.clone();
    named["ipam"]["store"] = json!("fabric");
    let (code, msg, _) = n.direct("plexus-ipam", "ADD", &named).error();
    assert_eq!(code, 7);
    assert!(msg.contains("store \"fabric\" is neither \"file\" nor a store profile of the node policy"), "{msg}");
}

// 7. Device IDs.

#[test]
fn a_resource_nad_without_a_kubelet_allocated_device_is_refused_and_an_annotation_device_id_reaches_only_capable_plugins()
 {
    let n = Node::new();
    n.spy("spy");
    let annotations = "  annotations:\n    k8s.v1.cni.cncf.io/resourceName: nvidia.com/hostdev\n";
    n.nad_with(
        "hostdev",
        &json!({"cniVersion": "1.0.0", "type": "spy", "capabilities": {"deviceID": true}}),
        annotations,
    );
    let checkpoint = n.path("kubelet_internal_checkpoint");
    std::fs::write(&checkpoint, r#"{"Data":{"PodDeviceEntries":[],"RegisteredDevices":{}},"Checksum":0}"#).unwrap();
    let mut meta = n.meta(r#"[{"name": "hostdev", "deviceID": "0000:3b:00.7"}]"#);
    meta["kubeletCheckpoint"] = json!(checkpoint);
    let pod =
        |r: PluginRun| r.env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;K8S_POD_UID=u1");
    let (code, msg, details) = n.plexus_with("ADD", &meta, pod).error();
    assert_eq!(code, 7);
    assert!(
        msg.contains("network-attachment-definition default/hostdev needs a device of nvidia.com/hostdev"),
        "{msg}"
    );
    assert!(details.contains("a deviceID in the annotation is not enough"), "{details}");
    assert!(n.spied("net1", "ADD").is_none());
    // Without a resourceName, the annotation's deviceID is a capability argument only.
    n.nad("plain", &json!({"cniVersion": "1.0.0", "type": "spy"}));
    n.nad("capable", &json!({"cniVersion": "1.0.0", "type": "spy", "capabilities": {"deviceID": true}}));
    let meta =
        n.meta(r#"[{"name": "plain", "deviceID": "0000:3b:00.7"}, {"name": "capable", "deviceID": "0000:3b:00.7"}]"#);
    assert!(n.plexus("ADD", &meta).success());
    let (plain, capable) = (n.spied("net1", "ADD").unwrap(), n.spied("net2", "ADD").unwrap());
    assert!(plain.get("deviceID").is_none() && plain.get("pciBusID").is_none() && plain.get("runtimeConfig").is_none());
    assert!(capable.get("deviceID").is_none(), "never a top-level key: {capable}");
    assert_eq!(capable["runtimeConfig"]["deviceID"], "0000:3b:00.7");
    assert!(n.plexus("DEL", &meta).success());
}

// 8. Allow-lists and caps.

#[test]
fn a_parent_off_the_allow_list_is_refused_node_wide_and_per_namespace() {
    let n = Node::with_policy(json!({"allow": {"parents": ["nic0"], "namespaces": {"team-b": {"parents": ["nic1"]}}}}));
    let c = macvlan_conf(&n, json!({"master": "nic1"}));
    let (code, msg, details) = n.direct("plexus-macvlan", "ADD", &c).error();
    assert_eq!((code, msg.as_str()), (7, "master \"nic1\" is not allowed by the node policy"));
    assert!(details.starts_with("allow.parents: [\"nic0\"]"), "{details}");
    assert_eq!(n.pod_links(), ["lo"]);
    assert_eq!(n.held(), 0, "IPAM never ran");
    let team_b = |r: PluginRun| r.env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-b;K8S_POD_NAME=p");
    let ok = n.direct_with("plexus-macvlan", "ADD", &c, team_b);
    assert!(ok.success(), "team-b may use nic1: {}", ok.stdout);
    assert!(n.direct_with("plexus-macvlan", "DEL", &c, team_b).success());
    let on_nic0 = macvlan_conf(&n, json!({}));
    let (code, _, details) = n.direct_with("plexus-macvlan", "ADD", &on_nic0, team_b).error();
    assert_eq!(code, 7);
    assert!(details.contains("allow.parents for namespace team-b"), "{details}");
    // Through plexus, a NAD naming it is refused the same way.
    n.macvlan_nad("rail1", "nic1", "198.18.46.0/24", json!({}));
    let (code, msg, _) = n.plexus("ADD", &n.meta("rail1")).error();
    assert_eq!(code, 7);
    assert!(msg.ends_with("master \"nic1\" is not allowed by the node policy"), "{msg}");
    assert_eq!(n.pod_links(), ["lo"]);
}

#[test]
fn more_attachments_than_the_policy_allows_are_refused_before_any_delegate_runs() {
    let n = Node::with_policy(json!({"maxAttachments": 4}));
    n.spy("spy");
    n.nad("s", &json!({"cniVersion": "1.0.0", "type": "spy"}));
    let five = ["s"; 5].join(",");
    let (code, msg, details) = n.plexus("ADD", &n.meta(&five)).error();
    assert_eq!(
        (code, msg.as_str()),
        (7, "pod (standalone): 5 attachments asked for, the node policy allows at most 4")
    );
    assert!(details.starts_with("maxAttachments"), "{details}");
    assert!(n.spied("net1", "ADD").is_none());
    // The default cap (64) stops 10,000 selections quickly, before any NAD is read.
    let d = Node::new();
    let many = vec!["nope"; 10_000].join(",");
    let started = Instant::now();
    let (code, msg, _) = d.plexus("ADD", &d.meta(&many)).error();
    assert_eq!(code, 7);
    assert!(msg.contains("10000 attachments asked for, the node policy allows at most 64"), "{msg}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    let four = ["s"; 4].join(",");
    assert!(n.plexus("ADD", &n.meta(&four)).success(), "four are fine");
    assert!(n.plexus("DEL", &n.meta(&four)).success());
}

#[test]
fn a_config_over_16_mib_on_stdin_is_code_6_unread() {
    let n = Node::new();
    let mut big = macvlan_conf(&n, json!({}));
    big["padding"] = json!("x".repeat(16 * 1024 * 1024));
    for plugin in ["plexus", "plexus-macvlan", "plexus-ipam", "plexus-host-device"] {
        let (code, msg, _) = n.direct(plugin, "ADD", &big).error();
        assert_eq!(code, 6, "{plugin}: {msg}");
        assert!(msg.contains("larger than 16777216 bytes"), "{msg}");
    }
    assert_eq!(n.pod_links(), ["lo"]);
}

#[test]
fn a_policy_file_others_can_write_is_refused_by_every_binary() {
    let n = Node::new();
    std::fs::set_permissions(&n.policy, std::fs::Permissions::from_mode(0o666)).unwrap();
    let c = macvlan_conf(&n, json!({}));
    for plugin in ["plexus-macvlan", "plexus-ipam"] {
        let (code, msg, _) = n.direct(plugin, "ADD", &c).error();
        assert_eq!(code, 7);
        assert!(msg.contains("lets others write it"), "{msg}");
    }
    assert_eq!(n.pod_links(), ["lo"]);
    // The tests' own policy is fine.
    let ours = |r: PluginRun| r.env("PLEXUS_POLICY", test_policy().to_str().unwrap());
    let ok = n.direct_with("plexus-macvlan", "ADD", &c, ours);
    assert!(ok.success(), "{}", ok.stdout);
    assert!(n.direct_with("plexus-macvlan", "DEL", &c, ours).success());
}
