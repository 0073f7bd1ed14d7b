//! Every file in conf-examples/ is checked: NADs and conflists parse the way plexus parses them
//! (their IPAM sections too), the 4-rail example is applied end to end, and the deployment
//! manifests pass a schema check (kubectl needs an API server for any validation; none is
//! obtainable here, so the checks below are the ones that matter for these objects).

use std::path::{Path, PathBuf};

use plexus_cni::{ConfList, NetConf};
use plexus_ipam_core::IpamConfig;
use plexus_k8s::nad::{DirSource, Nad, NadSource, is_conflist};
use plexus_node::Policy;
use plexus_tests::{Lab, PluginRun, REFERENCE_CNI_DIR, plugin_bin};
use serde_json::{Value, json};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf-examples")
}

fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The example node policy (its store profile backs the etcd example).
fn example_policy() -> Policy {
    Policy::from_file(&examples().join("policy.json")).unwrap_or_else(|e| panic!("policy.json: {e}"))
}

/// A delegate config as plexus runs it: a conflist, or a single conf (with the NAD's name).
fn check_cni_config(what: &str, conf: &Value) {
    let bytes = serde_json::to_vec(conf).unwrap();
    let list = if is_conflist(conf) { ConfList::parse(&bytes) } else { ConfList::from_single(&bytes) }
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    list.version().unwrap_or_else(|e| panic!("{what}: {e}"));
    for p in &list.plugins {
        let mut p = p.clone();
        p.insert("name".into(), list.name.clone().into());
        let nc: NetConf = serde_json::from_value(Value::Object(p.clone())).unwrap();
        if nc.ipam_type() == Some("plexus-ipam") {
            IpamConfig::from_netconf(&nc, &example_policy()).unwrap_or_else(|e| panic!("{what}: ipam: {e}"));
        }
    }
}

#[test]
fn every_nad_and_conflist_example_parses_as_plexus_reads_it() {
    let mut nads = 0;
    let mut files = vec![];
    for dir in [examples(), examples().join("four-rail")] {
        for e in std::fs::read_dir(&dir).unwrap() {
            files.push(e.unwrap().path());
        }
    }
    for f in files.iter().filter(|f| f.is_file()) {
        let name = f.display().to_string();
        match f.extension().and_then(|e| e.to_str()) {
            Some("yaml") => {
                for doc in yaml_docs(f) {
                    if doc["kind"] == "NetworkAttachmentDefinition" {
                        let nad = Nad::from_object(&doc).unwrap();
                        check_cni_config(&name, &nad.cni_config(Path::new("/nonexistent")).unwrap());
                        nads += 1;
                    }
                }
            }
            Some("conflist") => {
                let v: Value = serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
                check_cni_config(&name, &v);
            }
            _ => {}
        }
    }
    assert!(nads >= 8, "NAD examples: {nads}");
    let hostdev = DirSource::load(&examples(), 1 << 20).unwrap().nad("default", "roce-hostdev").unwrap();
    assert_eq!(hostdev.resource_name.as_deref(), Some("nvidia.com/hostdev"));
    let meta: Value = serde_json::from_slice(&std::fs::read(examples().join("00-plexus.conflist")).unwrap()).unwrap();
    assert_eq!(meta["plugins"][0]["type"], "plexus");
}

#[test]
fn the_four_rail_example_attaches_four_rails_in_one_subnet() {
    let lab = Lab::new();
    for i in 1..=4 {
        lab.add_nic(&format!("ens{i}f0np0"), 9000);
    }
    // The example NADs as they are, with the IPAM store moved into a temp dir.
    let dir = tempfile::tempdir().unwrap();
    let dir_ipam = plexus_tests::DataDir::new("ipam");
    let nads = dir.path().join("nads");
    std::fs::create_dir_all(&nads).unwrap();
    for i in 0..4 {
        let text = std::fs::read_to_string(examples().join(format!("four-rail/rail{i}.yaml"))).unwrap();
        let moved = text.replace(
            "\"network_name\": \"rails\"",
            &format!("\"network_name\": \"rails\", \"dataDir\": \"{}\"", dir_ipam.path().display()),
        );
        assert_ne!(moved, text);
        std::fs::write(nads.join(format!("rail{i}.yaml")), moved).unwrap();
    }
    let pod: Value = yaml_docs(&examples().join("four-rail/pod.yaml")).remove(0);
    let selection = pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"].as_str().unwrap().to_string();
    let bin = plugin_bin("plexus").parent().unwrap().to_path_buf();
    let conf = json!({"cniVersion": "1.0.0", "name": "plexus", "type": "plexus", "nadDir": nads,
        "networks": selection, "cniDir": dir.path().join("cache"), "binDir": bin});
    let run = |verb: &str| {
        PluginRun::new(plugin_bin("plexus"), verb)
            .attachment("trainer0", &lab.pod.path(), "eth0", &format!("{}:{REFERENCE_CNI_DIR}", bin.display()))
            .stdin(&conf)
            .in_netns(&lab.node)
            .run()
    };
    let r = run("ADD").result();
    assert_eq!(r["interfaces"].as_array().unwrap().len(), 4);
    for (i, dev) in ["net1", "net2", "net3", "net4"].iter().enumerate() {
        let addr = lab.pod.addrs(dev)[0].local.clone();
        assert!(addr.starts_with("198.18.104."), "{dev}: {addr}");
        let via = lab.pod.ip(&["route", "get", "198.18.104.200", "from", &addr]);
        assert!(via.contains(&format!("dev {dev} ")), "rail {i}: {via}");
    }
    assert!(run("DEL").success());
    assert_eq!(lab.pod.links().len(), 1);
}

