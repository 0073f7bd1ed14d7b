//! plexus upgraded and rolled back under load on the real node of `scripts/cluster.sh`
//! ([`plexus_tests::cluster`]): its DaemonSet rolled from the previous release (its chart and its
//! image, built from its commit: `scripts/previous-release.sh`) to this tree's and back, and
//! between thin and daemon mode, seven Helm upgrades in a row (as docs/migrating.md has them),
//! while pods are created and deleted without a pause: the version-skew rule on a real node.
//! No pod's ADD or DEL may fail on the way (containerd's log is read for both), every pod must
//! come up, and at the end nothing is left: addresses, caches, state, links.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use plexus_tests::cluster::{Cluster, repo, wait_until};
use plexus_tests::previous_release;

/// `helm upgrade` of the release to `chart` with `set` (values kept otherwise), waiting for the
/// rollout.
fn upgrade(c: &Cluster, chart: &Path, set: &str) {
    let kubeconfig = c.var("KUBECONFIG");
    let args = ["--kubeconfig", kubeconfig, "-n", "kube-system", "upgrade", "plexus", chart.to_str().unwrap()];
    let (ok, out) =
        c.peer("helm", &[&args[..], &["--reuse-values", "--set", set, "--wait", "--timeout", "180s"]].concat(), None);
    if !ok {
        let pods = c.kubectl(&["-n", "kube-system", "describe", "pods", "-l", "app.kubernetes.io/name=plexus"], None).1;
        let logs =
            c.kubectl(&["-n", "kube-system", "logs", "-l", "app.kubernetes.io/name=plexus", "--tail=40"], None).1;
        panic!("helm upgrade --set {set}: {out}\n{pods}\n{logs}");
    }
    let (ok, out) = c.kubectl(&["-n", "kube-system", "rollout", "status", "daemonset/plexus", "--timeout=120s"], None);
    assert!(ok, "{out}");
}

/// One worker of the churn: pods `churn-W-N` on NAD `rail0`, each created, waited for and deleted,
/// one after the other until `stop`; what went wrong, and how many pods came and went.
fn churn(c: &Cluster, worker: usize, stop: &AtomicBool) -> (Vec<String>, usize) {
    let (mut failed, mut done) = (Vec::new(), 0);
    while !stop.load(Ordering::SeqCst) {
        let name = format!("churn-{worker}-{done}");
        let (ok, out) = c.kubectl(&["apply", "-f", "-"], Some(&c.pod("default", &name, "rail0")));
        if !ok {
            failed.push(format!("{name}: apply: {out}"));
            break;
        }
        let pod = format!("pod/{name}");
        let (ok, out) = c.kubectl(&["-n", "default", "wait", "--for=condition=Ready", &pod, "--timeout=90s"], None);
        if !ok {
            failed
                .push(format!("{name} not Ready: {out}\n{}", c.kubectl(&["-n", "default", "describe", &pod], None).1));
        }
        let (ok, out) = c.kubectl(&["-n", "default", "delete", "--wait=true", "--timeout=120s", &pod], None);
        if !ok {
            failed.push(format!("{name}: delete: {out}"));
            break;
        }
        done += 1;
    }
    (failed, done)
}

