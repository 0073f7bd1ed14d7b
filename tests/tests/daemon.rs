//! plexus-daemon without Kubernetes (NADs from `nadDir`, as the shim would read them): the shim
//! forwards to it over its socket; with the daemon down, busy, killed or stopping, the shim is
//! never worse off than in thin mode. Real namespaces, real delegates (plexus-macvlan +
//! plexus-ipam), the daemon a real process in the node namespace.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plexus_tests::daemon::write_gated_delegate;
use plexus_tests::{DaemonProcess, DataDir, Lab, Netns, Outcome, PluginRun, plugin_bin};
use serde_json::{Value, json};

fn bin_dir() -> PathBuf {
    plugin_bin("plexus").parent().unwrap().to_path_buf()
}

/// A node with two NICs, NADs `rail0` (plexus-macvlan) and `gated` (plexus-macvlan behind a
/// gate: its ADD waits until the test opens it), and a daemon socket path.
struct Node {
    lab: Lab,
    pod2: Netns,
    dir: tempfile::TempDir,
    ipam: DataDir,
}

impl Node {
    fn new() -> Node {
        let lab = Lab::new();
        lab.add_nic("nic0", 9000);
        lab.add_nic("nic1", 9000);
        let pod2 = lab.another_pod();
        let n = Node { lab, pod2, dir: tempfile::tempdir().unwrap(), ipam: DataDir::new("ipam") };
        for d in ["nads", "gate", "run"] {
            std::fs::create_dir_all(n.dir.path().join(d)).unwrap();
        }
        let ipam = |range: &str| json!({"type": "plexus-ipam", "range": range, "dataDir": n.ipam_dir()});
        n.nad(
            "rail0",
            json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0", "ipam": ipam("198.18.30.0/24")}),
        );
        n.nad(
            "gated",
            json!({"cniVersion": "1.0.0", "type": "gated", "master": "nic1", "ipam": ipam("198.18.31.0/24")}),
        );
        let gate = n.dir.path().join("gate");
        write_gated_delegate(&gate.join("gated"), &gate, &bin_dir().join("plexus-macvlan"));
        n
    }

    fn nad(&self, name: &str, config: Value) {
        let yaml = format!(
            "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  config: '{config}'\n"
        );
        std::fs::write(self.dir.path().join("nads").join(format!("{name}.yaml")), yaml).unwrap();
    }

    fn ipam_dir(&self) -> String {
        self.ipam.path().display().to_string()
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("run/plexus/daemon.sock")
    }

    fn shim_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("shim.log")).unwrap_or_default()
    }

    fn conf(&self, networks: &str) -> Value {
        json!({"cniVersion": "1.1.0", "name": "plexus", "type": "plexus", "nadDir": self.dir.path().join("nads"),
               "networks": networks, "cniDir": self.dir.path().join("cache"), "binDir": self.dir.path().join("gate"),
               "daemonSocket": self.socket(), "logFile": self.dir.path().join("shim.log"), "logLevel": "debug"})
    }

    /// A wrapper over `plugin` first in binDir: it appends `says` (shell words, e.g.
    /// `"$CNI_COMMAND $CNI_CONTAINERID"`) to the returned file, then execs the real plugin.
    fn wrap(&self, plugin: &str, says: &str) -> PathBuf {
        let (wrapper, said) =
            (self.dir.path().join("gate").join(plugin), self.dir.path().join(format!("{plugin}.said")));
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\n[ -n \"$CNI_COMMAND\" ] && echo {says} >> {}\nexec {}\n",
                said.display(),
                bin_dir().join(plugin).display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        said
    }

    fn daemon(&self, args: &[&str]) -> DaemonProcess {
        DaemonProcess::start(&self.lab.node.path(), &self.socket(), &self.dir.path().join("daemon.log"), args)
    }

    /// A daemon whose fault-injection points (debug builds) are logged to [`Node::points`]: each
    /// line names the process that passed the point, so a test sees which process did a
    /// delegate's netlink and file work.
    fn daemon_logging_points(&self, args: &[&str]) -> DaemonProcess {
        let points = self.dir.path().join("points");
        DaemonProcess::start_binary(
            &plugin_bin("plexus-daemon"),
            &self.lab.node.path(),
            &self.socket(),
            &self.dir.path().join("daemon.log"),
            args,
            &[("PLEXUS_FAULT_LOG", &points)],
        )
    }

    /// The processes that passed fault-injection points since the last call, by name, each once.
    fn points_passed_by(&self) -> std::collections::BTreeSet<String> {
        let points = self.dir.path().join("points");
        let text = std::fs::read_to_string(&points).unwrap_or_default();
        let _ = std::fs::remove_file(&points);
        text.lines().filter_map(|l| l.split(' ').next()).map(String::from).collect()
    }

    fn run(&self, verb: &str, container: &str, c: &Value) -> Outcome {
        let pod = if container == "pod1" { self.lab.pod.path() } else { self.pod2.path() };
        PluginRun::new(plugin_bin("plexus"), verb)
            .attachment(container, &pod, "eth0", &bin_dir().display().to_string())
            .stdin(c)
            .in_netns(&self.lab.node)
            .run()
    }

    /// A fake API server holding NAD default/rail0 (plexus-macvlan on nic0, its addresses from
    /// `range`) and pod default/trainer naming it, a kubeconfig for it, and the meta config that
    /// reads the API instead of `nadDir`.
    fn with_api(&self, range: &str) -> (plexus_tests::fake_api::FakeApi, PathBuf, Value) {
        let api = plexus_tests::fake_api::FakeApi::start_in(&self.lab.node);
        let kubeconfig = self.dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig, true);
        let rail0 = json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
                           "ipam": {"type": "plexus-ipam", "range": range, "dataDir": self.ipam_dir()}});
        api.add_nad("default", "rail0", &rail0, json!({}));
        api.add_pod("default", "trainer", "uid-trainer", json!({"k8s.v1.cni.cncf.io/networks": "rail0"}));
        let mut c = self.conf("unused");
        let conf = c.as_object_mut().unwrap();
        for k in ["nadDir", "networks"] {
            conf.remove(k);
        }
        conf.insert("kubeconfig".into(), json!(kubeconfig));
        (api, kubeconfig, c)
    }

    /// `verb` for pod default/trainer's sandbox `pod1`, as the runtime names it in `CNI_ARGS`.
    fn run_trainer(&self, verb: &str, c: &Value) -> Outcome {
        PluginRun::new(plugin_bin("plexus"), verb)
            .attachment("pod1", &self.lab.pod.path(), "eth0", &bin_dir().display().to_string())
            .env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=trainer;K8S_POD_UID=uid-trainer")
            .stdin(c)
            .in_netns(&self.lab.node)
            .run()
    }

    /// The daemon's network-status journal, and the entries in it.
    fn journal(&self) -> PathBuf {
        self.socket().parent().unwrap().join("network-status")
    }

    fn journaled(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.journal())
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    /// Pod default/trainer's network-status, if the API has one.
    fn status_of(&self, api: &plexus_tests::fake_api::FakeApi) -> Option<Value> {
        let pod = api.pod("default", "trainer")?;
        serde_json::from_str(pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"].as_str()?).ok()
    }

    /// Wait (at most 5 s) for pod default/trainer's network-status: the daemon writes it after
    /// the answer.
    fn wait_status(&self, api: &plexus_tests::fake_api::FakeApi) -> Value {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(s) = self.status_of(api) {
                return s;
            }
            assert!(Instant::now() < deadline, "no network-status within 5 s of the ADD");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn open_gate(&self) {
        std::fs::write(self.dir.path().join("gate/open"), "").unwrap();
    }

    /// Opens the gate when dropped: a test that fails while a gated ADD waits does not hang.
    fn gate_guard(&self) -> GateGuard<'_> {
        GateGuard(self)
    }

    fn wait_entered(&self, container: &str) {
        let f = self.dir.path().join(format!("gate/entered-{container}"));
        let start = Instant::now();
        while !f.exists() {
            assert!(start.elapsed() < Duration::from_secs(20), "the gated delegate never started");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn held(&self) -> usize {
        std::fs::read_dir(Path::new(&self.ipam_dir()).join("default/ips")).map(|d| d.count()).unwrap_or(0)
    }

    fn cached(&self) -> usize {
        std::fs::read_dir(self.dir.path().join("cache")).map(|d| d.count()).unwrap_or(0)
    }

    fn pod_links(&self) -> Vec<String> {
        self.lab.pod.links().into_iter().map(|l| l.ifname).collect()
    }
}

struct GateGuard<'a>(&'a Node);

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        self.0.open_gate();
    }
}