#[test]
fn the_ipam_store_rbac_is_a_namespaced_role_with_only_what_the_kubernetes_store_does() {
    let objs = yaml_docs(&examples().join("deploy/rbac-ipam-kubernetes.yaml"));
    let kinds: Vec<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["Role", "RoleBinding"]);
    assert_eq!(objs[0]["metadata"]["namespace"], "kube-system");
    assert_eq!(
        objs[0]["rules"],
        json!([{"apiGroups": ["whereabouts.cni.cncf.io"], "resources": ["ippools"], "verbs": ["get", "list", "create", "patch"]},
               {"apiGroups": ["whereabouts.cni.cncf.io"], "resources": ["overlappingrangeipreservations"],
                "verbs": ["get", "create", "patch", "delete"]},
               {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
               {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["whereabouts"],
                "verbs": ["get", "update"]}])
    );
    assert_eq!(objs[1]["roleRef"]["name"], "plexus-ipam");
    assert_eq!(objs[1]["subjects"][0], json!({"kind": "ServiceAccount", "name": "plexus", "namespace": "kube-system"}));
}

fn deploy() -> PathBuf {
    examples().join("deploy")
}

/// The plain manifests of `mode` (thin or daemon), CRD first, as `kubectl apply -k` reads them.
fn manifests(mode: &str) -> Vec<Value> {
    let mut all = yaml_docs(&deploy().join("crd/crd.yaml"));
    all.extend(yaml_docs(&deploy().join(mode).join("plexus.yaml")));
    all
}

fn of_kind<'a>(objs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objs.iter().filter(|o| o["kind"] == kind).collect()
}

fn workspace_version() -> String {
    let cargo = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml")).unwrap();
    let section = cargo.split("[workspace.package]").nth(1).unwrap();
    let line = section.lines().find(|l| l.starts_with("version = ")).unwrap();
    line.trim_start_matches("version = ").trim_matches('"').to_string()
}

