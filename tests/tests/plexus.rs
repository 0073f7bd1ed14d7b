//! The plexus meta-plugin, standalone (NADs from a directory, the selection from `networks`), in
//! real namespaces with real delegates: plexus-macvlan + plexus-ipam, and a conflist chaining the
//! reference `tuning`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use plexus_tests::{DataDir, Lab, Outcome, PluginRun, REFERENCE_CNI_DIR, plugin_bin};
use serde_json::{Value, json};

struct Standalone {
    lab: Lab,
    dir: tempfile::TempDir,
    ipam: DataDir,
}

fn bin_dir() -> PathBuf {
    plugin_bin("plexus").parent().unwrap().to_path_buf()
}

impl Standalone {
    fn new() -> Standalone {
        let lab = Lab::new();
        lab.add_nic("nic0", 9000);
        lab.add_nic("nic1", 9000);
        let s = Standalone { lab, dir: tempfile::tempdir().unwrap(), ipam: DataDir::new("ipam") };
        std::fs::create_dir_all(s.nads()).unwrap();
        s.nad(
            "rail0",
            "default",
            json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
            "ipam": {"type": "plexus-ipam", "range": "198.18.20.0/24", "dataDir": s.ipam_dir()}}),
        );
        s.nad(
            "rail1",
            "default",
            json!({"cniVersion": "1.0.0", "name": "rail1-chain", "plugins": [
            {"type": "plexus-macvlan", "master": "nic1",
             "ipam": {"type": "plexus-ipam", "range": "198.18.21.0/24", "dataDir": s.ipam_dir()}},
            {"type": "tuning", "promisc": true}]}),
        );
        s
    }

    fn nads(&self) -> PathBuf {
        self.dir.path().join("nads")
    }

    fn ipam_dir(&self) -> String {
        self.ipam.path().display().to_string()
    }

    fn cache_dir(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    fn nad(&self, name: &str, ns: &str, config: Value) {
        let yaml = format!(
            "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  config: '{}'\n",
            config
        );
        std::fs::write(self.nads().join(format!("{ns}-{name}.yaml")), yaml).unwrap();
    }

    fn conf(&self, networks: &str) -> Value {
        json!({"cniVersion": "1.1.0", "name": "plexus", "type": "plexus", "nadDir": self.nads(),
               "networks": networks, "cniDir": self.cache_dir(), "binDir": bin_dir()})
    }

    fn run(&self, verb: &str, c: &Value) -> Outcome {
        PluginRun::new(plugin_bin("plexus"), verb)
            .attachment("pod1", &self.lab.pod.path(), "eth0", &format!("{}:{REFERENCE_CNI_DIR}", bin_dir().display()))
            .stdin(c)
            .in_netns(&self.lab.node)
            .run()
    }

    fn held_addresses(&self) -> usize {
        std::fs::read_dir(Path::new(&self.ipam_dir()).join("default/ips")).map(|d| d.count()).unwrap_or(0)
    }

    fn pod_links(&self) -> Vec<String> {
        self.lab.pod.links().into_iter().map(|l| l.ifname).collect()
    }
}

