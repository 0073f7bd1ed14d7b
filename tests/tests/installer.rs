//! `plexusctl install`, the DaemonSet image's entrypoint, as a process: it installs into a host root,
//! keeps the kubeconfig's token current, passes SIGTERM to the daemon it runs, and uninstalls
//! only when its DaemonSet is gone or being deleted (asked of a fake API server over HTTPS in a
//! namespace of the test's own). The image and the real node: tests/cluster.rs.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use plexus_tests::fake_api::{FakeApi, Fault};
use plexus_tests::netns::Netns;
use plexus_tests::runner::enter_netns;
use plexus_tests::{plugin_bin, require_root};

/// An image's /plexus/bin: two plugins and the installer, plexusctl, which is a node tool too.
const SHIPPED: &[&str] = &["plexus", "plexus-macvlan", "plexusctl"];

/// A node's host root, an image's /plexus/bin, a service account, and the API server.
struct Pod {
    dir: tempfile::TempDir,
    ns: Netns,
    api: FakeApi,
    child: Option<Child>,
}

impl Pod {
    fn new() -> Pod {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let ns = Netns::new("inst");
        ns.ip(&["link", "set", "lo", "up"]);
        let api = FakeApi::start_in(&ns);
        let image = dir.path().join("image");
        std::fs::create_dir_all(&image).unwrap();
        for b in SHIPPED {
            std::fs::copy(plugin_bin(b), image.join(b)).unwrap();
        }
        let sa = dir.path().join("sa");
        std::fs::create_dir_all(&sa).unwrap();
        std::fs::write(sa.join("token"), api.token()).unwrap();
        std::fs::write(sa.join("ca.crt"), api.ca_pem()).unwrap();
        std::fs::write(sa.join("namespace"), "kube-system\n").unwrap();
        std::fs::write(
            dir.path().join("00-plexus.conflist"),
            r#"{"cniVersion": "1.0.0", "name": "plexus", "plugins": [{"type": "plexus"}]}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("policy.json"), r#"{"maxAttachments": 4}"#).unwrap();
        // What else is on the node: never touched.
        let host = dir.path().join("host");
        std::fs::create_dir_all(host.join("opt/cni/bin")).unwrap();
        std::fs::create_dir_all(host.join("etc/cni/net.d")).unwrap();
        std::fs::write(host.join("opt/cni/bin/bridge"), "the cluster network's").unwrap();
        std::fs::write(host.join("etc/cni/net.d/10-bridge.conflist"), "{}").unwrap();
        Pod { dir, ns, api, child: None }
    }

    fn host(&self, p: &str) -> PathBuf {
        self.dir.path().join("host").join(p)
    }

    fn command(&self, args: &[&str]) -> Command {
        let d = self.dir.path();
        let mut c = Command::new(d.join("image/plexusctl"));
        c.arg("install")
            .args(args)
            .arg("--host-root")
            .arg(d.join("host"))
            .arg("--service-account")
            .arg(d.join("sa"))
            .arg("--meta-config")
            .arg(d.join("00-plexus.conflist"))
            .arg("--policy")
            .arg(d.join("policy.json"))
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", self.api.server().rsplit(':').next().unwrap())
            .env_remove("CNI_COMMAND")
            .stdin(Stdio::null());
        enter_netns(&mut c, &self.ns.path());
        c
    }

    /// `plexusctl install run ... -- daemon...`, returning once its readiness probe (`installed`)
    /// says it is ready, which it did not say before; the meta config is in place by then.
    fn run(&mut self, daemon: &[&str]) {
        let ready = self.dir.path().join("ready").display().to_string();
        let probe = || {
            let out = Command::new(self.dir.path().join("image/plexusctl"))
                .args(["install", "installed", "--ready-file", &ready])
                .output()
                .unwrap();
            out.status.code()
        };
        assert_eq!(probe(), Some(1), "not ready before run has installed");
        let mut c = self.command(&[
            "run",
            "--refresh-seconds",
            "1",
            "--uninstall-when-removed",
            "plexus",
            "--ready-file",
            &ready,
        ]);
        if !daemon.is_empty() {
            c.arg("--").args(daemon);
        }
        self.child = Some(c.stderr(Stdio::piped()).spawn().unwrap());
        wait_for(|| probe() == Some(0), "the readiness probe");
        assert!(self.host("etc/cni/net.d/00-plexus.conflist").exists(), "ready means installed");
        assert!(self.host("opt/cni/bin/plexus-macvlan").exists(), "ready means installed");
    }

    /// SIGTERM, as the kubelet sends: the exit status and what it logged.
    fn terminate(&mut self) -> (Option<i32>, String) {
        let child = self.child.take().unwrap();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM)
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    fn installed(&self) -> Vec<&'static str> {
        [
            "opt/cni/bin/plexus",
            "opt/cni/bin/plexus-macvlan",
            "opt/cni/bin/plexusctl",
            "etc/cni/net.d/00-plexus.conflist",
            "etc/cni/net.d/plexus.d/plexus.kubeconfig",
            "etc/cni/net.d/plexus.d/token",
            "etc/cni/plexus/policy.json",
        ]
        .into_iter()
        .filter(|p| self.host(p).exists())
        .collect()
    }

