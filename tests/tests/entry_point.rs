//! The plugin entry point as a process, side by side with the Debian reference `static` plugin
//! (built on libcni 1.1.2's skel): the same bad input yields the same code and message.
//!
//! Deliberate differences, also listed in README.md: plexus puts `cniVersion` in its errors (the
//! spec's error format; libcni 1.1.2 leaves it out), knows 1.1.0 with GC and STATUS (libcni 1.1.2
//! answers `unknown CNI_COMMAND: GC`), and checks CNI_NETNS against its own netns before ADD.

use plexus_tests::{Lab, PluginRun, plugin_bin, reference_plugin, write_policy};
use serde_json::{Value, json};

const OURS: &str = "plexus-test-plugin";

fn conf(version: &str) -> Value {
    json!({"cniVersion": version, "name": "rail0", "type": "x",
           "ipam": {"type": "static", "addresses": [{"address": "198.18.0.10/24"}]}})
}

/// Run plexus and the reference with the same input; both must fail with the same code and msg.
fn same_error(lab: &Lab, setup: impl Fn(PluginRun) -> PluginRun) -> (u64, String, String) {
    let ours = setup(PluginRun::new(plugin_bin(OURS), "ADD")).in_netns(&lab.node).run();
    let theirs = setup(PluginRun::new(reference_plugin("static"), "ADD")).in_netns(&lab.node).run();
    let (oc, om, od) = ours.error();
    let (tc, tm, td) = theirs.error();
    assert_eq!((oc, &om), (tc, &tm), "plexus vs reference\nours: {}\ntheirs: {}", ours.stdout, theirs.stdout);
    assert_eq!(ours.status, Some(1));
    assert_eq!(theirs.status, Some(1));
    // Details may differ where plexus knows more (1.1.0 in the supported list); each test checks
    // the details it cares about.
    let _ = td;
    (oc, om, od)
}

fn attach(lab: &Lab) -> impl Fn(PluginRun) -> PluginRun + '_ {
    move |r: PluginRun| r.attachment("c1", &lab.pod.path(), "net1", "/usr/lib/cni")
}

#[test]
fn unknown_cni_version_is_code_1_like_the_reference() {
    let lab = Lab::new();
    for v in ["9.9.9", "0.5.0", "1.0"] {
        let mut c = conf(v);
        c["cniVersion"] = v.into();
        let (code, msg, details) = same_error(&lab, |r| attach(&lab)(r).stdin(&c));
        assert_eq!(code, 1);
        assert_eq!(msg, "incompatible CNI versions");
        assert!(details.starts_with(&format!("config is \"{v}\", plugin supports [")), "{details}");
        assert!(details.ends_with("\"1.0.0\" \"1.1.0\"]"), "{details}");
    }
}

#[test]
fn bad_json_is_code_6_like_the_reference() {
    // The parser's own words differ (Go vs serde); the code and the message's lead are the same.
    let lab = Lab::new();
    for runner in [plugin_bin(OURS), reference_plugin("static")] {
        let out = attach(&lab)(PluginRun::new(runner, "ADD")).stdin_raw(b"{\"cniVersion\": ").in_netns(&lab.node).run();
        let (code, msg, _) = out.error();
        assert_eq!(code, 6);
        assert!(msg.starts_with("error unmarshall network config: "), "{msg}");
    }
}

#[test]
fn missing_environment_is_code_4_listing_the_variables() {
    let lab = Lab::new();
    let (code, msg, _) = same_error(&lab, |r| r.stdin(&conf("1.0.0")));
    assert_eq!(code, 4);
    assert_eq!(msg, "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing");
    let (_, msg, _) = same_error(&lab, |r| attach(&lab)(r).unset("CNI_PATH").stdin(&conf("1.0.0")));
    assert_eq!(msg, "required env variables [CNI_PATH] missing");
}

#[test]
fn invalid_interface_names_are_code_4_like_the_reference() {
    let lab = Lab::new();
    for bad in ["abcdefghijklmnop", ".", "..", "a/b", "net:1", "net 1"] {
        let (code, msg, _) = same_error(&lab, |r| attach(&lab)(r).env("CNI_IFNAME", bad).stdin(&conf("1.0.0")));
        assert_eq!(code, 4, "{bad:?}: {msg}");
    }
}

#[test]
fn invalid_container_id_and_network_name_match_the_reference() {
    let lab = Lab::new();
    let (code, msg, details) =
        same_error(&lab, |r| attach(&lab)(r).env("CNI_CONTAINERID", "../etc").stdin(&conf("1.0.0")));
    assert_eq!((code, msg.as_str(), details.as_str()), (4, "invalid characters in containerID", "../etc"));
    let mut c = conf("1.0.0");
    c["name"] = "rail 0".into();
    let (code, msg, _) = same_error(&lab, |r| attach(&lab)(r).stdin(&c));
    assert_eq!((code, msg.as_str()), (7, "invalid characters found in network name"));
    c.as_object_mut().unwrap().remove("name");
    let (code, msg, _) = same_error(&lab, |r| attach(&lab)(r).stdin(&c));
    assert_eq!((code, msg.as_str()), (7, "missing network name"));
}