#[test]
fn two_networks_one_a_conflist_attach_as_net1_and_net2_and_del_removes_everything() {
    let s = Standalone::new();
    let c = s.conf("rail0,rail1");
    let r = s.run("ADD", &c).result();
    assert_eq!(r["cniVersion"], "1.1.0");
    let names: Vec<&str> = r["interfaces"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["net1", "net2"], "no cluster network: the result lists every attachment");
    assert_eq!(r["ips"][0]["address"], "198.18.20.1/24");
    assert_eq!(r["ips"][1]["address"], "198.18.21.1/24");
    assert_eq!(r["ips"][1]["interface"], 1);
    assert_eq!(s.lab.pod.addrs("net1")[0].cidr(), "198.18.20.1/24");
    assert_eq!(s.lab.pod.addrs("net2")[0].cidr(), "198.18.21.1/24");
    let net2 = s.lab.pod.link("net2").unwrap();
    assert!(net2.flags.iter().any(|f| f == "PROMISC"), "the chained tuning ran: {:?}", net2.flags);
    // The cache: written before the delegates, private.
    let cache = s.cache_dir().join("pod1");
    let meta = std::fs::metadata(&cache).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(s.cache_dir()).unwrap().permissions().mode() & 0o777, 0o700);
    // Its head: every attachment; then one record per delegate result.
    let bytes = std::fs::read(&cache).unwrap();
    let values: Vec<Value> = serde_json::Deserializer::from_slice(&bytes).into_iter().map(Result::unwrap).collect();
    let cached = &values[0];
    assert_eq!(cached["attachments"][1]["network"], "default/rail1");
    assert_eq!(values.len(), 3, "the head and two results");
    // The two delegates ran at once: their records are in the order they finished.
    let rail1 = values[1..].iter().find(|v| v["attachment"] == 1).expect("a record for attachment 1");
    assert_eq!(rail1["result"]["ips"][0]["address"], "198.18.21.1/24");
    assert_eq!(cached["attachments"][1]["conf"]["plugins"][1]["type"], "tuning", "the conflist is kept whole");

    let check = s.run("CHECK", &c);
    assert!(check.success(), "{}", check.stdout);
    assert!(s.run("DEL", &c).success());
    assert_eq!(s.pod_links(), ["lo"]);
    assert_eq!(s.held_addresses(), 0);
    assert!(!cache.exists());
    assert!(s.run("DEL", &c).success(), "DEL again");
}

#[test]
fn a_failing_second_delegate_rolls_back_the_first_and_names_the_network() {
    let s = Standalone::new();
    s.nad(
        "broken",
        "default",
        json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nope0",
        "ipam": {"type": "plexus-ipam", "range": "198.18.22.0/24", "dataDir": s.ipam_dir()}}),
    );
    let (code, msg, _) = s.run("ADD", &s.conf("rail0,broken")).error();
    assert_eq!(code, 7, "the delegate's code");
    assert!(msg.contains("adding network default/broken (net2)"), "{msg}");
    assert!(msg.ends_with("master interface \"nope0\" not found"), "the delegate's message: {msg}");
    assert_eq!(s.pod_links(), ["lo"], "net1 rolled back");
    assert_eq!(s.held_addresses(), 0, "its address released");
    assert!(!s.cache_dir().join("pod1").exists(), "no cache survives a failed ADD");
}

#[test]
fn del_works_from_the_cache_without_it_with_it_corrupt_and_with_nothing() {
    let s = Standalone::new();
    let c = s.conf("rail0");
    // Cache removed: the attachments are rebuilt from the selection.
    assert!(s.run("ADD", &c).success());
    std::fs::remove_file(s.cache_dir().join("pod1")).unwrap();
    assert!(s.run("DEL", &c).success());
    assert_eq!((s.pod_links(), s.held_addresses()), (vec!["lo".to_string()], 0));
    // Cache corrupt: rebuilt too, not skipped (Multus #1087).
    assert!(s.run("ADD", &c).success());
    std::fs::write(s.cache_dir().join("pod1"), "{not json").unwrap();
    assert!(s.run("DEL", &c).success());
    assert_eq!((s.pod_links(), s.held_addresses()), (vec!["lo".to_string()], 0));
    assert!(!s.cache_dir().join("pod1").exists());
    // Neither cache nor NADs: log and succeed.
    let mut bare = c.clone();
    bare["nadDir"] = json!(s.dir.path().join("no-such-dir"));
    assert!(s.run("DEL", &bare).success());
}

#[test]
fn a_cache_of_a_later_plexus_fails_del_naming_it_and_nothing_is_released_until_it_can_be_read() {
    let s = Standalone::new();
    let c = s.conf("rail0");
    assert!(s.run("ADD", &c).success());
    let cache = s.cache_dir().join("pod1");
    let ours = std::fs::read_to_string(&cache).unwrap();
    // What a downgrade finds: the cache of a later plexus, its format's version raised.
    let later = ours.replacen("\"version\": 1,", "\"version\": 2,", 1);
    assert_ne!(later, ours);
    std::fs::write(&cache, &later).unwrap();
    let (code, msg, _) = s.run("DEL", &c).error();
    assert_eq!(code, 105, "{msg}");
    assert!(
        msg.starts_with(&format!("{}: the meta-plugin's delegate cache of format version 2", cache.display())),
        "{msg}"
    );
    assert!(s.pod_links().contains(&"net1".to_string()), "nothing torn down from a guess");
    assert_eq!(s.held_addresses(), 1, "nothing released");
    assert_eq!(std::fs::read_to_string(&cache).unwrap(), later, "the cache is left as it is");
    let (code, _, _) = s.run("CHECK", &c).error();
    assert_eq!(code, 105);
    // Read by a build that knows its format (here: as this build wrote it), DEL releases everything.
    std::fs::write(&cache, &ours).unwrap();
    assert!(s.run("DEL", &c).success());
    assert_eq!((s.pod_links(), s.held_addresses()), (vec!["lo".to_string()], 0));
}

