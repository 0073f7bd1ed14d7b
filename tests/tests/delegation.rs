//! Delegation end to end: plexus-plugin finds and runs real plugins (the Debian reference `static`
//! IPAM) and surfaces their results and errors.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use plexus_cni::{CniArgs, CniEnv, Command, SpecVersion, code};
use plexus_plugin::builtin::Runner;
use plexus_tests::{Lab, PluginRun, REFERENCE_CNI_DIR, plugin_bin};
use serde_json::{Value, json};

fn static_conf(version: &str) -> Value {
    json!({"cniVersion": version, "name": "rail0", "type": "plexus-test-plugin",
           "ipam": {"type": "static",
                    "addresses": [{"address": "198.18.0.10/24", "gateway": "198.18.0.1"},
                                  {"address": "2001:db8:0:1::10/64"}],
                    "routes": [{"dst": "198.19.0.0/16"}],
                    "dns": {"nameservers": ["198.18.0.53"]}}})
}

fn env_for(lab: &Lab, command: Command, path: Vec<PathBuf>) -> CniEnv {
    CniEnv {
        command,
        container_id: "c1".into(),
        netns: Some(lab.pod.path()),
        ifname: "net1".into(),
        args: CniArgs::default(),
        path,
        netns_override: false,
        vars: Vec::new(),
        deadline: plexus_cni::Deadline::after(std::time::Duration::from_secs(60)),
    }
}

/// In-process delegation from a thread that joined the node namespace: the child inherits it.
fn in_node<T: Send>(lab: &Lab, f: impl FnOnce() -> T + Send) -> T {
    let ns = std::fs::File::open(lab.node.path()).unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS).unwrap();
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
        .join()
        .unwrap()
    })
}

#[test]
fn the_cni_crate_runs_reference_static_and_reads_its_result_at_each_version() {
    let lab = Lab::new();
    for version in ["0.3.1", "0.4.0", "1.0.0"] {
        let env = env_for(&lab, Command::Add, vec![REFERENCE_CNI_DIR.into()]);
        let result = in_node(&lab, || Runner::default().exec("static", Command::Add, &env, &static_conf(version)))
            .unwrap_or_else(|e| panic!("{version}: {e}"))
            .expect("ADD returns a result");
        let addrs: Vec<String> = result.ips.iter().map(|i| i.address.to_string()).collect();
        assert_eq!(addrs, ["198.18.0.10/24", "2001:db8:0:1::10/64"], "{version}");
        assert_eq!(result.ips[0].gateway.unwrap().to_string(), "198.18.0.1");
        assert_eq!(result.routes[0].dst.to_string(), "198.19.0.0/16");
        assert_eq!(result.dns.nameservers, ["198.18.0.53"]);
        // And it prints back at the version that was asked for.
        let v: SpecVersion = version.parse().unwrap();
        assert_eq!(result.to_value(v).unwrap()["cniVersion"], version);
        let del = env_for(&lab, Command::Del, vec![REFERENCE_CNI_DIR.into()]);
        assert_eq!(
            in_node(&lab, || Runner::default().exec("static", Command::Del, &del, &static_conf(version))),
            Ok(None)
        );
    }
}

#[test]
fn a_plugin_delegating_to_reference_static_prints_the_result_at_the_config_version() {
    let lab = Lab::new();
    // Debian's static (libcni 1.1.2) stops at 1.0.0; 1.1.0 is covered by the conversion tests.
    for version in ["0.3.1", "0.4.0", "1.0.0"] {
        let out = PluginRun::new(plugin_bin("plexus-test-plugin"), "ADD")
            .attachment("c1", &lab.pod.path(), "net1", REFERENCE_CNI_DIR)
            .stdin(&static_conf(version))
            .in_netns(&lab.node)
            .run();
        let r = out.result();
        assert_eq!(r["cniVersion"], version);
        assert_eq!(r["interfaces"][0]["name"], "net1");
        assert_eq!(r["interfaces"][0]["sandbox"], lab.pod.path().to_str().unwrap());
        assert_eq!(r["ips"][0]["address"], "198.18.0.10/24");
        assert_eq!(r["ips"][0]["interface"], 0);
        assert_eq!(r["ips"][1]["address"], "2001:db8:0:1::10/64");
        let has_version = matches!(version, "0.3.1" | "0.4.0");
        assert_eq!(r["ips"][0].get("version").is_some(), has_version, "{version}: {r}");
    }
}