    fn others_untouched(&self) {
        assert_eq!(std::fs::read_to_string(self.host("opt/cni/bin/bridge")).unwrap(), "the cluster network's");
        assert!(self.host("etc/cni/net.d/10-bridge.conflist").exists());
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_for(mut done: impl FnMut() -> bool, what: &str) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "waited 10 s for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn the_pod_installs_everything_keeps_the_token_current_and_stays_installed_when_only_the_pod_ends() {
    let mut pod = Pod::new();
    pod.api.set_daemonset("kube-system", "plexus", false);
    pod.run(&["sleep", "600"]);
    assert_eq!(pod.installed().len(), 7, "{:?}", pod.installed());
    assert_eq!(std::fs::read(pod.host("opt/cni/bin/plexus")).unwrap(), std::fs::read(plugin_bin("plexus")).unwrap());
    assert_eq!(mode(&pod.host("opt/cni/bin/plexus")), 0o755);
    assert_eq!(mode(&pod.host("etc/cni/net.d/plexus.d")), 0o700);
    assert_eq!(mode(&pod.host("etc/cni/net.d/plexus.d/token")), 0o600);
    assert_eq!(mode(&pod.host("etc/cni/plexus/policy.json")), 0o600);
    let kc = std::fs::read_to_string(pod.host("etc/cni/net.d/plexus.d/plexus.kubeconfig")).unwrap();
    assert!(kc.contains("\"tokenFile\": \"/etc/cni/net.d/plexus.d/token\""), "{kc}");
    assert!(!kc.contains(pod.api.token()), "the token is in its file only");
    pod.others_untouched();

    // The kubelet rotates the service account's token: the node's copy follows within a period.
    std::fs::write(pod.dir.path().join("sa/token"), "rotated-token").unwrap();
    wait_for(
        || std::fs::read(pod.host("etc/cni/net.d/plexus.d/token")).is_ok_and(|t| t == b"rotated-token"),
        "the rotated token on the node",
    );
    // An admin edits the meta config (its ConfigMap): replaced in place.
    std::fs::write(
        pod.dir.path().join("00-plexus.conflist"),
        r#"{"cniVersion": "1.0.0", "name": "plexus", "plugins": [{"type": "plexus", "logLevel": "debug"}]}"#,
    )
    .unwrap();
    wait_for(
        || std::fs::read_to_string(pod.host("etc/cni/net.d/00-plexus.conflist")).unwrap().contains("debug"),
        "the edited meta config",
    );
    std::fs::write(pod.dir.path().join("sa/token"), pod.api.token()).unwrap();

    // A rolling upgrade or a drain ends the pod, not the DaemonSet: the daemon gets SIGTERM, its
    // code is the pod's, plexus stays on the node.
    let (code, log) = pod.terminate();
    assert_eq!(code, Some(128 + 15), "{log}");
    assert!(log.contains("still there: plexus stays installed"), "{log}");
    assert_eq!(pod.installed().len(), 7);
    assert!(pod.api.requests().contains(&"GET /apis/apps/v1/namespaces/kube-system/daemonsets/plexus".to_string()));
}

#[test]
fn when_its_daemonset_is_removed_or_being_deleted_the_pod_uninstalls_everything_it_installed() {
    for deleting in [false, true] {
        let mut pod = Pod::new();
        pod.api.set_daemonset("kube-system", "plexus", false);
        pod.run(&["sleep", "600"]);
        if deleting {
            pod.api.set_daemonset("kube-system", "plexus", true);
        } else {
            pod.api.remove_daemonset("kube-system", "plexus");
        }
        let (code, log) = pod.terminate();
        assert_eq!(code, Some(143), "{log}");
        assert!(log.contains("is removed: uninstalling"), "{log}");
        assert_eq!(pod.installed(), Vec::<&str>::new(), "{log}");
        assert!(!pod.host("etc/cni/net.d/plexus.d").exists());
        pod.others_untouched();
    }
}

#[test]
fn when_the_api_server_cannot_say_plexus_stays_installed() {
    let mut pod = Pod::new();
    pod.run(&[]);
    pod.api.fault(Fault {
        method: "GET",
        path_contains: "/daemonsets/".into(),
        status: Some(503),
        delay: None,
        times: usize::MAX,
    });
    let (code, log) = pod.terminate();
    assert_eq!(code, Some(0), "no daemon: a clean end\n{log}");
    assert!(log.contains("could not tell whether DaemonSet plexus is removed"), "{log}");
    assert_eq!(pod.installed().len(), 7);
}

#[test]
fn the_daemon_ending_on_its_own_ends_the_pod_with_its_code() {
    let mut pod = Pod::new();
    pod.run(&["sh", "-c", "sleep 0.5; exit 3"]);
    let child = pod.child.take().unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(pod.installed().len(), 7, "no uninstall without SIGTERM");
}

#[test]
fn once_installs_and_uninstall_removes_exactly_that_and_is_idempotent() {
    let pod = Pod::new();
    let out = pod.command(&["once"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(pod.installed().len(), 7);
    for _ in 0..2 {
        let out = pod.command(&["uninstall"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(pod.installed(), Vec::<&str>::new());
        pod.others_untouched();
    }
}

#[test]
fn a_meta_config_that_is_not_json_installs_nothing_of_it_and_says_which_file() {
    let pod = Pod::new();
    std::fs::write(pod.dir.path().join("00-plexus.conflist"), "{\"cniVersion\":").unwrap();
    let out = pod.command(&["once"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("00-plexus.conflist") && err.contains("not JSON"), "{err}");
    assert!(!pod.host("etc/cni/net.d/00-plexus.conflist").exists());
}