#[test]
fn explicit_interface_names_do_not_renumber_the_rest_and_check_sees_every_attachment() {
    let s = Standalone::new();
    let c = s.conf("rail0@roce0,rail1");
    let r = s.run("ADD", &c).result();
    assert_eq!(r["interfaces"][0]["name"], "roce0");
    assert_eq!(r["interfaces"][1]["name"], "net2");
    s.lab.pod.ip(&["link", "set", "net2", "mtu", "1500"]);
    let (code, msg, _) = s.run("CHECK", &c).error();
    assert_eq!(code, 104);
    assert!(msg.contains("network default/rail1") && msg.contains("net2 has MTU 1500, expected 9000"), "{msg}");
}

#[test]
fn selection_errors_and_missing_nads_are_clear() {
    let s = Standalone::new();
    let (code, msg, _) = s.run("ADD", &s.conf("rail0,ml/missing")).error();
    assert_eq!((code, msg.as_str()), (7, "cannot find a network-attachment-definition (missing) in namespace (ml)"));
    let (code, msg, _) = s.run("ADD", &s.conf("Bad_Name")).error();
    assert_eq!(code, 7);
    assert!(msg.starts_with("invalid network selection \"Bad_Name\""), "{msg}");
    assert_eq!(s.pod_links(), ["lo"]);
    let mut isolated = s.conf("ml/rail9");
    isolated["namespaceIsolation"] = json!(true);
    s.nad("rail9", "ml", json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0"}));
    let (code, msg, _) = s.run("ADD", &isolated).error();
    assert_eq!(code, 7);
    assert!(
        msg.starts_with("namespace isolation: pod default/ may not use network-attachment-definition ml/rail9"),
        "{msg}"
    );
}

#[test]
fn resource_nads_get_the_pods_sorted_device_ids_from_the_kubelet_checkpoint_when_pod_resources_is_absent() {
    let s = Standalone::new();
    let spy_dir = tempfile::tempdir().unwrap();
    let spy = spy_dir.path().join("spy-hostdev");
    std::fs::write(
        &spy,
        format!(
            "#!/bin/sh\ncat > {d}/$CNI_IFNAME.$CNI_COMMAND.json\n[ \"$CNI_COMMAND\" = ADD ] && echo '{{\"cniVersion\":\"1.0.0\",\"interfaces\":[{{\"name\":\"'$CNI_IFNAME'\",\"sandbox\":\"'$CNI_NETNS'\"}}]}}'\nexit 0\n",
            d = spy_dir.path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&spy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nad = "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: hostdev\n  namespace: default\n  annotations:\n    k8s.v1.cni.cncf.io/resourceName: nvidia.com/hostdev\nspec:\n  config: '{\"cniVersion\":\"1.0.0\",\"type\":\"spy-hostdev\",\"capabilities\":{\"deviceID\":true,\"CNIDeviceInfoFile\":true}}'\n";
    std::fs::write(s.nads().join("hostdev.yaml"), nad).unwrap();
    let checkpoint = s.dir.path().join("kubelet_internal_checkpoint");
    std::fs::write(
        &checkpoint,
        r#"{"Data":{"PodDeviceEntries":[{"PodUID":"uid-1","ContainerName":"c","ResourceName":"nvidia.com/hostdev",
            "DeviceIDs":{"0":["0000:3b:00.3","0000:3b:00.2"]},"AllocResp":""}],"RegisteredDevices":{}},"Checksum":0}"#,
    )
    .unwrap();
    let mut c = s.conf("hostdev,hostdev");
    c["kubeletCheckpoint"] = json!(checkpoint);
    // No kubelet here: its pod-resources socket is absent, and plexus falls back to the checkpoint.
    let socket = s.dir.path().join("pod-resources/kubelet.sock");
    c["podResourcesSocket"] = json!(socket);
    assert!(!socket.exists());
    let path = format!("{}:{}", spy_dir.path().display(), bin_dir().display());
    let out = PluginRun::new(plugin_bin("plexus"), "ADD")
        .attachment("pod1", &s.lab.pod.path(), "eth0", &path)
        .env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=trainer-0;K8S_POD_UID=uid-1")
        .stdin(&c)
        .in_netns(&s.lab.node)
        .run();
    assert!(out.success(), "{}", out.stdout);
    let seen = |ifname: &str| -> Value {
        serde_json::from_slice(&std::fs::read(spy_dir.path().join(format!("{ifname}.ADD.json"))).unwrap()).unwrap()
    };
    let (a, b) = (seen("net1"), seen("net2"));
    assert_eq!((a["deviceID"].as_str(), a["pciBusID"].as_str()), (Some("0000:3b:00.2"), Some("0000:3b:00.2")));
    assert_eq!(b["deviceID"], "0000:3b:00.3", "one device per attachment, in sorted order");
    assert_eq!(a["runtimeConfig"]["deviceID"], "0000:3b:00.2");
    assert_eq!(
        a["runtimeConfig"]["CNIDeviceInfoFile"],
        "/var/run/k8s.cni.cncf.io/devinfo/cni/default-hostdev-pod1_net1"
    );
}