#[test]
fn a_failing_delegate_yields_its_own_code_and_message() {
    let lab = Lab::new();
    let mut conf = static_conf("1.0.0");
    conf["ipam"]["addresses"] = json!([{"address": "notacidr"}]);
    let out = PluginRun::new(plugin_bin("plexus-test-plugin"), "ADD")
        .attachment("c1", &lab.pod.path(), "net1", REFERENCE_CNI_DIR)
        .stdin(&conf)
        .in_netns(&lab.node)
        .run();
    let (code, msg, _) = out.error();
    assert_eq!(code, 999, "static's own code");
    assert_eq!(msg, "the 'address' field is expected to be in CIDR notation, got: 'notacidr'");
    // CHECK without prevResult: static refuses, and that too comes through unchanged.
    let out = PluginRun::new(plugin_bin("plexus-test-plugin"), "CHECK")
        .attachment("c1", &lab.pod.path(), "net1", REFERENCE_CNI_DIR)
        .stdin(&static_conf("1.0.0"))
        .in_netns(&lab.node)
        .run();
    assert_eq!(out.error(), (999, "Required prevResult missing".to_string(), String::new()));
}

#[test]
fn a_missing_delegate_is_a_clear_error_naming_the_plugin_and_cni_path() {
    let lab = Lab::new();
    let empty = tempfile::tempdir().unwrap();
    let path = format!("{}:/nonexistent", empty.path().display());
    let out = PluginRun::new(plugin_bin("plexus-test-plugin"), "ADD")
        .attachment("c1", &lab.pod.path(), "net1", &path)
        .stdin(&static_conf("1.0.0"))
        .in_netns(&lab.node)
        .run();
    let (code, msg, _) = out.error();
    assert_eq!(code, u64::from(code::DELEGATE_NOT_FOUND));
    assert_eq!(msg, format!("failed to find plugin \"static\" in path [{} /nonexistent]", empty.path().display()));
}

#[test]
fn a_delegate_that_fails_without_a_cni_error_is_reported_with_its_output() {
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("broken-ipam");
    std::fs::write(&script, "#!/bin/sh\necho 'segfault-ish trouble' >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let garbage = dir.path().join("garbage-ipam");
    std::fs::write(&garbage, "#!/bin/sh\necho 'not json'\n").unwrap();
    std::fs::set_permissions(&garbage, std::fs::Permissions::from_mode(0o755)).unwrap();

    let run = |ipam: &str| {
        let mut conf = static_conf("1.0.0");
        conf["ipam"]["type"] = ipam.into();
        PluginRun::new(plugin_bin("plexus-test-plugin"), "ADD")
            .attachment("c1", &lab.pod.path(), "net1", dir.path().to_str().unwrap())
            .stdin(&conf)
            .in_netns(&lab.node)
            .run()
    };
    let (code, msg, details) = run("broken-ipam").error();
    assert_eq!(code, u64::from(code::DELEGATE_FAILED));
    assert_eq!(msg, "plugin \"broken-ipam\" failed (exit status 3) without a CNI error");
    assert_eq!(details, "segfault-ish trouble");
    let (code, msg, details) = run("garbage-ipam").error();
    assert_eq!(code, u64::from(code::DELEGATE_FAILED));
    assert!(msg.starts_with("plugin \"garbage-ipam\" returned an unreadable result"), "{msg}");
    assert_eq!(details, "not json");
}

#[test]
fn delegates_receive_the_cni_environment_and_the_config_unchanged() {
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("seen");
    let spy = dir.path().join("spy-ipam");
    std::fs::write(
        &spy,
        format!(
            "#!/bin/sh\nenv | grep ^CNI_ | sort > {rec}.env\ncat > {rec}.stdin\necho '{{\"cniVersion\":\"1.0.0\",\"ips\":[{{\"address\":\"198.18.0.77/24\"}}]}}'\n",
            rec = record.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&spy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut conf = static_conf("1.0.0");
    conf["ipam"] = json!({"type": "spy-ipam", "range": "198.18.0.0/24", "unknownKey": {"kept": [1, 2]}});
    conf["somethingElse"] = json!("kept");
    let out = PluginRun::new(plugin_bin("plexus-test-plugin"), "ADD")
        .attachment("c1", &lab.pod.path(), "net1", dir.path().to_str().unwrap())
        .env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=p1")
        .stdin(&conf)
        .in_netns(&lab.node)
        .run();
    assert_eq!(out.result()["ips"][0]["address"], "198.18.0.77/24");
    let env = std::fs::read_to_string(format!("{}.env", record.display())).unwrap();
    let expect = format!(
        "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAME=p1\nCNI_COMMAND=ADD\nCNI_CONTAINERID=c1\nCNI_IFNAME=net1\nCNI_NETNS={}\nCNI_PATH={}\n",
        lab.pod.path().display(),
        dir.path().display()
    );
    assert_eq!(env, expect);
    let seen: Value = serde_json::from_slice(&std::fs::read(format!("{}.stdin", record.display())).unwrap()).unwrap();
    assert_eq!(seen, conf, "the delegate gets the whole config, unknown keys included");
}