fn helm() -> PathBuf {
    let out = std::process::Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/peers.sh"))
        .output()
        .unwrap();
    assert!(out.status.success(), "scripts/peers.sh: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("helm")
}

#[test]
fn deployment_manifests_are_well_formed_kubernetes_objects_with_least_rights() {
    for mode in ["thin", "daemon"] {
        let objs = manifests(mode);
        for o in &objs {
            for key in ["apiVersion", "kind"] {
                assert!(o[key].as_str().is_some_and(|s| !s.is_empty()), "{key} missing in {o}");
            }
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            assert!(!name.is_empty() && name.len() <= 253, "metadata.name in {}", o["kind"]);
        }
        let kinds: Vec<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "CustomResourceDefinition",
                "ServiceAccount",
                "ConfigMap",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
                "DaemonSet"
            ],
            "{mode}"
        );
        // The CRD names what plexus GETs.
        let crd = &objs[0];
        assert_eq!(crd["metadata"]["name"], "network-attachment-definitions.k8s.cni.cncf.io");
        assert_eq!(crd["spec"]["group"], "k8s.cni.cncf.io");
        assert_eq!(crd["spec"]["names"]["plural"], "network-attachment-definitions");
        assert_eq!(crd["spec"]["versions"][0]["name"], "v1");
        let sa = of_kind(&objs, "ServiceAccount")[0];
        // RBAC: exactly get+patch on pods and get on NADs for the shim, list+watch of both for the
        // daemon's caches, create of events (about pods); the binding names the service account.
        let role = of_kind(&objs, "ClusterRole")[0];
        assert_eq!(
            role["rules"],
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch", "list", "watch"]},
                    {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["network-attachment-definitions"],
                     "verbs": ["get", "list", "watch"]},
                    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}])
        );
        let binding = of_kind(&objs, "ClusterRoleBinding")[0];
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
        assert_eq!(binding["subjects"][0]["name"], sa["metadata"]["name"]);
        assert_eq!(binding["subjects"][0]["namespace"], sa["metadata"]["namespace"]);
        // The installer's own (`plexusctl install`): get (is my DaemonSet gone?) and delete (the chart's uninstall hook)
        // of its DaemonSet by name, nothing else.
        let ds = of_kind(&objs, "DaemonSet")[0];
        let install_role = of_kind(&objs, "Role")[0];
        assert_eq!(
            install_role["rules"],
            json!([{"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": [ds["metadata"]["name"]],
                    "verbs": ["get", "delete"]}])
        );
        assert_eq!(of_kind(&objs, "RoleBinding")[0]["subjects"][0]["name"], sa["metadata"]["name"]);
        // DaemonSet: selector matches the template, the service account exists, every mount has a
        // volume, the image is the workspace's version with no shell: `plexusctl install` runs.
        assert_eq!(ds["apiVersion"], "apps/v1");
        assert_eq!(ds["spec"]["selector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"]);
        let spec = &ds["spec"]["template"]["spec"];
        assert_eq!(spec["serviceAccountName"], sa["metadata"]["name"]);
        let volumes: Vec<&str> =
            spec["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
        let c = &spec["containers"][0];
        assert_eq!(c["image"], format!("localhost/plexus:{}", workspace_version()));
        assert!(c["command"].is_null(), "the image's entrypoint (`plexusctl install`), no shell");
        assert_eq!(c["args"][0], "run");
        let args: Vec<&str> = c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert!(args.contains(&"--uninstall-when-removed=plexus"), "{args:?}");
        assert!(args.contains(&"--meta-config=/etc/plexus/00-plexus.conflist"), "{args:?}");
        for m in c["volumeMounts"].as_array().unwrap() {
            assert!(volumes.contains(&m["name"].as_str().unwrap()), "mount {m} has no volume");
        }
        assert_eq!(spec["volumes"][1], json!({"name": "host", "hostPath": {"path": "/", "type": "Directory"}}));
        let env: Vec<&str> = c["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(env[..3], ["NODE_NAME", "CNI_BIN_DIR", "CNI_CONF_DIR"]);
        // The meta config the ConfigMap carries: a conflist plexus reads, naming the kubeconfig
        // `plexusctl install` writes.
        let cm = of_kind(&objs, "ConfigMap")[0];
        let meta: Value = serde_json::from_str(cm["data"]["00-plexus.conflist"].as_str().unwrap()).unwrap();
        check_cni_config(&format!("{mode} meta config"), &meta);
        assert_eq!(meta["plugins"][0]["type"], "plexus");
        assert_eq!(meta["plugins"][0]["kubeconfig"], "/etc/cni/net.d/plexus.d/plexus.kubeconfig");
        assert_eq!(meta["plugins"][0]["daemonSocket"].is_string(), mode == "daemon");
        let text = std::fs::read_to_string(deploy().join(mode).join("plexus.yaml")).unwrap();
        assert!(!text.contains("/bin/sh") && !text.contains("busybox"), "no shell anywhere");
    }
}

#[test]
fn the_daemon_mode_daemonset_runs_plexus_daemon_in_the_hosts_root_with_probes_and_limits() {
    let objs = manifests("daemon");
    let ds = of_kind(&objs, "DaemonSet")[0];
    let thin = manifests("thin");
    assert_eq!(
        ds["metadata"],
        of_kind(&thin, "DaemonSet")[0]["metadata"],
        "the same DaemonSet name: one mode or the other"
    );
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(spec["hostPID"], true, "after the chroot /proc is the host's: its PIDs must be the daemon's");
    let c = &spec["containers"][0];
    // The host's root, propagated (network namespaces appear after the daemon starts).
    assert!(
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "host", "mountPath": "/host", "mountPropagation": "HostToContainer"}))
    );
    let env: Vec<&str> = c["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(env, ["NODE_NAME", "CNI_BIN_DIR", "CNI_CONF_DIR", "DAEMON_SOCKET", "STATUS_JOURNAL"]);
    // The journal on the host's /run: kept across daemon restarts, gone with the node's sandboxes.
    assert_eq!(c["env"][4]["value"], "/run/plexus/network-status");
    assert_eq!(c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    let daemon = args.iter().position(|a| *a == "--").expect("the daemon after --");
    assert_eq!(args[daemon + 1], "/plexus/bin/plexus-daemon");
    for needed in [
        "--host-root=/host",
        "--kubeconfig=$(CNI_CONF_DIR)/plexus.d/plexus.kubeconfig",
        "--node-name=$(NODE_NAME)",
        "--socket=$(DAEMON_SOCKET)",
        "--status-journal=$(STATUS_JOURNAL)",
        "--metrics-address=127.0.0.1:9134",
        "--shutdown-grace=30",
    ] {
        assert!(args[daemon..].contains(&needed), "{needed:?} not in {args:?}");
    }
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(c[probe]["httpGet"], json!({"host": "127.0.0.1", "port": 9134, "path": path}), "{probe}");
    }
    assert_eq!(c["resources"]["limits"]["memory"], "256Mi");
    assert!(c["resources"]["requests"]["memory"].as_str().is_some_and(|m| m.ends_with("Mi")));
    // Its grace outlasts the daemon's own (--shutdown-grace=30): requests taken finish.
    assert!(spec["terminationGracePeriodSeconds"].as_u64().unwrap() > 30);
}