#[test]
fn status_and_gc_reach_every_delegate_network() {
    let s = Standalone::new();
    s.nad(
        "r11",
        "default",
        json!({"cniVersion": "1.1.0", "type": "plexus-macvlan", "master": "nic0",
        "ipam": {"type": "plexus-ipam", "range": "198.18.23.0/24", "dataDir": s.ipam_dir(), "nodeName": "n1"}}),
    );
    s.nad("gone", "default", json!({"cniVersion": "1.1.0", "type": "plexus-macvlan", "master": "gone0"}));
    let status = |networks: &str| {
        PluginRun::new(plugin_bin("plexus"), "STATUS")
            .env("CNI_PATH", &format!("{}:{REFERENCE_CNI_DIR}", bin_dir().display()))
            .stdin(&s.conf(networks))
            .in_netns(&s.lab.node)
            .run()
    };
    assert!(status("r11").success());
    let (code, msg, _) = status("r11,gone").error();
    assert_eq!((code, msg.as_str()), (50, "network default/gone: master interface \"gone0\" not found"));
    // GC: the runtime no longer knows pod1, so its attachment is deleted and its address freed.
    let c = s.conf("r11");
    assert!(s.run("ADD", &c).success());
    assert_eq!(s.held_addresses(), 1);
    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "other", "ifname": "eth0"}]);
    let out = PluginRun::new(plugin_bin("plexus"), "GC")
        .env("CNI_PATH", &format!("{}:{REFERENCE_CNI_DIR}", bin_dir().display()))
        .stdin(&gc)
        .in_netns(&s.lab.node)
        .run();
    assert!(out.success(), "{}", out.stdout);
    assert_eq!(s.pod_links(), ["lo"]);
    assert_eq!(s.held_addresses(), 0);
    assert!(!s.cache_dir().join("pod1").exists());
}

// Multus's checks before any delegate runs, and its default-route.

#[test]
fn a_cni_netns_that_does_not_exist_is_refused_before_any_delegate_runs() {
    let s = Standalone::new();
    let out = PluginRun::new(plugin_bin("plexus"), "ADD")
        .attachment("pod1", Path::new("/var/run/netns/plexus-no-such-ns"), "eth0", &bin_dir().display().to_string())
        .stdin(&s.conf("rail0"))
        .in_netns(&s.lab.node)
        .run();
    let (code, msg, _) = out.error();
    assert_eq!(code, 8);
    assert!(msg.starts_with("CNI_NETNS \"/var/run/netns/plexus-no-such-ns\""), "{msg}");
    assert_eq!(s.held_addresses(), 0, "no delegate ran");
    assert!(!s.cache_dir().join("pod1").exists());
}

