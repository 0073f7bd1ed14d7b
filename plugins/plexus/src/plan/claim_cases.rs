//! The pod's DRA claims in the plan: their devices after the annotation's networks, on the
//! allocated ports, each configured as its claim says (the request helpers are the Multus cases').

use plexus_k8s::Nad;
use serde_json::json;

use super::multus_cases::{nads, request, weave};
use super::*;

/// A claim of two devices (an exclusive port with the claim's interface name and IPAM, a
/// shared port through a NAD of the claim's namespace) prepared for pod `uid`.
fn prepared(uid: &str) -> plexus_dra::claims::Prepared {
    use plexus_dra::claims::{ClaimConfig, Prepared, PreparedDevice};
    use plexus_dra::nics::Mode;
    let device = |request: &str, port: &str, mode, config| PreparedDevice {
        request: request.into(),
        pool: "node-1".into(),
        device: port.into(),
        ifname: port.into(),
        mode,
        pci_address: "0000:3b:00.0".into(),
        rdma_device: "mlx5_0".into(),
        share_id: None,
        config,
        cdi_device_ids: Vec::new(),
    };
    Prepared {
        version: 1,
        namespace: "test".into(),
        name: "nics".into(),
        uid: "11111111-2222-3333-4444-555555555555".into(),
        pods: vec![uid.into()],
        devices: vec![
            device(
                "a",
                "rail0",
                Mode::Exclusive,
                ClaimConfig {
                    interface: Some("roce0".into()),
                    mtu: Some(9000),
                    ipam: Some(json!({"type": "plexus-ipam", "range": "198.18.7.0/24"})),
                    ..Default::default()
                },
            ),
            device(
                "b",
                "rail1",
                Mode::Shared,
                ClaimConfig {
                    network: Some("shared".into()),
                    macvlan_mode: Some("private".into()),
                    ..Default::default()
                },
            ),
        ],
    }
}

#[test]
fn a_pods_prepared_claims_are_attached_after_its_annotation_on_their_ports() {
    let dir = tempfile::tempdir().unwrap();
    let store = plexus_dra::claims::Store::new(dir.path());
    store.save(&prepared("pod-uid-1")).unwrap();
    let mut n = nads();
    n.0.insert(
        ("test".into(), "shared".into()),
        Nad {
            namespace: "test".into(),
            name: "shared".into(),
            resource_name: None,
            config: r#"{"cniVersion": "1.0.0", "name": "shared", "type": "plexus-macvlan", "master": "eth9", "ipam": {"type": "static"}}"#.into(),
        },
    );
    let mut meta = weave();
    meta["draClaimsDir"] = json!(dir.path());
    let req = request(&meta, "test");
    let conf = MetaConf::load(&req).unwrap();
    let mut pod = Pod::from_request(&req);
    pod.who.uid = "pod-uid-1".into();
    let source = SelectionSource::Annotation { networks: Some("net1".into()), default_network: None };
    let out = plan(&req, &conf, &pod, &n, source, &[]).unwrap();
    let rows: Vec<(&str, &str)> = out.iter().map(|a| (a.network.as_str(), a.ifname.as_str())).collect();
    assert_eq!(
        rows,
        [("weave1", "eth0"), ("test/net1", "net1"), ("test/dra-nics-a", "roce0"), ("test/dra-nics-b", "rail1")]
    );
    let (a, b) = (&out[2], &out[3]);
    assert_eq!(a.conf["type"], "plexus-host-device");
    assert_eq!(a.conf["device"], "rail0");
    assert_eq!(a.conf["mtu"], 9000);
    assert_eq!(a.conf["ipam"]["range"], "198.18.7.0/24");
    assert_eq!(a.conf["name"], "dra-nics-a");
    assert_eq!(a.claim.as_ref().map(|c| (c.name.as_str(), c.device.as_str())), Some(("nics", "rail0")));
    assert!(a.device_info_file.is_some());
    // The NAD's config, its master replaced by the allocated port.
    assert_eq!(
        (b.conf["type"].as_str(), b.conf["master"].as_str(), b.conf["mode"].as_str()),
        (Some("plexus-macvlan"), Some("rail1"), Some("private"))
    );
    assert_eq!(b.conf["ipam"]["type"], "static");
    // Another pod gets none of them; a pod over the policy's maxAttachments with them is refused.
    let mut other = Pod::from_request(&req);
    other.who.uid = "pod-uid-2".into();
    let source = SelectionSource::Annotation { networks: None, default_network: None };
    assert_eq!(plan(&req, &conf, &other, &n, source, &[]).unwrap().len(), 1);
    let mut tight = request(&meta, "test");
    tight.policy.max_attachments = 3;
    let source = SelectionSource::Annotation { networks: Some("net1".into()), default_network: None };
    let e = plan(&tight, &conf, &pod, &n, source, &[]).unwrap_err();
    assert!(e.msg.contains("4 attachments asked for"), "{}", e.msg);
}

#[test]
fn a_claim_whose_network_runs_another_plugin_than_its_port_needs_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = prepared("pod-uid-1");
    p.devices[1].config.network = Some("net1".into());
    plexus_dra::claims::Store::new(dir.path()).save(&p).unwrap();
    let mut meta = weave();
    meta["draClaimsDir"] = json!(dir.path());
    let req = request(&meta, "test");
    let conf = MetaConf::load(&req).unwrap();
    let mut pod = Pod::from_request(&req);
    pod.who.uid = "pod-uid-1".into();
    let source = SelectionSource::Annotation { networks: None, default_network: None };
    let e = plan(&req, &conf, &pod, &nads(), source, &[]).unwrap_err();
    assert!(
        e.msg.contains("device rail1 is a shared port, attached by plexus-macvlan") && e.msg.contains("runs mynet"),
        "{}",
        e.msg
    );
}