#[test]
fn the_plain_manifests_are_the_charts_rendering_and_the_chart_lints_in_every_mode() {
    let helm = helm();
    let fresh = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/render-manifests.sh"))
        .arg(fresh.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for f in [
        "crd/crd.yaml",
        "crd/kustomization.yaml",
        "thin/plexus.yaml",
        "thin/kustomization.yaml",
        "daemon/plexus.yaml",
        "daemon/kustomization.yaml",
        "rbac-ipam-kubernetes.yaml",
        "rbac-ipam-pools.yaml",
    ] {
        assert_eq!(
            std::fs::read_to_string(fresh.path().join(f)).unwrap(),
            std::fs::read_to_string(deploy().join(f)).unwrap(),
            "conf-examples/deploy/{f} is not what the chart renders: run scripts/render-manifests.sh"
        );
    }
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/plexus");
    let chart_yaml: Value = yaml_docs(&chart.join("Chart.yaml")).remove(0);
    assert_eq!(chart_yaml["version"], workspace_version());
    assert_eq!(chart_yaml["appVersion"], workspace_version());
    for values in [
        &["--set", "mode=thin"][..],
        &["--set", "mode=daemon", "--set", "ipamKubernetesStore.enabled=true", "--set", "dashboard.enabled=true"],
        &["--set", "uninstallFromNodes=false", "--set-json", r#"policy={"maxAttachments": 4}"#],
        &[
            "--set",
            "mode=daemon",
            "--set",
            "dra.enabled=true",
            "--set",
            "dra.sharedPorts={ens1f0np0,ens2f0np0}",
            "--set-json",
            r#"env=[{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]"#,
        ],
    ] {
        let lint =
            std::process::Command::new(&helm).args(["lint", "--strict"]).arg(&chart).args(values).output().unwrap();
        assert!(lint.status.success(), "helm lint {values:?}: {}", String::from_utf8_lossy(&lint.stdout));
    }
    let bad = std::process::Command::new(&helm)
        .args(["template", "plexus"])
        .arg(&chart)
        .args(["--set", "mode=thick"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("mode \"thick\": thin or daemon"));
    let thin_dra = std::process::Command::new(&helm)
        .args(["template", "plexus"])
        .arg(&chart)
        .args(["--set", "dra.enabled=true"])
        .output()
        .unwrap();
    assert!(!thin_dra.status.success());
    assert!(String::from_utf8_lossy(&thin_dra.stderr).contains("the DRA driver runs in plexus-daemon"));
}

#[test]
fn the_dra_examples_are_device_classes_of_plexus_and_a_claim_whose_config_plexus_reads() {
    let classes = yaml_docs(&examples().join("dra/deviceclasses.yaml"));
    assert_eq!(classes.len(), 2);
    for c in &classes {
        assert_eq!((c["apiVersion"].as_str(), c["kind"].as_str()), (Some("resource.k8s.io/v1"), Some("DeviceClass")));
        let cel = c["spec"]["selectors"][0]["cel"]["expression"].as_str().unwrap();
        assert!(cel.contains(r#"device.driver == "plexus.dev""#), "{cel}");
    }
    let template = yaml_docs(&examples().join("dra/claim-template.yaml")).remove(0);
    let devices = &template["spec"]["spec"]["devices"];
    assert_eq!(devices["constraints"][0]["matchAttribute"], "resource.kubernetes.io/pcieRoot");
    let opaque = &devices["config"][0]["opaque"];
    assert_eq!(opaque["driver"], plexus_dra::DRIVER);
    let config: plexus_dra::claims::ClaimConfig = serde_json::from_value(opaque["parameters"].clone()).unwrap();
    assert_eq!(config.mtu, Some(9000));
    let pod = yaml_docs(&examples().join("dra/pod.yaml")).remove(0);
    assert_eq!(pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"], template["metadata"]["name"]);
}