#[test]
fn an_interface_name_the_pod_already_has_is_refused_before_any_delegate_runs() {
    let s = Standalone::new();
    s.lab.pod.ip(&["link", "add", "net2", "type", "veth", "peer", "name", "other"]);
    let (code, msg, _) = s.run("ADD", &s.conf("rail0,rail1")).error();
    assert_eq!(
        (code, msg.as_str()),
        (103, "network default/rail1: interface \"net2\" already exists in the container")
    );
    assert!(s.lab.pod.link("net1").is_none(), "rail0 never ran");
    assert_eq!(s.held_addresses(), 0);
    assert!(s.lab.pod.link("net2").is_some(), "the pod's own link is untouched");
}

#[test]
fn default_route_moves_the_pods_default_route_to_the_attachment_that_names_a_gateway() {
    let s = Standalone::new();
    // gw0 installs a default route through net1, as its IPAM says.
    s.nad(
        "gw0",
        "default",
        json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
        "ipam": {"type": "plexus-ipam", "range": "198.18.24.0/24", "gateway": "198.18.24.254",
                 "routes": [{"dst": "0.0.0.0/0"}], "dataDir": s.ipam_dir()}}),
    );
    let defaults = || -> Vec<(Option<String>, Option<String>)> {
        s.lab.pod.routes().into_iter().filter(|r| r.dst == "default").map(|r| (r.gateway, r.dev)).collect()
    };
    // Without default-route, Multus leaves routes alone: gw0's default route stays.
    assert!(s.run("ADD", &s.conf("gw0,rail1")).success());
    assert_eq!(defaults(), [(Some("198.18.24.254".into()), Some("net1".into()))]);
    assert!(s.run("DEL", &s.conf("gw0,rail1")).success());
    // With it, the default route goes through rail1's gateway, and the results say so.
    let c = s.conf(r#"[{"name":"gw0"},{"name":"rail1","default-route":["198.18.21.254"]}]"#);
    let r = s.run("ADD", &c).result();
    assert_eq!(defaults(), [(Some("198.18.21.254".into()), Some("net2".into()))]);
    let routes = r["routes"].as_array().unwrap();
    assert_eq!(routes.as_slice(), [json!({"dst": "0.0.0.0/0", "gw": "198.18.21.254"})], "{r}");
    // The cache holds the changed results (CHECK and DEL read them).
    let bytes = std::fs::read(s.cache_dir().join("pod1")).unwrap();
    let records: Vec<Value> = serde_json::Deserializer::from_slice(&bytes).into_iter().map(Result::unwrap).collect();
    let last_of = |i: u64| records.iter().rev().find(|v| v["attachment"] == i).unwrap()["result"].clone();
    assert_eq!(last_of(0)["routes"], json!(null), "gw0's default route is gone from its result: {}", last_of(0));
    assert_eq!(last_of(1)["routes"], json!([{"dst": "0.0.0.0/0", "gw": "198.18.21.254"}]));
    assert!(s.run("CHECK", &c).success());
    assert!(s.run("DEL", &c).success());
    assert_eq!(s.pod_links(), ["lo"]);
    // An empty list still manages default routes: none is left.
    let c = s.conf(r#"[{"name":"gw0","default-route":[]}]"#);
    assert!(s.run("ADD", &c).success());
    assert!(defaults().is_empty());
    assert!(s.run("DEL", &c).success());
}

#[test]
fn two_default_route_gateways_of_one_family_are_refused_before_any_delegate_runs() {
    let s = Standalone::new();
    let c = s.conf(
        r#"[{"name":"rail0","default-route":["198.18.20.254"]},{"name":"rail1","default-route":["198.18.21.254"]}]"#,
    );
    let (code, msg, _) = s.run("ADD", &c).error();
    assert_eq!(code, 7);
    assert!(msg.contains("2 IPv4 gateways across the selection (198.18.20.254, 198.18.21.254)"), "{msg}");
    assert_eq!(s.pod_links(), ["lo"]);
    assert_eq!(s.held_addresses(), 0);
}

#[test]
fn ips_and_mac_requests_also_reach_the_delegate_as_cni_args_as_multus_passes_them() {
    let s = Standalone::new();
    let spy_dir = tempfile::tempdir().unwrap();
    let spy = spy_dir.path().join("spy-args");
    std::fs::write(
        &spy,
        format!(
            "#!/bin/sh\necho \"$CNI_ARGS\" > {d}/$CNI_IFNAME.$CNI_COMMAND.args\n[ \"$CNI_COMMAND\" = ADD ] && echo '{{\"cniVersion\":\"1.0.0\"}}'\nexit 0\n",
            d = spy_dir.path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&spy, std::fs::Permissions::from_mode(0o755)).unwrap();
    s.nad("spied", "default", json!({"cniVersion": "1.0.0", "type": "spy-args"}));
    let c = s.conf(r#"[{"name":"spied","ips":["198.18.25.7/24"],"mac":"02:00:00:00:00:07"},{"name":"spied"}]"#);
    let path = format!("{}:{}", spy_dir.path().display(), bin_dir().display());
    let run = |verb: &str| {
        PluginRun::new(plugin_bin("plexus"), verb)
            .attachment("pod1", &s.lab.pod.path(), "eth0", &path)
            .stdin(&c)
            .in_netns(&s.lab.node)
            .run()
    };
    assert!(run("ADD").success());
    let args = |f: &str| std::fs::read_to_string(spy_dir.path().join(f)).unwrap().trim().to_string();
    assert_eq!(args("net1.ADD.args"), "IgnoreUnknown=true;IP=198.18.25.7/24;MAC=02:00:00:00:00:07");
    assert_eq!(args("net2.ADD.args"), "", "nothing asked, nothing added");
    assert!(run("DEL").success());
    assert_eq!(
        args("net1.DEL.args"),
        "IgnoreUnknown=true;IP=198.18.25.7/24;MAC=02:00:00:00:00:07",
        "DEL from the cache too"
    );
}

#[test]
fn del_removes_the_cache_temp_files_a_killed_plexus_left_and_succeeds_on_a_read_only_cache_dir() {
    let s = Standalone::new();
    let c = s.conf("rail0");
    assert!(s.run("ADD", &c).success());
    // A plexus killed while it replaced the cache leaves `.<containerID>.tmp<tid>`.
    let leftover = s.cache_dir().join(".pod1.tmp4242");
    let other = s.cache_dir().join(".pod2.tmp4242");
    std::fs::write(&leftover, b"{").unwrap();
    std::fs::write(&other, b"{").unwrap();
    assert!(s.run("DEL", &c).success());
    assert!(!leftover.exists(), "DEL removes its container's leftovers");
    assert!(other.exists(), "and only those");
    assert_eq!(s.held_addresses(), 0);
    // A read-only cache directory holding nothing for the container: DEL still succeeds.
    std::fs::remove_file(&other).unwrap();
    let _ro = plexus_tests::Mount::read_only(&s.cache_dir());
    let out = s.run("DEL", &c);
    assert!(out.success(), "{}", out.stdout);
}

/// A delegate that shows how plexus ran it, in `dir/log`: each ADD or DEL logs `begin <verb>
/// <ifname>`, and on a `netN` interface waits (up to 5 s) until `peers` ADDs (DELs) have begun —
/// they can only all have begun if they run at once — then logs `end <verb> <ifname> <begun>`;
/// `overlap <verb> <ifname>` when another was running as it began, `prevResult <verb> <ifname>`
/// when its config carried one. When all `peers` began at once, net1 ends only after the others
/// have (waiting up to 5 s), whatever the machine's load: results must keep annotation order, not
/// the order of completion. Its ADD result is the address 198.18.22.N/24 (9 for eth0); a config
/// with `"fail": true` fails it with code 11.
struct Probe {
    dir: tempfile::TempDir,
}

impl Probe {
    fn new(peers: usize) -> Probe {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let script = format!(
            r#"#!/bin/sh
d={d}
conf=$(cat)
case "$CNI_COMMAND" in ADD|DEL) ;; *) exit 0 ;; esac
case "$CNI_IFNAME" in eth0) n=9 ;; *) n=${{CNI_IFNAME#net}} ;; esac
mkdir "$d/running" 2>/dev/null && own=1 || echo "overlap $CNI_COMMAND $CNI_IFNAME" >>"$d/log"
echo "begin $CNI_COMMAND $CNI_IFNAME" >>"$d/log"
touch "$d/begun-$CNI_COMMAND-$CNI_IFNAME"
begun() {{ ls "$d" | grep -c "^begun-$CNI_COMMAND-net"; }}
i=0
case "$CNI_IFNAME" in net*) while [ "$(begun)" -lt {peers} ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done ;; esac
ended() {{ ls "$d" | grep -c "^ended-$CNI_COMMAND-net"; }}
i=0
if [ "$n" = 1 ] && [ "$(begun)" -ge {peers} ]; then
  while [ "$(ended)" -lt $(({peers} - 1)) ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
fi
echo "end $CNI_COMMAND $CNI_IFNAME $(begun)" >>"$d/log"
touch "$d/ended-$CNI_COMMAND-$CNI_IFNAME"
case "$conf" in *'"prevResult"'*) echo "prevResult $CNI_COMMAND $CNI_IFNAME" >>"$d/log" ;; esac
[ -z "$own" ] || rmdir "$d/running"
[ "$CNI_COMMAND" = ADD ] || exit 0
case "$conf" in *'"fail":true'*) echo '{{"cniVersion":"1.0.0","code":11,"msg":"probe failed as asked"}}'; exit 1 ;; esac
printf '{{"cniVersion":"1.0.0","interfaces":[{{"name":"%s","sandbox":"%s"}}],"ips":[{{"address":"198.18.22.%s/24","interface":0}}]}}' "$CNI_IFNAME" "$CNI_NETNS" "$n"
"#
        );
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        let bin = dir.path().join("bin/probe");
        std::fs::write(&bin, script).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        Probe { dir }
    }

    /// Every line logged.
    fn all(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
        text.lines().map(str::to_string).collect()
    }

    /// The begin/end/overlap lines: how the ADDs and DELs ran.
    fn log(&self) -> Vec<String> {
        self.all().into_iter().filter(|l| !l.starts_with("prevResult")).collect()
    }

    /// A meta config running the probe networks named (`p1`, `p2`, ... in `s`'s NAD dir).
    fn conf(&self, s: &Standalone, networks: &str, fail: &[&str]) -> Value {
        // The cluster network's NAD lives in multusNamespace (kube-system), as with Multus.
        for (n, ns) in networks.split(',').map(|n| (n, "default")).chain([("cluster", "kube-system")]) {
            let mut conf = json!({"cniVersion": "1.0.0", "name": n, "type": "probe"});
            if fail.contains(&n) {
                conf["fail"] = json!(true);
            }
            s.nad(n, ns, conf);
        }
        let mut c = s.conf(networks);
        c["binDir"] = json!(self.dir.path().join("bin"));
        c
    }

    fn lines(&self, prefix: &str) -> Vec<String> {
        self.all().into_iter().filter(|l| l.starts_with(prefix)).collect()
    }
}