/// The count of a histogram series (`request_duration_seconds` by verb, say).
fn count(d: &DaemonProcess, series: &str) -> f64 {
    d.sample(&format!("plexus_daemon_{series}"))
}

#[test]
fn a_pod_attached_through_the_daemon_gets_what_thin_mode_gives_and_the_metrics_count_it() {
    let n = Node::new();
    let d = n.daemon(&[]);
    let c = n.conf("rail0");
    let thin = {
        let mut c = c.clone();
        c.as_object_mut().unwrap().remove("daemonSocket");
        c
    };
    let r = n.run("ADD", "pod1", &c).result();
    assert_eq!(r["interfaces"][0]["name"], "net1");
    assert_eq!(r["ips"][0]["address"], "198.18.30.1/24");
    assert_eq!(n.lab.pod.addrs("net1")[0].cidr(), "198.18.30.1/24");
    // The same request in thin mode, for another pod, prints the same document but for its
    // own addresses and namespace.
    let t = n.run("ADD", "pod2", &thin).result();
    let strip = |mut v: Value| {
        for i in v["interfaces"].as_array_mut().unwrap() {
            i.as_object_mut().unwrap().remove("sandbox");
            i.as_object_mut().unwrap().remove("mac");
        }
        v["ips"][0]["address"] = json!("-");
        v
    };
    assert_eq!(strip(r.clone()), strip(t), "daemon and thin mode answer alike");
    assert!(n.run("CHECK", "pod1", &c).success());
    assert!(n.run("DEL", "pod1", &c).success());
    assert!(n.run("DEL", "pod2", &thin).success());
    assert_eq!(n.pod_links(), ["lo"]);
    assert_eq!((n.held(), n.cached()), (0, 0));
    // Served by the daemon: the shim never ran a delegate itself, the metrics saw every verb.
    assert!(!n.shim_log().contains("thin mode"), "{}", n.shim_log());
    assert_eq!(count(&d, "request_duration_seconds_count{command=\"ADD\"}"), 1.0);
    assert_eq!(count(&d, "request_duration_seconds_count{command=\"CHECK\"}"), 1.0);
    assert_eq!(count(&d, "request_duration_seconds_count{command=\"DEL\"}"), 1.0);
    assert_eq!(
        count(&d, "delegate_duration_seconds_count{command=\"ADD\",network=\"default/rail0\",type=\"plexus-macvlan\"}"),
        1.0
    );
    let m = d.metrics();
    assert!(m.contains("plexus_daemon_request_duration_seconds_bucket{le=\"0.001\",command=\"ADD\"}"), "{m}");
    assert!(m.contains("# TYPE plexus_daemon_delegate_duration_seconds histogram"), "{m}");
}