#[test]
fn plexus_rolled_from_the_previous_release_to_this_one_and_back_and_between_modes_under_pod_churn_fails_no_add_or_del()
{
    let c = Cluster::bare(None);
    let before = c.node_state();
    // The previous release (its image as `localhost/plexus:previous`, its chart) in thin mode.
    let previous = previous_release();
    c.import_image("previous", &previous.join("bin"));
    let previous_chart = previous.join("deploy/helm/plexus");
    // The previous release is built unoptimised (scripts/previous-release.sh): its binaries are
    // twice the shipped size, and 0.1.0's installer held a binary and its installed copy in memory
    // at once (this one streams them), over the thin-mode pod's default 64 MiB. Both releases get
    // room for that here; what is rolled is the releases' code, not their limits.
    let resources = r#"--set-json resources={"requests":{"cpu":"10m","memory":"16Mi"},"limits":{"memory":"256Mi"}}"#;
    c.install_release("", false, "helm", Some((&previous_chart, "previous")), resources);
    c.apply(&c.macvlan_nad("default", "rail0", "ens1f0np0", "198.18.237.0/24"));
    let failures_before = c.cni_failures();
    let started = Instant::now();
    let stop = AtomicBool::new(false);
    let phase = |what: &str| eprintln!("{:>6.1} s  {what}", started.elapsed().as_secs_f64());

    // This tree's image, `localhost/plexus:test` (cluster-install.sh imported it), and chart.
    let this = c.release_build();
    let this_chart = repo().join("deploy/helm/plexus");
    let conf = Path::new(c.var("CNI_CONF_DIR")).join("00-plexus.conflist");
    // Each step a Helm upgrade to a release's chart and image; after it, the node has that
    // release's binaries, each replaced whole (a new file renamed over the old), and the mode's
    // meta config.
    let steps = [
        ("image.tag=test", "test", false),
        ("mode=daemon", "test", true),
        ("image.tag=previous", "previous", true),
        ("mode=thin", "previous", false),
        ("image.tag=test", "test", false),
        ("mode=daemon", "test", true),
        ("image.tag=previous", "previous", true),
    ];
    let results = std::thread::scope(|s| {
        // The workers stop when this scope's body ends, a panic included (the scope waits for them).
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let stopping = StopOnDrop(&stop);
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (c, stop) = (&c, &stop);
                s.spawn(move || churn(c, w, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_secs(3));
        for (set, tag, daemon) in steps {
            let (chart, image) =
                if tag == "test" { (&this_chart, this.clone()) } else { (&previous_chart, previous.join("bin")) };
            phase(&format!(
                "helm upgrade to {} --set {set}",
                if tag == "test" { "this release" } else { "the previous" }
            ));
            upgrade(&c, chart, set);
            for e in std::fs::read_dir(previous.join("bin")).unwrap().flatten() {
                let (on_node, shipped) =
                    (Path::new(c.var("CNI_BIN_DIR")).join(e.file_name()), image.join(e.file_name()));
                assert!(
                    std::fs::read(&on_node).unwrap() == std::fs::read(&shipped).unwrap(),
                    "{} is image {tag}'s",
                    on_node.display()
                );
            }
            wait_until("the meta config of the mode", Duration::from_secs(30), || {
                std::fs::read_to_string(&conf).is_ok_and(|conf| conf.contains("daemonSocket") == daemon)
            });
            if daemon {
                wait_until("the daemon serves the churn's requests", Duration::from_secs(60), || {
                    c.daemon_metrics().contains("plexus_daemon_request_duration_seconds_count{")
                });
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        drop(stopping);
        phase("churn stopping");
        workers.into_iter().map(|w| w.join().unwrap()).collect::<Vec<_>>()
    });
    let failed: Vec<&String> = results.iter().flat_map(|(f, _)| f).collect();
    let cycled: usize = results.iter().map(|(_, n)| n).sum();
    phase(&format!("{cycled} pods created and deleted"));
    assert!(failed.is_empty(), "pods that failed during the rollouts:\n{failed:#?}");
    assert!(cycled >= 20, "only {cycled} pods came and went during {} rollouts", steps.len());
    let new_failures: Vec<String> = c.cni_failures().into_iter().filter(|l| !failures_before.contains(l)).collect();
    assert!(new_failures.is_empty(), "CNI ADDs or DELs that failed during the rollouts:\n{new_failures:#?}");
    // Nothing of the churn's pods left.
    wait_until("every address released", Duration::from_secs(60), || c.reservations() == 0);
    c.wait_no_state_or_cache();
    let (_, pods) = c.kubectl(&["-n", "default", "get", "pods", "-o", "name"], None);
    assert_eq!(pods.trim(), "", "{pods}");
    assert_eq!(c.node_state(), before, "the node's links and addresses as before the first pod");
}