#[test]
fn check_below_0_4_0_is_refused_with_code_1_like_the_reference() {
    let lab = Lab::new();
    for runner in [plugin_bin(OURS), reference_plugin("static")] {
        let out = attach(&lab)(PluginRun::new(runner, "CHECK")).stdin(&conf("0.3.1")).in_netns(&lab.node).run();
        let (code, msg, _) = out.error();
        assert_eq!((code, msg.as_str()), (1, "config version does not allow CHECK"));
    }
}

#[test]
fn gc_and_status_below_1_1_0_are_refused_with_code_1() {
    let lab = Lab::new();
    for verb in ["GC", "STATUS"] {
        let out = PluginRun::new(plugin_bin(OURS), verb)
            .env("CNI_PATH", "/usr/lib/cni")
            .stdin(&conf("1.0.0"))
            .in_netns(&lab.node)
            .run();
        let (code, msg, _) = out.error();
        assert_eq!((code, msg), (1, format!("config version does not allow {verb}")));
        assert_eq!(out.json()["cniVersion"], "1.0.0", "errors are printed at the config's version");
    }
}

#[test]
fn version_lists_every_supported_version() {
    let out = PluginRun::new(plugin_bin(OURS), "VERSION").stdin(&json!({"cniVersion": "0.3.1"})).run();
    assert_eq!(
        out.result(),
        json!({"cniVersion": "1.1.0", "supportedVersions": ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
    );
}

#[test]
fn no_command_prints_what_the_plugin_is_on_stderr_and_succeeds() {
    let out = PluginRun::new(plugin_bin(OURS), "").unset("CNI_COMMAND").run();
    assert!(out.success());
    assert_eq!(out.stdout, "");
    assert!(out.stderr.contains("CNI plugin plexus-test-plugin"), "{}", out.stderr);
    assert!(out.stderr.contains("CNI protocol versions supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"));
}

#[test]
fn unknown_command_is_code_4() {
    let out = PluginRun::new(plugin_bin(OURS), "FOO").stdin(&conf("1.1.0")).run();
    let (code, msg, _) = out.error();
    assert_eq!((code, msg.as_str()), (4, "unknown CNI_COMMAND: FOO"));
}

#[test]
fn cni_netns_equal_to_the_plugins_own_is_code_8() {
    let lab = Lab::new();
    let out = attach(&lab)(PluginRun::new(plugin_bin(OURS), "ADD"))
        .env("CNI_NETNS", lab.node.path().to_str().unwrap())
        .stdin(&conf("1.0.0"))
        .in_netns(&lab.node)
        .run();
    assert_eq!(out.error().0, 8);
    let out = attach(&lab)(PluginRun::new(plugin_bin(OURS), "ADD"))
        .env("CNI_NETNS", lab.node.path().to_str().unwrap())
        .env("CNI_NETNS_OVERRIDE", "1")
        .stdin(&conf("1.0.0"))
        .in_netns(&lab.node)
        .run();
    assert!(out.success(), "{}", out.stdout);
}

#[test]
fn stdout_holds_one_json_document_and_the_log_goes_where_the_admin_says_never_where_the_config_says() {
    use std::os::unix::fs::PermissionsExt;
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let (admin_log, passed_log, tenant_log) =
        (dir.path().join("sub/plexus.log"), dir.path().join("passed.log"), dir.path().join("tenant.log"));
    let policy = write_policy(dir.path(), "policy.json", &json!({"log": {"file": admin_log, "level": "debug"}}));
    let mut c = conf("1.0.0");
    c.as_object_mut().unwrap().extend(
        json!({"logLevel": "debug", "logToStderr": true, "logFile": tenant_log.to_str().unwrap()})
            .as_object()
            .unwrap()
            .clone(),
    );
    let run = |r: PluginRun| {
        attach(&lab)(r).env("PLEXUS_POLICY", policy.to_str().unwrap()).stdin(&c).in_netns(&lab.node).run()
    };
    for out in [
        run(PluginRun::new(plugin_bin(OURS), "ADD")),
        // The meta-plugin hands its own (admin) log settings to its delegates this way.
        run(PluginRun::new(plugin_bin(OURS), "ADD")
            .env("PLEXUS_LOG_FILE", passed_log.to_str().unwrap())
            .env("PLEXUS_LOG_LEVEL", "debug")),
    ] {
        let doc = out.result();
        assert_eq!(doc["ips"][0]["address"], "198.18.0.10/24");
        // One document: parsing a stream of values yields exactly one.
        let docs: Vec<Value> =
            serde_json::Deserializer::from_str(&out.stdout).into_iter().map(Result::unwrap).collect();
        assert_eq!(docs.len(), 1, "stdout: {}", out.stdout);
        assert!(!out.stderr.contains("DEBUG"), "the config's logToStderr is not the admin's: {}", out.stderr);
    }
    assert!(!tenant_log.exists(), "the config's logFile is never opened");
    for log in [&admin_log, &passed_log] {
        let text = std::fs::read_to_string(log).unwrap();
        assert!(text.contains("DEBUG") && text.contains("invoked") && text.contains("delegating"), "{text}");
        assert_eq!(std::fs::metadata(log).unwrap().permissions().mode() & 0o777, 0o600);
    }
}

#[test]
fn a_panic_becomes_one_cni_error_with_code_999() {
    let lab = Lab::new();
    let mut c = conf("1.0.0");
    c["panicOn"] = "ADD".into();
    let out = attach(&lab)(PluginRun::new(plugin_bin(OURS), "ADD")).stdin(&c).in_netns(&lab.node).run();
    let (code, msg, _) = out.error();
    assert_eq!(code, 999);
    assert!(msg.contains("asked to panic on ADD"), "{msg}");
}

#[test]
fn l2_only_add_at_0_2_0_is_an_error_not_an_empty_result() {
    let lab = Lab::new();
    let c = json!({"cniVersion": "0.2.0", "name": "rail0", "type": "x"});
    let out = attach(&lab)(PluginRun::new(plugin_bin(OURS), "ADD")).stdin(&c).in_netns(&lab.node).run();
    let (code, msg, _) = out.error();
    assert_eq!((code, msg.as_str()), (1, "cannot convert: no valid IP addresses"));
}

#[test]
fn gc_receives_valid_attachments_under_both_keys() {
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("gc.json");
    let attachments = json!([{"containerID": "c1", "ifname": "net1"}, {"containerID": "c2", "ifname": "net2"}]);
    for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
        let _ = std::fs::remove_file(&record);
        let c = json!({"cniVersion": "1.1.0", "name": "rail0", "type": "x", "gcRecord": record.to_str().unwrap(), key: attachments});
        let out =
            PluginRun::new(plugin_bin(OURS), "GC").env("CNI_PATH", "/usr/lib/cni").stdin(&c).in_netns(&lab.node).run();
        assert!(out.success(), "{key}: {}", out.stdout);
        assert_eq!(out.stdout, "", "GC prints nothing on success");
        let seen: Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
        assert_eq!(seen, attachments, "{key}");
    }
}

#[test]
fn unknown_cni_args_keys_fail_add_and_check_with_code_4_unless_ignore_unknown_and_never_del() {
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let policy = write_policy(dir.path(), "policy.json", &json!({"dataRoots": [dir.path()]}));
    let c = json!({"cniVersion": "1.0.0", "name": "rail0", "type": "x",
                   "ipam": {"type": "plexus-ipam", "range": "198.18.5.0/24", "dataDir": dir.path().join("ipam")}});
    let run = |verb: &str, args: &str| {
        PluginRun::new(plugin_bin("plexus-ipam"), verb)
            .attachment("c1", &lab.pod.path(), "net1", "/usr/lib/cni")
            .env("PLEXUS_POLICY", policy.to_str().unwrap())
            .env("CNI_ARGS", args)
            .stdin(&c)
            .in_netns(&lab.node)
            .run()
    };
    let (code, msg, details) = run("ADD", "K8S_POD_NAME=p;FOO=1;BAR=2").error();
    assert_eq!(code, 4);
    assert_eq!(msg, r#"ARGS: unknown args ["FOO" "BAR"]"#, "libcni's words, naming every unknown key");
    assert!(details.contains("IgnoreUnknown"), "{details}");
    assert!(
        !dir.path().join("ipam/default/ips").exists()
            || std::fs::read_dir(dir.path().join("ipam/default/ips")).unwrap().count() == 0
    );
    // The reference plugins refuse it too (libcni's LoadArgs), with code 999 where plexus says 4.
    let theirs = PluginRun::new(reference_plugin("static"), "ADD")
        .attachment("c1", &lab.pod.path(), "net1", "/usr/lib/cni")
        .env("CNI_ARGS", "FOO=1")
        .stdin(&conf("1.0.0"))
        .in_netns(&lab.node)
        .run();
    assert!(!theirs.success(), "{}", theirs.stdout);
    assert!(theirs.error().1.contains("FOO"), "{}", theirs.stdout);
    // Known keys (the runtime's and this plugin's) and IgnoreUnknown pass; DEL takes anything.
    let ok = run("ADD", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;IP=198.18.5.7");
    assert!(ok.success(), "{}", ok.stdout);
    for (verb, args) in [("DEL", "FOO=1"), ("ADD", "IgnoreUnknown=1;FOO=1"), ("DEL", "IgnoreUnknown=1;FOO=1")] {
        let out = run(verb, args);
        assert!(out.success(), "{verb} {args}: {:?} {} {}", out.status, out.stdout, out.stderr);
    }
}