#[test]
fn the_daemon_runs_its_own_build_of_a_delegate_in_process_and_execs_any_other() {
    let n = Node::new();
    let c = n.conf("rail0");
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<std::collections::BTreeSet<_>>();
    {
        let _d = n.daemon_logging_points(&[]);
        // plexus-macvlan and plexus-ipam of this build (CNI_PATH): both run in the daemon.
        let r = n.run("ADD", "pod1", &c).result();
        assert_eq!(r["ips"][0]["address"], "198.18.30.1/24");
        assert_eq!(n.lab.pod.addrs("net1")[0].cidr(), "198.18.30.1/24");
        assert_eq!(n.points_passed_by(), names(&["plexus-daemon"]), "no delegate process");
        // Said in the request's log (the meta config's logFile), once per binary.
        let log = n.shim_log();
        for plugin in ["plexus-macvlan", "plexus-ipam"] {
            let said = format!("binary={}", bin_dir().join(plugin).display());
            assert!(log.lines().any(|l| l.contains("runs in-process: this build") && l.contains(&said)), "{log}");
        }
        // A wrapper installed in binDir over it (it logs, then execs the real plugin): what the
        // runtime would exec is no longer the daemon's plugin, so the wrapper runs.
        let wrapped = n.wrap("plexus-macvlan", r#""$CNI_COMMAND $CNI_CONTAINERID""#);
        let r = n.run("ADD", "pod2", &c).result();
        assert_eq!(r["ips"][0]["address"], "198.18.30.2/24");
        assert_eq!(std::fs::read_to_string(&wrapped).unwrap(), "ADD pod2\n");
        // The wrapper's plexus-macvlan runs its own IPAM: both are processes of their own now.
        assert_eq!(n.points_passed_by(), names(&["plexus-daemon", "plexus-macvlan", "plexus-ipam"]));
        assert!(n.run("DEL", "pod2", &c).success());
        assert_eq!(std::fs::read_to_string(&wrapped).unwrap(), "ADD pod2\nDEL pod2\n");
        std::fs::remove_file(n.dir.path().join("gate/plexus-macvlan")).unwrap();
        assert!(n.run("DEL", "pod1", &c).success());
        assert_eq!(n.points_passed_by(), names(&["plexus-daemon", "plexus-macvlan", "plexus-ipam"]));
    }
    assert_eq!(n.pod_links(), ["lo"]);
    assert_eq!((n.held(), n.cached()), (0, 0));
    // Switched off, every delegate is a process of its own.
    let _d = n.daemon_logging_points(&["--in-process-delegates", "false"]);
    assert!(n.run("ADD", "pod1", &c).success());
    assert!(n.run("DEL", "pod1", &c).success());
    assert_eq!(n.points_passed_by(), names(&["plexus-daemon", "plexus-macvlan", "plexus-ipam"]));
    assert_eq!((n.pod_links(), n.held(), n.cached()), (vec!["lo".to_string()], 0, 0));
    assert!(!n.shim_log().contains("thin mode"), "{}", n.shim_log());
}

#[test]
fn the_runtimes_trace_context_reaches_the_delegates_of_a_delegate_run_in_process_by_the_daemon() {
    let n = Node::new();
    let _d = n.daemon(&[]);
    let c = n.conf("rail0");
    // plexus-macvlan of this build runs in the daemon; its IPAM delegate, found first in binDir,
    // is a wrapper that says what trace context it got, then execs plexus-ipam.
    let seen = n.wrap("plexus-ipam", r#""$CNI_COMMAND|$TRACEPARENT|$TRACESTATE|$BAGGAGE""#);
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = |verb: &str, parent: &str| {
        PluginRun::new(plugin_bin("plexus"), verb)
            .attachment("pod1", &n.lab.pod.path(), "eth0", &bin_dir().display().to_string())
            .env("TRACEPARENT", parent)
            .env("TRACESTATE", "plexus=t61rcWkgMzE")
            .env("BAGGAGE", "pod=trainer")
            .stdin(&c)
            .in_netns(&n.lab.node)
            .run()
    };
    assert!(traced("ADD", parent).success());
    assert!(traced("DEL", "not-a-traceparent").success());
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap(),
        format!("ADD|{parent}|plexus=t61rcWkgMzE|pod=trainer\nDEL||plexus=t61rcWkgMzE|pod=trainer\n"),
        "the daemon's request, its in-process plexus-macvlan and the IPAM it execs carry the shim's context; a \
         malformed traceparent is not handed on"
    );
    assert!(!n.shim_log().contains("thin mode"), "{}", n.shim_log());
    assert!(n.shim_log().contains("runs in-process: this build"), "{}", n.shim_log());
    assert_eq!((n.pod_links(), n.held(), n.cached()), (vec!["lo".to_string()], 0, 0));
}

#[test]
fn with_a_collector_the_daemon_sends_a_span_for_each_request_and_each_delegate_under_the_runtimes_trace() {
    use plexus_tests::otlp::{Collector, attribute, hex};
    let n = Node::new();
    let collector = Collector::start_in(&n.lab.node);
    let _d = n.daemon(&["--otlp-endpoint", &collector.endpoint]);
    n.nad("broken", json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic9"}));
    // plexus-ipam, exec'd by the in-process plexus-macvlan, says what trace context it got.
    let seen = n.wrap("plexus-ipam", r#""$CNI_COMMAND|$TRACEPARENT|$TRACESTATE""#);
    let (trace, runtime_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let run = |verb: &str, networks: &str, parent: Option<&str>| {
        let mut r = PluginRun::new(plugin_bin("plexus"), verb)
            .attachment("pod1", &n.lab.pod.path(), "eth0", &bin_dir().display().to_string())
            .env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=trainer")
            .stdin(&n.conf(networks))
            .in_netns(&n.lab.node);
        if let Some(parent) = parent {
            r = r.env("TRACEPARENT", parent).env("TRACESTATE", "plexus=t61rcWkgMzE");
        }
        r.run()
    };
    let sampled = format!("00-{trace}-{runtime_span}-01");
    assert!(run("ADD", "rail0", Some(unsampled)).success());
    assert!(run("DEL", "rail0", Some(unsampled)).success());
    assert!(run("ADD", "rail0", Some(&sampled)).success());
    assert!(run("DEL", "rail0", Some(&sampled)).success());
    let failed = run("ADD", "broken", None);
    assert!(!failed.success());

    let spans = collector.wait_for(Duration::from_secs(20), |spans| {
        spans.iter().filter(|s| s.name.starts_with("CNI ")).count() >= 3
            && spans.iter().filter(|s| s.name.starts_with("delegate ")).count() >= 3
    });
    let named = |name: &str, trace_id: Option<&str>| -> Vec<_> {
        spans.iter().filter(|s| s.name == name && trace_id.is_none_or(|t| hex(&s.trace_id) == t)).collect()
    };
    assert!(
        spans.iter().all(|s| hex(&s.trace_id) != "0af7651916cd43dd8448eb211c80319c"),
        "a trace the runtime did not sample is not recorded: {spans:#?}"
    );
    // The sampled ADD: a server span under the runtime's span, the pod named; the delegate's
    // client span under it; the IPAM plexus-macvlan exec'd was handed the request's span as parent.
    let add = named("CNI ADD", Some(trace));
    assert_eq!(add.len(), 1, "{spans:#?}");
    let add = add[0];
    assert_eq!(hex(&add.parent_span_id), runtime_span);
    assert_eq!(add.kind, 2, "server");
    assert_eq!(attribute(add, "cni.container_id").as_deref(), Some("pod1"));
    assert_eq!(attribute(add, "k8s.pod.name").as_deref(), Some("trainer"));
    assert_eq!(attribute(add, "k8s.namespace.name").as_deref(), Some("default"));
    let delegate = named("delegate ADD", Some(trace));
    assert_eq!(delegate.len(), 1, "{spans:#?}");
    assert_eq!(delegate[0].parent_span_id, add.span_id);
    assert_eq!(delegate[0].kind, 3, "client");
    assert_eq!(attribute(delegate[0], "cni.network").as_deref(), Some("default/rail0"));
    assert_eq!(attribute(delegate[0], "cni.delegate.type").as_deref(), Some("plexus-macvlan"));
    assert!(delegate[0].start_time_unix_nano >= add.start_time_unix_nano);
    assert!(delegate[0].end_time_unix_nano <= add.end_time_unix_nano);
    let del = named("CNI DEL", Some(trace));
    assert_eq!(del.len(), 1, "{spans:#?}");
    assert_eq!(named("delegate DEL", Some(trace))[0].parent_span_id, del[0].span_id);
    let handed = std::fs::read_to_string(&seen).unwrap();
    let request_span = |s: &&opentelemetry_proto::tonic::trace::v1::Span| format!("00-{trace}-{}-01", hex(&s.span_id));
    assert!(
        handed.contains(&format!("ADD|{}|plexus=t61rcWkgMzE\n", request_span(&add)))
            && handed.contains(&format!("DEL|{}|plexus=t61rcWkgMzE\n", request_span(&del[0]))),
        "the delegates are handed the request's span as their parent, the runtime's tracestate kept: {handed}"
    );
    assert!(handed.contains("|00-0af7651916cd43dd8448eb211c80319c-"), "and an unsampled trace stays one: {handed}");
    // The ADD that failed, with no trace context from the runtime: a trace of its own, the error
    // on the request and on the delegate.
    let failed_add: Vec<_> = spans.iter().filter(|s| s.name == "CNI ADD" && s.parent_span_id.is_empty()).collect();
    assert_eq!(failed_add.len(), 1, "{spans:#?}");
    let status = failed_add[0].status.as_ref().expect("a status");
    assert_eq!(status.code, 2, "error: {status:?}");
    assert!(status.message.contains("nic9"), "{status:?}");
    assert_eq!(attribute(failed_add[0], "cni.error.code"), Some(failed.error().0.to_string()));
    let failed_delegate =
        spans.iter().find(|s| s.parent_span_id == failed_add[0].span_id).expect("its delegate's span");
    assert_eq!(attribute(failed_delegate, "cni.network").as_deref(), Some("default/broken"));
    assert_eq!(failed_delegate.status.as_ref().map(|s| s.code), Some(2));
    // A collector gone costs the requests nothing but their spans.
    drop(collector);
    assert!(run("ADD", "rail0", Some(&sampled)).success());
    assert!(run("DEL", "rail0", Some(&sampled)).success());
    assert!(!n.shim_log().contains("thin mode"), "{}", n.shim_log());
    assert_eq!((n.pod_links(), n.held(), n.cached()), (vec!["lo".to_string()], 0, 0));
}

#[test]
fn delegates_run_in_process_leave_no_descriptor_behind_in_the_daemon() {
    let n = Node::new();
    let d = n.daemon(&[]);
    let c = n.conf("rail0");
    let cycle = || {
        assert!(n.run("ADD", "pod1", &c).success());
        assert!(n.run("DEL", "pod1", &c).success());
    };
    let fds = || -> Vec<String> {
        let dir = std::fs::read_dir(format!("/proc/{}/fd", d.pid())).unwrap();
        let targets = dir.flatten().map(|e| std::fs::read_link(e.path()).map(|t| t.display().to_string()));
        targets.map(|t| t.unwrap_or_else(|_| "(closed meanwhile)".into())).collect()
    };
    // The first cycle opens what the daemon keeps (the policy, its identification of each binary).
    cycle();
    let first = fds();
    let before = first.len();
    for _ in 0..30 {
        cycle();
    }
    // The shim has its answer before the daemon's task drops the connection: a descriptor may
    // still be closing (once seen open after 2 s with the machine loaded: a pipe), after the
    // first cycle as after the last (once the first count held the first cycle's socket, and the
    // count after 30 cycles was one lower). A leak grows with the cycles and does not go away.
    let start = Instant::now();
    let mut now = fds();
    while now.len() > before && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
        now = fds();
    }
    assert!(
        now.len() <= before,
        "descriptors left open by 30 in-process ADD/DEL cycles: {now:?} (after the first: {first:?})"
    );
    assert_eq!((n.pod_links(), n.held(), n.cached()), (vec!["lo".to_string()], 0, 0));
}

#[test]
fn errors_come_back_with_their_cni_code_and_are_counted_by_code() {
    let n = Node::new();
    let d = n.daemon(&[]);
    let (code, msg, _) = n.run("ADD", "pod1", &n.conf("nosuch")).error();
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("nosuch"), "{msg}");
    assert_eq!(count(&d, "request_errors_total{command=\"ADD\",code=\"7\"}"), 1.0);
    assert_eq!(n.cached(), 0);
}

#[test]
fn with_the_daemon_down_or_gone_the_shim_runs_the_request_itself_and_says_so() {
    let n = Node::new();
    let c = n.conf("rail0");
    // Never started: no socket.
    let r = n.run("ADD", "pod1", &c);
    assert!(r.success(), "{}", r.stdout);
    assert!(n.shim_log().contains("running the ADD here (thin mode)"), "{}", n.shim_log());
    assert!(n.run("DEL", "pod1", &c).success());
    // Killed: its socket is left behind, nobody listens.
    let mut d = n.daemon(&[]);
    d.kill();
    assert!(n.socket().exists());
    let r = n.run("ADD", "pod1", &c);
    assert!(r.success(), "{}", r.stdout);
    assert!(n.shim_log().contains("Connection refused"), "{}", n.shim_log());
    assert!(n.run("DEL", "pod1", &c).success());
    assert_eq!((n.pod_links(), n.held(), n.cached()), (vec!["lo".to_string()], 0, 0));
    // Started again over the stale socket: serves.
    let d = n.daemon(&[]);
    assert!(n.run("ADD", "pod1", &c).success());
    assert!(n.run("DEL", "pod1", &c).success());
    assert_eq!(count(&d, "request_duration_seconds_count{command=\"ADD\"}"), 1.0);
}

#[test]
fn a_daemon_killed_mid_add_fails_it_with_code_11_the_runtimes_del_cleans_up_and_the_retry_succeeds() {
    let n = Node::new();
    let mut d = n.daemon(&[]);
    let c = n.conf("rail0,gated");
    let add = std::thread::scope(|s| {
        // Opened when the scope ends: by then the daemon (and the gated delegate) is gone.
        let _gate = n.gate_guard();
        let add = s.spawn(|| n.run("ADD", "pod1", &c));
        n.wait_entered("pod1");
        // rail0 is done (the daemon recorded its result), the gated one is under way. Its link
        // in the pod is not enough: rail0's IPAM runs alongside its netlink steps.
        let cache = n.dir.path().join("cache/pod1");
        let start = Instant::now();
        while !std::fs::read_to_string(&cache).unwrap_or_default().contains("{\"attachment\":0,") {
            assert!(start.elapsed() < Duration::from_secs(20), "rail0 never attached");
            std::thread::sleep(Duration::from_millis(10));
        }
        d.kill();
        add.join().unwrap()
    });
    let (code, msg, details) = add.error();
    assert_eq!(code, 11, "{msg}");
    assert!(msg.contains("went away"), "{msg}");
    assert!(details.contains("DEL"), "{details}");
    assert_eq!(n.cached(), 1, "the killed ADD left its cache for DEL");
    assert!(n.held() >= 1, "the killed ADD left rail0's address for DEL");
    // The runtime's DEL, daemon down: thin mode, from the cache.
    let del = n.run("DEL", "pod1", &c);
    assert!(del.success(), "{}", del.stdout);
    assert_eq!((n.pod_links(), n.held(), n.cached()), (vec!["lo".to_string()], 0, 0));
    // The kubelet's retry, the daemon back.
    let _d = n.daemon(&[]);
    n.open_gate();
    let r = n.run("ADD", "pod1", &c).result();
    assert_eq!(r["interfaces"].as_array().unwrap().len(), 2);
    assert!(n.run("DEL", "pod1", &c).success());
    assert_eq!((n.pod_links(), n.held(), n.cached()), (vec!["lo".to_string()], 0, 0));
}

#[test]
fn sigterm_removes_the_socket_at_once_and_finishes_the_request_taken() {
    let n = Node::new();
    let mut d = n.daemon(&[]);
    let c = n.conf("gated");
    std::thread::scope(|s| {
        let _gate = n.gate_guard();
        let add = s.spawn(|| n.run("ADD", "pod1", &c));
        n.wait_entered("pod1");
        d.terminate();
        let start = Instant::now();
        while n.socket().exists() {
            assert!(start.elapsed() < Duration::from_secs(5), "the socket stayed");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Meanwhile a new request runs thin.
        let other = n.run("ADD", "pod2", &n.conf("rail0"));
        assert!(other.success(), "{}", other.stdout);
        assert_eq!(d.get("/readyz").map(|(code, _)| code), Some(503), "not ready while stopping");
        n.open_gate();
        let r = add.join().unwrap();
        assert!(r.success(), "the request taken before SIGTERM finished: {}", r.stdout);
    });
    assert!(d.wait(Duration::from_secs(10)).success());
    assert!(d.log_text().contains("every request answered"), "{}", d.log_text());
    assert!(n.run("DEL", "pod1", &c).success());
    assert!(n.run("DEL", "pod2", &n.conf("rail0")).success());
    assert_eq!((n.held(), n.cached()), (0, 0));
}

#[test]
fn past_the_queue_limit_a_request_is_not_taken_and_the_shim_runs_it_itself() {
    let n = Node::new();
    let d = n.daemon(&["--max-concurrent", "1", "--max-queued", "0"]);
    let gated = n.conf("gated");
    std::thread::scope(|s| {
        let _gate = n.gate_guard();
        let first = s.spawn(|| n.run("ADD", "pod1", &gated));
        n.wait_entered("pod1");
        let second = n.run("ADD", "pod2", &n.conf("rail0"));
        assert!(second.success(), "{}", second.stdout);
        assert!(n.shim_log().contains("busy"), "{}", n.shim_log());
        n.open_gate();
        assert!(first.join().unwrap().success());
    });
    assert_eq!(count(&d, "requests_refused_total"), 1.0);
    assert_eq!(count(&d, "request_duration_seconds_count{command=\"ADD\"}"), 1.0, "the refused one ran thin");
    assert!(n.run("DEL", "pod1", &gated).success());
    assert!(n.run("DEL", "pod2", &n.conf("rail0")).success());
    assert_eq!((n.held(), n.cached()), (0, 0));
}

#[test]
fn a_daemon_that_takes_nothing_within_a_second_is_passed_by_and_never_runs_the_request_later() {
    use nix::sys::signal::{Signal, kill};
    let n = Node::new();
    let d = n.daemon(&[]);
    let c = n.conf("rail0");
    let pid = nix::unistd::Pid::from_raw(d.pid());
    // Stopped: the kernel still queues the shim's connection and request, nobody answers.
    kill(pid, Signal::SIGSTOP).unwrap();
    let start = Instant::now();
    let r = n.run("ADD", "pod1", &c);
    let took = start.elapsed();
    kill(pid, Signal::SIGCONT).unwrap();
    assert!(r.success(), "{}", r.stdout);
    assert!(n.shim_log().contains("did not take the request within 1s"), "{}", n.shim_log());
    assert!(took >= Duration::from_secs(1), "the shim waited out its deadline: {took:?}");
    // Continued, the daemon reads the queued request, finds the shim gone and runs nothing.
    let start = Instant::now();
    while !d.log_text().contains("the shim did not confirm the request: not run") {
        assert!(start.elapsed() < Duration::from_secs(20), "{}", d.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(count(&d, "request_duration_seconds_count{command=\"ADD\"}"), 0.0);
    assert_eq!(n.held(), 1, "one address: the shim's own ADD");
    assert!(n.run("DEL", "pod1", &c).success());
    assert_eq!((n.pod_links(), n.held(), n.cached()), (vec!["lo".to_string()], 0, 0));
}

#[test]
fn a_socket_whose_backlog_is_full_is_passed_by_at_once() {
    use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, connect, listen, socket};
    use std::os::fd::AsRawFd;
    let n = Node::new();
    // A listener that accepts nothing, its backlog filled by this test's own connections.
    std::fs::create_dir_all(n.socket().parent().unwrap()).unwrap();
    let addr = UnixAddr::new(&n.socket()).unwrap();
    let listener = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).unwrap();
    bind(listener.as_raw_fd(), &addr).unwrap();
    listen(&listener, Backlog::new(0).unwrap()).unwrap();
    let mut queued = Vec::new();
    loop {
        let fd = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_NONBLOCK, None).unwrap();
        match connect(fd.as_raw_fd(), &addr) {
            Ok(()) => queued.push(fd),
            Err(nix::errno::Errno::EAGAIN) => break,
            Err(e) => panic!("connect: {e}"),
        }
        assert!(queued.len() < 64, "the backlog never filled");
    }
    let c = n.conf("rail0");
    let r = n.run("ADD", "pod1", &c);
    assert!(r.success(), "{}", r.stdout);
    assert!(n.shim_log().contains("is not accepting connections (its backlog is full)"), "{}", n.shim_log());
    assert!(n.run("DEL", "pod1", &c).success());
    assert_eq!((n.pod_links(), n.held(), n.cached()), (vec!["lo".to_string()], 0, 0));
}

#[test]
fn the_socket_is_root_only_and_another_protocol_version_is_not_taken() {
    let n = Node::new();
    let _d = n.daemon(&[]);
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&n.socket()), 0o600);
    assert_eq!(mode(n.socket().parent().unwrap()), 0o700);
    // A peer of another uid is dropped before anything is read (the directory keeps it out
    // anyway; this is the daemon's own check).
    let peer = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "python3", "-c"])
        .arg(format!(
            "import socket;s=socket.socket(socket.AF_UNIX);s.connect('{}');print('connected')",
            n.socket().display()
        ))
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&peer.stdout).contains("connected"), "uid 65534 reached the socket");
    // Another version of the protocol: answered "not taken", with why.
    let mut s = std::os::unix::net::UnixStream::connect(n.socket()).unwrap();
    s.write_all(b"{\"version\":99,\"env\":{},\"stdin\":\"\"}\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with('-') && answer.contains("protocol version 99"), "{answer}");
}