#[test]
fn a_pods_attachments_are_added_and_deleted_at_once_and_results_keep_annotation_order() {
    let s = Standalone::new();
    let probe = Probe::new(4);
    let c = probe.conf(&s, "p1,p2,p3,p4", &[]);
    let r = s.run("ADD", &c).result();
    // Every ADD saw all four begun before it ended: they ran at once.
    let mut ends = probe.lines("end ADD");
    ends.sort();
    assert_eq!(ends, ["end ADD net1 4", "end ADD net2 4", "end ADD net3 4", "end ADD net4 4"], "{:?}", probe.log());
    // net1 finished last, yet the result and the cache keep annotation order.
    assert_eq!(probe.lines("end ADD").last().map(String::as_str), Some("end ADD net1 4"));
    let names: Vec<&str> = r["interfaces"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["net1", "net2", "net3", "net4"]);
    let ips: Vec<(&str, u64)> = r["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["address"].as_str().unwrap(), i["interface"].as_u64().unwrap()))
        .collect();
    assert_eq!(ips, [("198.18.22.1/24", 0), ("198.18.22.2/24", 1), ("198.18.22.3/24", 2), ("198.18.22.4/24", 3)]);
    let bytes = std::fs::read(s.cache_dir().join("pod1")).unwrap();
    let mut records: Vec<(u64, String)> = serde_json::Deserializer::from_slice(&bytes)
        .into_iter::<Value>()
        .skip(1)
        .map(|v| {
            let v = v.unwrap();
            (v["attachment"].as_u64().unwrap(), v["result"]["ips"][0]["address"].as_str().unwrap().to_string())
        })
        .collect();
    records.sort();
    assert_eq!(records.len(), 4, "one whole record per attachment: {records:?}");
    assert!(records.iter().enumerate().all(|(i, (a, ip))| *a == i as u64 && *ip == format!("198.18.22.{}/24", i + 1)));
    // DEL: all four at once too.
    assert!(s.run("DEL", &c).success());
    let mut ends = probe.lines("end DEL");
    ends.sort();
    assert_eq!(ends, ["end DEL net1 4", "end DEL net2 4", "end DEL net3 4", "end DEL net4 4"], "{:?}", probe.log());
    assert_eq!(probe.lines("prevResult DEL").len(), 4, "each DEL gets its cached result: {:?}", probe.all());
    assert!(!s.cache_dir().join("pod1").exists());
}

#[test]
fn the_cluster_network_is_added_before_the_other_attachments_and_deleted_after_them() {
    let s = Standalone::new();
    let probe = Probe::new(2);
    let mut c = probe.conf(&s, "p1,p2", &[]);
    c["clusterNetwork"] = json!("cluster");
    let r = s.run("ADD", &c).result();
    assert_eq!(r["ips"][0]["address"], "198.18.22.9/24", "the runtime gets the cluster network's result");
    let log = probe.log();
    assert_eq!(log[..2], ["begin ADD eth0", "end ADD eth0 0"], "{log:?}");
    assert_eq!(probe.lines("end ADD net").len(), 2, "{log:?}");
    assert!(probe.lines("end ADD net").iter().all(|l| l.ends_with(" 2")), "net1 and net2 at once: {log:?}");
    assert!(s.run("DEL", &c).success());
    let log = probe.log();
    assert_eq!(log[log.len() - 2..], ["begin DEL eth0", "end DEL eth0 2"], "{log:?}");
}

#[test]
fn parallel_false_runs_the_attachments_one_after_another_in_annotation_order() {
    let s = Standalone::new();
    let probe = Probe::new(1);
    let mut c = probe.conf(&s, "p1,p2,p3", &[]);
    c["parallel"] = json!(false);
    s.run("ADD", &c).result();
    assert!(s.run("DEL", &c).success());
    assert_eq!(
        probe.log(),
        [
            "begin ADD net1",
            "end ADD net1 1",
            "begin ADD net2",
            "end ADD net2 2",
            "begin ADD net3",
            "end ADD net3 3",
            "begin DEL net3",
            "end DEL net3 1",
            "begin DEL net2",
            "end DEL net2 2",
            "begin DEL net1",
            "end DEL net1 3"
        ],
        "never two at once, DEL in reverse"
    );
}

#[test]
fn a_failure_among_concurrent_attachments_rolls_back_all_of_them_and_names_the_first_in_order() {
    let s = Standalone::new();
    let probe = Probe::new(4);
    let c = probe.conf(&s, "p1,p2,p3,p4", &["p2", "p4"]);
    let (code, msg, _) = s.run("ADD", &c).error();
    assert_eq!(code, 11, "the delegate's code: {msg}");
    assert!(msg.contains("adding network default/p2 (net2)"), "the first failure in annotation order: {msg}");
    assert!(msg.ends_with("probe failed as asked"), "{msg}");
    // Every attachment was sent its ADD, so every one gets its DEL (the failed ones too), all at
    // once as they were added.
    let mut dels = probe.lines("end DEL");
    dels.sort();
    assert_eq!(dels, ["end DEL net1 4", "end DEL net2 4", "end DEL net3 4", "end DEL net4 4"], "{:?}", probe.log());
    // Those that succeeded are deleted with their results, the failed ones without.
    let mut prev = probe.lines("prevResult DEL");
    prev.sort();
    assert_eq!(prev, ["prevResult DEL net1", "prevResult DEL net3"], "{:?}", probe.log());
    assert!(!s.cache_dir().join("pod1").exists(), "no cache survives a failed ADD");
}
