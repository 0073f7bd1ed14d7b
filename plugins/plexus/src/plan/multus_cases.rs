//! Multus's own test cases (v4.3: pkg/k8sclient, pkg/types conf, pkg/multus), restated as tables
//! and run against plexus's plan: which delegates a pod gets, in which order, with which
//! interface names — or the error, naming what is wrong.

use std::collections::BTreeMap;

use plexus_cni::{CniEnv, NetConf, SpecVersion};
use plexus_k8s::Nad;
use plexus_node::Policy;
use plexus_plugin::Request;
use serde_json::{Value, json};

use super::*;

pub(super) struct Nads(pub(super) BTreeMap<(String, String), Nad>);

impl NadSource for Nads {
    fn nad(&self, namespace: &str, name: &str) -> Result<Nad, K8sError> {
        self.0
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| K8sError::NadNotFound { namespace: namespace.into(), name: name.into() })
    }
}

/// test/net1 (mynet), test/net2 (mynet2), test/net3 (mynet3), other-ns/net3,
/// kube-system/myCRD1 (mynet), kube-system/myCRD2 (mynet2), kube-system/net1, kube-system/net2.
pub(super) fn nads() -> Nads {
    let mut m = BTreeMap::new();
    let mut add = |ns: &str, name: &str, config: &str| {
        let nad = Nad { namespace: ns.into(), name: name.into(), resource_name: None, config: config.into() };
        m.insert((ns.to_string(), name.to_string()), nad);
    };
    add("test", "net1", r#"{"name": "net1", "type": "mynet", "cniVersion": "1.0.0"}"#);
    add("test", "net2", r#"{"name": "net2", "type": "mynet2", "cniVersion": "1.0.0"}"#);
    add("test", "net3", r#"{"name": "net3", "type": "mynet3", "cniVersion": "1.0.0"}"#);
    add("test", "minimal", r#"{"type": "mynet"}"#);
    add("test", "fromfile", "");
    add("other-ns", "net3", r#"{"name": "net3", "type": "mynet3", "cniVersion": "1.0.0"}"#);
    add("kube-system", "myCRD1", r#"{"type": "mynet", "cniVersion": "1.0.0"}"#);
    add("kube-system", "myCRD2", r#"{"type": "mynet2", "cniVersion": "1.0.0"}"#);
    add("kube-system", "net1", r#"{"type": "mynet1", "cniVersion": "1.0.0"}"#);
    add("kube-system", "net2", r#"{"type": "mynet2", "cniVersion": "1.0.0"}"#);
    Nads(m)
}

pub(super) fn request(meta: &Value, pod_ns: &str) -> Request {
    let stdin = serde_json::to_vec(meta).unwrap();
    let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={pod_ns};K8S_POD_NAME=testpod");
    let env = CniEnv::from_lookup(
        |k| {
            Some(match k {
                "CNI_COMMAND" => "ADD".into(),
                "CNI_CONTAINERID" => "123456789".into(),
                "CNI_NETNS" => "/var/run/netns/pod".into(),
                "CNI_IFNAME" => "eth0".into(),
                "CNI_PATH" => "/opt/cni/bin".into(),
                "CNI_ARGS" => args.clone(),
                _ => return None,
            })
        },
        std::time::Duration::from_secs(60),
    )
    .unwrap();
    let config = NetConf::parse(&stdin).unwrap();
    Request {
        env,
        version: SpecVersion::LATEST,
        config,
        stdin,
        policy: Policy::default(),
        log: Default::default(),
        runner: Default::default(),
        delegated: false,
    }
}

/// (delegate name, plugin type, ifname, cluster network) of each attachment, or the error message.
fn planned(
    meta: Value,
    pod_ns: &str,
    networks: Option<&str>,
    default_network: Option<&str>,
) -> Result<Vec<(String, String, String, bool)>, String> {
    let req = request(&meta, pod_ns);
    let conf = MetaConf::load(&req).map_err(|e| e.to_string())?;
    let pod = Pod::from_request(&req);
    let source = SelectionSource::Annotation {
        networks: networks.map(String::from),
        default_network: default_network.map(String::from),
    };
    let out = plan(&req, &conf, &pod, &nads(), source, &[]).map_err(|e| e.to_string())?;
    Ok(out
        .into_iter()
        .map(|a| {
            let t = a.conf.get("type").and_then(Value::as_str).unwrap_or("list").to_string();
            (a.network, t, a.ifname, a.cluster_network)
        })
        .collect())
}

fn row(network: &str, t: &str, ifname: &str, cluster_network: bool) -> (String, String, String, bool) {
    (network.into(), t.into(), ifname.into(), cluster_network)
}

pub(super) fn weave() -> Value {
    json!({"name": "node-cni-network", "type": "plexus", "cniVersion": "1.0.0",
           "delegates": [{"name": "weave1", "cniVersion": "1.0.0", "type": "weave-net"}]})
}

#[test]
fn k8sclient_annotation_cases_give_the_same_delegates() {
    // comma form, two networks (net3 exists but is not used)
    assert_eq!(
        planned(weave(), "test", Some("net1,net2"), None).unwrap(),
        [
            row("weave1", "weave-net", "eth0", true),
            row("test/net1", "mynet", "net1", false),
            row("test/net2", "mynet2", "net2", false)
        ]
    );
    // JSON form: unknown keys (ipRequest, macRequest) are ignored; a namespace is honoured
    let json = r#"[{"name":"net1"},{"name":"net2","ipRequest":"1.2.3.4","macRequest":"aa:bb:cc:dd:ee:ff"},{"name":"net3","namespace":"other-ns"}]"#;
    let got = planned(weave(), "test", Some(json), None).unwrap();
    assert_eq!(got[3], row("other-ns/net3", "mynet3", "net3", false));
    // a missing NAD stops the ADD, naming it
    let e = planned(weave(), "test", Some("net1,nope"), None).unwrap_err();
    assert!(e.contains("cannot find a network-attachment-definition (nope) in namespace (test)"), "{e}");
    // invalid JSON
    let e = planned(weave(), "test", Some("[adsfasdfasdfasf]"), None).unwrap_err();
    assert!(e.contains("invalid network selection JSON"), "{e}");
    // a default-route on an extra interface with one IPv4 gateway in all is fine
    let json = r#"[{"name":"net1"},{"name":"net2","default-route":["192.168.2.2"]}]"#;
    assert!(planned(weave(), "test", Some(json), None).is_ok());
    // the NAD's name fills a missing CNI "name"
    let got = planned(weave(), "test", Some("minimal"), None).unwrap();
    assert_eq!(got[1].0, "test/minimal");
    // explicit interface names do not renumber the rest
    let got = planned(weave(), "test", Some("net1@foo,net2"), None).unwrap();
    assert_eq!((got[1].2.as_str(), got[2].2.as_str()), ("foo", "net2"));
    // spaces are trimmed
    let got = planned(weave(), "test", Some("test / net1 @ my_interface"), None).unwrap();
    assert_eq!(got[1], row("test/net1", "mynet", "my_interface", false));
    // the same NAD twice is two attachments
    assert_eq!(planned(weave(), "test", Some("net1,net1"), None).unwrap().len(), 3);
}

#[test]
fn k8sclient_cluster_and_default_network_cases() {
    let cluster =
        json!({"name": "node-cni-network", "type": "plexus", "cniVersion": "1.0.0", "clusterNetwork": "myCRD1"});
    // clusterNetwork from a NAD in multusNamespace
    assert_eq!(planned(cluster.clone(), "test", None, None).unwrap(), [row("myCRD1", "mynet", "eth0", true)]);
    // defaultNetworks appended, except in system namespaces
    let mut with_default = cluster.clone();
    with_default["defaultNetworks"] = json!(["myCRD2"]);
    assert_eq!(
        planned(with_default.clone(), "test", None, None).unwrap(),
        [row("myCRD1", "mynet", "eth0", true), row("myCRD2", "mynet2", "net1", false)]
    );
    assert_eq!(planned(with_default, "kube-system", None, None).unwrap(), [row("myCRD1", "mynet", "eth0", true)]);
    // not found anywhere
    let mut missing = cluster.clone();
    missing["clusterNetwork"] = json!("nosuch");
    let e = planned(missing, "test", None, None).unwrap_err();
    assert!(e.contains("network \"nosuch\": no network-attachment-definition in kube-system"), "{e}");
    // the default-network annotation replaces the cluster network (resolved in multusNamespace)
    let mut cn2 = cluster.clone();
    cn2["clusterNetwork"] = json!("net2");
    assert_eq!(planned(cn2, "test", None, Some("net1")).unwrap(), [row("kube-system/net1", "mynet1", "eth0", true)]);
    // ... and the first inline delegate
    let delegates = json!({"name": "m", "type": "plexus", "cniVersion": "1.0.0",
                           "delegates": [{"type": "mynet2", "name": "net2", "cniVersion": "1.0.0"}]});
    assert_eq!(
        planned(delegates, "test", None, Some("net1")).unwrap(),
        [row("kube-system/net1", "mynet1", "eth0", true)]
    );
    // clusterNetwork and delegates: the delegates are ignored (Multus)
    let mut both = cluster.clone();
    both["delegates"] = json!([{"type": "weave-net", "name": "weave1", "cniVersion": "1.0.0"}]);
    assert_eq!(planned(both, "test", None, None).unwrap(), [row("myCRD1", "mynet", "eth0", true)]);
}

#[test]
fn k8sclient_cluster_network_from_conf_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("10-net1.conf"), r#"{"cniVersion":"0.3.1","name":"myFile1","type":"mynet"}"#)
        .unwrap();
    let meta = |cn: String| json!({"name": "m", "type": "plexus", "cniVersion": "1.0.0", "clusterNetwork": cn, "confDir": dir.path()});
    // by CNI name in confDir (no NAD of that name)
    assert_eq!(planned(meta("myFile1".into()), "test", None, None).unwrap()[0], row("myFile1", "mynet", "eth0", true));
    // a directory: its first conf
    assert_eq!(
        planned(meta(dir.path().display().to_string()), "test", None, None).unwrap()[0],
        row("myFile1", "mynet", "eth0", true)
    );
    // a file path
    assert_eq!(
        planned(meta(dir.path().join("10-net1.conf").display().to_string()), "test", None, None).unwrap()[0],
        row("myFile1", "mynet", "eth0", true)
    );
    // a NAD without spec.config takes the conf of its name from confDir
    std::fs::write(dir.path().join("20-ff.conf"), r#"{"cniVersion":"1.0.0","name":"fromfile","type":"filenet"}"#)
        .unwrap();
    let mut m = weave();
    m["confDir"] = json!(dir.path());
    assert_eq!(planned(m, "test", Some("fromfile"), None).unwrap()[1], row("test/fromfile", "filenet", "net1", false));
}

#[test]
fn namespace_isolation_cases() {
    let mut iso = weave();
    iso["namespaceIsolation"] = json!(true);
    let e = planned(iso.clone(), "test", Some("kube-system/net1"), None).unwrap_err();
    assert!(
        e.contains("namespace isolation: pod test/testpod may not use network-attachment-definition kube-system/net1"),
        "{e}"
    );
    iso["globalNamespaces"] = json!("kube-system,donkey-kong");
    assert!(planned(iso.clone(), "test", Some("kube-system/net1"), None).is_ok());
    // globalNamespaces replaces the default list: "default" is no longer global
    let e = planned(iso.clone(), "test", Some("default/net1"), None).unwrap_err();
    assert!(e.contains("namespace isolation"), "{e}");
    assert!(planned(iso.clone(), "test", Some("net1"), None).is_ok(), "its own namespace is always fine");
    // The default-network annotation too (Multus does not check it): another tenant's NAD is
    // refused, the admin's namespace is fine.
    let e = planned(iso.clone(), "test", None, Some("other-ns/net3")).unwrap_err();
    assert!(e.contains("as its default network"), "{e}");
    assert!(planned(iso, "test", None, Some("net1")).is_ok());
}

#[test]
fn default_route_ecmp_is_refused() {
    let json = r#"[{"name":"net1","default-route":["10.1.1.1"]},{"name":"net2","default-route":["10.1.1.2"]}]"#;
    let e = planned(weave(), "test", Some(json), None).unwrap_err();
    assert!(e.contains("ECMP is not supported"), "{e}");
    let dual = r#"[{"name":"net1","default-route":["10.1.1.1"]},{"name":"net2","default-route":["fc00::1"]}]"#;
    assert!(planned(weave(), "test", Some(dual), None).is_ok(), "one gateway per family");
}

#[test]
fn cni_args_from_the_annotation_win_over_the_config() {
    let mut n = nads();
    n.0.insert(
        ("test".into(), "args".into()),
        Nad {
            namespace: "test".into(),
            name: "args".into(),
            resource_name: None,
            config: r#"{"type":"bridge","cniVersion":"1.0.0","args":{"cni":{"args0":"val0","args1":"val1"}}}"#.into(),
        },
    );
    let req = request(&weave(), "test");
    let conf = MetaConf::load(&req).unwrap();
    let source = SelectionSource::Annotation {
        networks: Some(r#"[{"name":"args","cni-args":{"args1":"val1a"}}]"#.into()),
        default_network: None,
    };
    let out = plan(&req, &conf, &Pod::from_request(&req), &n, source, &[]).unwrap();
    assert_eq!(out[1].conf["args"]["cni"], json!({"args0": "val0", "args1": "val1a"}));
}