#[test]
fn with_an_api_the_daemon_reads_the_pod_and_its_nads_from_its_caches_and_patches_network_status() {
    let n = Node::new();
    let (api, kubeconfig, c) = n.with_api("198.18.32.0/24");
    let d = n.daemon(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node-a"]);
    let run = |verb: &str| n.run_trainer(verb, &c);
    let before = api.requests().len();
    let r = run("ADD").result();
    assert_eq!(r["ips"][0]["address"], "198.18.32.1/24");
    // The ADD's only API requests: the network-status PATCH and the pod's AddedInterface event
    // (pod and NAD came from the caches), both made after the answer.
    let status = n.wait_status(&api);
    let deadline = Instant::now() + Duration::from_secs(5);
    while api.events().is_empty() {
        assert!(Instant::now() < deadline, "no event within 5 s of the ADD");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut during: Vec<String> = api.requests()[before..].to_vec();
    during.sort();
    assert_eq!(
        during,
        ["PATCH /api/v1/namespaces/default/pods/trainer", "POST /apis/events.k8s.io/v1/namespaces/default/events"],
        "{during:?}"
    );
    let e = &api.events()[0];
    assert_eq!((&e["type"], &e["reason"]), (&json!("Normal"), &json!("AddedInterface")));
    assert_eq!(e["note"], "Add net1 [198.18.32.1/24] from default/rail0");
    assert_eq!(e["regarding"]["uid"], "uid-trainer");
    assert_eq!(count(&d, "api_requests_total{request=\"create_event\"}"), 1.0);
    assert_eq!(status[0]["name"], "default/rail0");
    assert_eq!(status[0]["ips"][0], "198.18.32.1");
    assert_eq!(count(&d, "cached_objects{kind=\"network-attachment-definition\"}"), 1.0);
    assert_eq!(count(&d, "api_requests_total{request=\"patch_pod\"}"), 1.0);
    assert!(!n.shim_log().contains("thin mode"), "{}", n.shim_log());
    assert!(run("DEL").success());
    assert_eq!((n.pod_links(), n.held(), n.cached()), (vec!["lo".to_string()], 0, 0));
    assert_eq!(n.journaled(), Vec::<String>::new(), "written statuses leave the journal");
}

/// The network-status PATCHes of pod default/trainer the API server was sent so far.
fn status_patches(api: &plexus_tests::fake_api::FakeApi) -> usize {
    api.requests().iter().filter(|r| r.starts_with("PATCH /api/v1/namespaces/default/pods/trainer")).count()
}

#[test]
fn a_network_status_a_killed_daemon_had_not_written_is_written_by_the_next_one() {
    let n = Node::new();
    let (api, kubeconfig, c) = n.with_api("198.18.34.0/24");
    let args = ["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node-a", "--api-timeout", "0.5"];
    let mut d = n.daemon(&args);
    // The API server takes no network-status PATCH (503) while the first daemon runs.
    api.refuse_status_patches("trainer");
    let r = n.run_trainer("ADD", &c).result();
    assert_eq!(r["ips"][0]["address"], "198.18.34.1/24", "the attachment stands");
    assert_eq!(n.journaled(), ["default_trainer"], "journaled before the answer");
    let entry: Value = serde_json::from_slice(&std::fs::read(n.journal().join("default_trainer")).unwrap()).unwrap();
    assert_eq!(entry["statuses"][0]["ips"][0], "198.18.34.1");
    assert_eq!(std::fs::metadata(n.journal()).unwrap().permissions().mode() & 0o777, 0o700);
    d.kill();
    api.clear_faults();
    assert!(n.status_of(&api).is_none());
    // The next daemon writes what the journal holds, with no CNI call.
    let _d = n.daemon(&args);
    let status = n.wait_status(&api);
    assert_eq!(
        (status[0]["name"].as_str(), status[0]["ips"][0].as_str()),
        (Some("default/rail0"), Some("198.18.34.1"))
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !n.journaled().is_empty() {
        assert!(Instant::now() < deadline, "the journal entry stayed after the status landed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(n.run_trainer("DEL", &c).success());
    assert_eq!((n.pod_links(), n.held(), n.cached()), (vec!["lo".to_string()], 0, 0));
}

#[test]
fn a_journaled_network_status_of_a_pod_since_recreated_under_its_name_is_given_up_not_written_to_the_new_pod() {
    let n = Node::new();
    let (api, kubeconfig, c) = n.with_api("198.18.35.0/24");
    let args = ["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node-a", "--api-timeout", "0.5"];
    let mut d = n.daemon(&args);
    api.refuse_status_patches("trainer");
    assert!(n.run_trainer("ADD", &c).success());
    let entry: Value = serde_json::from_slice(&std::fs::read(n.journal().join("default_trainer")).unwrap()).unwrap();
    assert_eq!(entry["uid"], "uid-trainer", "the journal keeps the UID the runtime named");
    d.kill();
    // While no daemon runs, the pod is deleted and a new one of the same name is made (a
    // StatefulSet's): the journaled status is not the new pod's.
    api.clear_faults();
    api.add_pod("default", "trainer", "uid-trainer-2", json!({"k8s.v1.cni.cncf.io/networks": "rail0"}));
    let next = n.daemon(&args);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !n.journaled().is_empty() {
        assert!(Instant::now() < deadline, "the entry stayed in the journal: {}", next.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(n.status_of(&api).is_none(), "the new pod got the old pod's network-status");
    let log = next.log_text();
    assert!(log.contains("network-status of default/trainer given up") && log.contains("422"), "{log}");
    // Given up once, not retried.
    let patches = || status_patches(&api);
    let tried = patches();
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(patches(), tried, "the refused PATCH was tried again");
    // The old sandbox's DEL still cleans up.
    assert!(n.run_trainer("DEL", &c).success());
    assert_eq!((n.pod_links(), n.held(), n.cached()), (vec!["lo".to_string()], 0, 0));
}

#[test]
fn a_network_status_the_api_cannot_take_is_written_in_the_background_once_it_can_and_the_add_stands() {
    let n = Node::new();
    let (api, kubeconfig, c) = n.with_api("198.18.33.0/24");
    let d = n.daemon(&["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node-a", "--api-timeout", "0.5"]);
    let run = |verb: &str| n.run_trainer(verb, &c);
    let status_of = || -> Option<Value> {
        let pod = api.pod("default", "trainer")?;
        serde_json::from_str(pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"].as_str()?).ok()
    };
    let patches = || status_patches(&api);
    // The API server answers every network-status PATCH with 503 (overloaded, restarting).
    api.refuse_status_patches("trainer");
    let r = run("ADD").result();
    assert_eq!(r["ips"][0]["address"], "198.18.33.1/24", "the attachment stands without its status");
    assert_eq!(status_of(), None);
    // The daemon's log tells why.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !d.log_text().contains("retried in the background") {
        assert!(Instant::now() < deadline, "{}", d.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    // While the API cannot take it, the daemon keeps trying (every 2 s).
    let tried = patches();
    let deadline = Instant::now() + Duration::from_secs(10);
    while patches() == tried {
        assert!(Instant::now() < deadline, "no retry of the PATCH within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status_of(), None);
    // The API takes writes again: the status lands without another CNI call.
    api.clear_faults();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = status_of() {
            break s;
        }
        assert!(Instant::now() < deadline, "network-status not written within 10 s of the API coming back");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status[0]["name"], "default/rail0");
    assert_eq!(status[0]["ips"][0], "198.18.33.1");
    // Said once the PATCH's answer is back, a moment after the API server stored it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !d.log_text().contains("written after the API came back") {
        assert!(Instant::now() < deadline, "{}", d.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Written once: no retry goes on after it landed.
    let landed = patches();
    std::thread::sleep(Duration::from_millis(4500));
    assert_eq!(patches(), landed, "the daemon went on patching after the status landed");
    assert!(run("DEL").success());
    assert_eq!((n.pod_links(), n.held(), n.cached()), (vec!["lo".to_string()], 0, 0));
}

/// A fake sysfs in which nic0 is PCI function `pci` with RDMA device `rdma`.
fn nic0_as(pci: &str, rdma: &str) -> tempfile::TempDir {
    let sys = tempfile::tempdir().unwrap();
    let pf = sys.path().join("devices/pci0000:3a").join(pci);
    std::fs::create_dir_all(pf.join("infiniband").join(rdma)).unwrap();
    std::fs::create_dir_all(sys.path().join("class/net/nic0")).unwrap();
    std::os::unix::fs::symlink(&pf, sys.path().join("class/net/nic0/device")).unwrap();
    sys
}

#[test]
fn in_process_delegates_read_the_node_through_their_requests_sysfs_not_the_daemons_environment() {
    let n = Node::new();
    // One daemon, its own environment naming no sysfs root; two requests, each naming another
    // fake tree: each in-process plexus-macvlan reads its own request's view of the node.
    let _d = n.daemon(&[]);
    let devinfo = n.dir.path().join("devinfo");
    let policy = plexus_tests::write_policy(
        n.dir.path(),
        "policy.json",
        &json!({"dataRoots": [std::env::temp_dir()], "deviceInfoDir": devinfo}),
    );
    let trees = [("pod1", "0000:3b:00.1", "mlx5_1"), ("pod2", "0000:5e:00.0", "mlx5_7")];
    let sysfs: Vec<tempfile::TempDir> = trees.iter().map(|(_, pci, rdma)| nic0_as(pci, rdma)).collect();
    let run = |verb: &str, i: usize| {
        let (container, pod) = if i == 0 { ("pod1", n.lab.pod.path()) } else { ("pod2", n.pod2.path()) };
        PluginRun::new(plugin_bin("plexus"), verb)
            .attachment(container, &pod, "eth0", &bin_dir().display().to_string())
            .env("PLEXUS_POLICY", policy.to_str().unwrap())
            .env("PLEXUS_SYSFS_ROOT", sysfs[i].path().to_str().unwrap())
            .stdin(&n.conf("rail0"))
            .in_netns(&n.lab.node)
            .run()
    };
    for (i, (container, pci, rdma)) in trees.iter().enumerate() {
        let out = run("ADD", i);
        assert!(out.success(), "{container}: {}", out.stdout);
        let doc: Value =
            serde_json::from_slice(&std::fs::read(devinfo.join(format!("default-rail0-{container}_net1"))).unwrap())
                .unwrap();
        assert_eq!((doc["pci"]["pci-address"].as_str(), doc["pci"]["rdma-device"].as_str()), (Some(*pci), Some(*rdma)));
    }
    assert!(!n.shim_log().contains("thin mode"), "both served by the daemon: {}", n.shim_log());
    for i in 0..2 {
        assert!(run("DEL", i).success());
    }
    assert_eq!(std::fs::read_dir(&devinfo).map(|d| d.count()).unwrap_or(0), 0);
}

#[test]
fn requests_naming_two_node_policies_each_run_under_their_own_and_a_changed_one_is_read_again() {
    let n = Node::new();
    // One daemon; two requests, each naming another policy (each its own deviceInfoDir): the
    // in-process delegates of each write where its own policy says. The daemon keeps what it read
    // per file, not one policy for the process: rewritten, a policy is read again.
    let _d = n.daemon(&[]);
    let sysfs = nic0_as("0000:3b:00.1", "mlx5_1");
    let policy = |name: &str, devinfo: &Path| {
        plexus_tests::write_policy(
            n.dir.path(),
            name,
            &json!({"dataRoots": [std::env::temp_dir()], "deviceInfoDir": devinfo}),
        )
    };
    let dirs: Vec<PathBuf> = ["devinfo-a", "devinfo-b", "devinfo-a2"].iter().map(|d| n.dir.path().join(d)).collect();
    let policies = [policy("a.json", &dirs[0]), policy("b.json", &dirs[1])];
    let run = |verb: &str, i: usize| {
        let (container, pod) = if i == 0 { ("pod1", n.lab.pod.path()) } else { ("pod2", n.pod2.path()) };
        PluginRun::new(plugin_bin("plexus"), verb)
            .attachment(container, &pod, "eth0", &bin_dir().display().to_string())
            .env("PLEXUS_POLICY", policies[i].to_str().unwrap())
            .env("PLEXUS_SYSFS_ROOT", sysfs.path().to_str().unwrap())
            .stdin(&n.conf("rail0"))
            .in_netns(&n.lab.node)
            .run()
    };
    let written = |dir: &Path| std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
    for i in 0..2 {
        let out = run("ADD", i);
        assert!(out.success(), "{i}: {}", out.stdout);
    }
    assert_eq!((written(&dirs[0]), written(&dirs[1])), (1, 1), "each request under its own policy");
    assert!(run("DEL", 0).success());
    policy("a.json", &dirs[2]);
    let out = run("ADD", 0);
    assert!(out.success(), "{}", out.stdout);
    assert_eq!((written(&dirs[0]), written(&dirs[2])), (0, 1), "the rewritten policy was read again");
    assert!(!n.shim_log().contains("thin mode"), "all served by the daemon: {}", n.shim_log());
    assert!(run("DEL", 0).success() && run("DEL", 1).success());
    assert_eq!((written(&dirs[1]), written(&dirs[2])), (0, 0));
}
