//! Unit tests of the meta-plugin's steps, without root: the order attachments run in, parallel
//! groups, the rollback of a failed ADD and DEL past failures, on a recording fake in place of
//! the delegates (the [`Delegates`] seam); and the request's log in a group's threads.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use plexus_cni::{CniResult, Command, Error};
use plexus_node::Policy;
use plexus_plugin::undo::Undo;
use serde_json::{Value, json};

use crate::attach::{Step, attach_all, delete_all, roll_back};
use crate::attachment::Delegates;
use crate::attachment::{Attachment, DelegateEnv};
use crate::cache::{self, Cache};
use crate::pod::Pod;

/// Delegates that record each call, refuse the networks named, and, with `together` > 1, hold
/// each secondary ADD until that many run at once (for 2 s at most): the proof that a group runs
/// concurrently, which calls one after another would never give.
#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<(Command, String)>>,
    refuse_add: Vec<&'static str>,
    refuse_del: Vec<(&'static str, u32)>,
    together: usize,
    running: Mutex<usize>,
    changed: Condvar,
    most_at_once: AtomicUsize,
}

impl Fake {
    fn calls(&self, command: Command) -> Vec<String> {
        self.calls.lock().unwrap().iter().filter(|(c, _)| *c == command).map(|(_, n)| n.clone()).collect()
    }
}

/// What a fake delegate's ADD returns: the attachment's interface, nothing else.
fn interface_named(a: &Attachment) -> Result<(CniResult, Value), Error> {
    let raw = json!({"cniVersion": "1.0.0", "interfaces": [{"name": a.ifname}]});
    Ok((CniResult::parse(raw.to_string().as_bytes())?, raw))
}

impl Delegates for Fake {
    fn add(&self, a: &Attachment, _: &DelegateEnv) -> Result<(CniResult, Value), Error> {
        self.calls.lock().unwrap().push((Command::Add, a.network.clone()));
        let mut running = self.running.lock().unwrap();
        *running += 1;
        self.most_at_once.fetch_max(*running, Ordering::SeqCst);
        self.changed.notify_all();
        if self.together > 1 && !a.cluster_network {
            running =
                self.changed.wait_timeout_while(running, Duration::from_secs(2), |n| *n < self.together).unwrap().0;
        }
        *running -= 1;
        drop(running);
        if self.refuse_add.contains(&a.network.as_str()) {
            return Err(Error::new(plexus_cni::code::INVALID_NETWORK_CONFIG, format!("{} refused", a.network)));
        }
        interface_named(a)
    }

    fn del(&self, a: &Attachment, _: &DelegateEnv) -> Result<(), Error> {
        self.calls.lock().unwrap().push((Command::Del, a.network.clone()));
        match self.refuse_del.iter().find(|(n, _)| *n == a.network) {
            Some((n, code)) => Err(Error::new(*code, format!("{n} is stuck"))),
            None => Ok(()),
        }
    }

    fn check(&self, a: &Attachment, _: &DelegateEnv) -> Result<(), Error> {
        self.calls.lock().unwrap().push((Command::Check, a.network.clone()));
        Ok(())
    }
}

/// The cluster network on eth0, then `rail0`.. on net1.. .
fn attachments(rails: usize) -> Vec<Attachment> {
    let one = |network: String, ifname: String, cluster: bool| {
        serde_json::from_value(json!({"network": network, "ifname": ifname, "master": cluster,
            "conf": {"cniVersion": "1.0.0", "name": network, "type": "fake"}}))
        .unwrap()
    };
    let mut all = vec![one("cluster".into(), "eth0".into(), true)];
    all.extend((0..rails).map(|i| one(format!("rail{i}"), format!("net{}", i + 1), false)));
    all
}

fn env() -> DelegateEnv {
    let vars = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/run/netns/plexus-none"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/nonexistent"),
    ];
    let req = plexus_plugin::testing::request(
        &vars,
        &json!({"cniVersion": "1.0.0", "name": "plexus", "type": "plexus"}),
        Policy::default(),
    );
    DelegateEnv { cni: req.env, runner: req.runner }
}

/// Meta::add's steps around the delegates: the cache written, its removal and each group
/// pushed on the undo list, the groups attached, and a failure rolled back.
fn add(fake: &Fake, rails: usize, parallel: bool, dir: &std::path::Path) -> (Result<Vec<CniResult>, Error>, Cache) {
    let cache_path = dir.join("c1");
    let mut state = Cache {
        version: cache::CACHE_VERSION,
        container_id: "c1".into(),
        netns: None,
        pod_ref: None,
        attachments: attachments(rails),
    };
    cache::save(&cache_path, &state).unwrap();
    let mut undo = Undo::new();
    undo.push(Step::Cache(cache_path.clone()));
    let env = env();
    let out = match attach_all(&mut state, parallel, &Pod::default(), &env, &cache_path, &mut undo, fake) {
        Ok(results) => {
            undo.commit();
            Ok(results)
        }
        Err(e) => Err(roll_back(undo, e, &state.attachments, &env, &Policy::default(), fake)),
    };
    (out, state)
}

#[test]
fn one_at_a_time_the_attachments_are_added_in_annotation_order_and_each_result_is_cached() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    let (results, _) = add(&fake, 3, false, dir.path());
    let results = results.unwrap();
    assert_eq!(fake.calls(Command::Add), ["cluster", "rail0", "rail1", "rail2"]);
    assert_eq!(fake.most_at_once.load(Ordering::SeqCst), 1);
    let names: Vec<_> = results.iter().map(|r| r.interfaces[0].name.clone()).collect();
    assert_eq!(names, ["eth0", "net1", "net2", "net3"]);
    let cached = cache::load(&dir.path().join("c1")).unwrap().unwrap();
    assert!(cached.attachments.iter().all(|a| a.result.is_some()), "{:?}", cached.attachments);
}

#[test]
fn in_parallel_the_cluster_network_goes_first_then_every_other_attachment_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake { together: 4, ..Fake::default() };
    let (results, _) = add(&fake, 4, true, dir.path());
    let names: Vec<_> = results.unwrap().iter().map(|r| r.interfaces[0].name.clone()).collect();
    assert_eq!(names, ["eth0", "net1", "net2", "net3", "net4"], "results in annotation order");
    assert_eq!(fake.calls(Command::Add)[0], "cluster");
    assert_eq!(fake.most_at_once.load(Ordering::SeqCst), 4, "the four rails at once");
}

#[test]
fn a_failed_add_dels_what_was_sent_an_add_last_first_the_failed_one_too_and_removes_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake { refuse_add: vec!["rail1"], ..Fake::default() };
    let (out, _) = add(&fake, 3, false, dir.path());
    let e = out.unwrap_err();
    assert_eq!(e.code, plexus_cni::code::INVALID_NETWORK_CONFIG, "{e}");
    assert!(e.msg.contains("rail1 refused"), "{e}");
    assert_eq!(fake.calls(Command::Add), ["cluster", "rail0", "rail1"], "rail2 never ran");
    assert_eq!(fake.calls(Command::Del), ["rail1", "rail0", "cluster"]);
    assert!(!dir.path().join("c1").exists(), "the cache file is gone");
}

#[test]
fn a_failed_add_in_a_parallel_group_dels_the_whole_group_then_the_cluster_network() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake { refuse_add: vec!["rail2"], ..Fake::default() };
    let (out, _) = add(&fake, 4, true, dir.path());
    assert!(out.unwrap_err().msg.contains("rail2 refused"));
    let mut dels = fake.calls(Command::Del);
    assert_eq!(dels.pop().as_deref(), Some("cluster"), "the cluster network last: {dels:?}");
    dels.sort();
    assert_eq!(dels, ["rail0", "rail1", "rail2", "rail3"], "the rails that succeeded too");
}

#[test]
fn a_rollback_that_cannot_del_says_so_beside_the_adds_error() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake { refuse_add: vec!["rail1"], refuse_del: vec![("rail0", 11)], ..Fake::default() };
    let e = add(&fake, 2, false, dir.path()).0.unwrap_err();
    assert!(e.msg.contains("rail1 refused"), "the ADD's error stays the error: {e}");
    let text = format!("{e} {}", e.details);
    assert!(text.contains("rail0 is stuck"), "{text}");
    assert_eq!(fake.calls(Command::Del), ["rail1", "rail0", "cluster"], "kept going past the failure");
}

#[test]
fn del_walks_the_groups_in_reverse_past_failures_keeping_each_attachments_code() {
    let fake = Fake { refuse_del: vec![("rail0", 11), ("rail2", 7)], ..Fake::default() };
    let all = attachments(3);
    let failed: Vec<(String, Error)> = delete_all(&all, &env(), &Policy::default(), false, &fake).into_iter().collect();
    assert_eq!(fake.calls(Command::Del), ["rail2", "rail1", "rail0", "cluster"]);
    let got: Vec<(&str, u32)> = failed.iter().map(|(what, e)| (what.as_str(), e.code)).collect();
    assert_eq!(got, [("network rail2 (net3)", 7), ("network rail0 (net1)", 11)]);
}

/// Delegates that hold the ADD of network `slow` until told to let it go, and tell when each ADD
/// started and ended.
#[derive(Default)]
struct Gated {
    started: Mutex<Vec<String>>,
    ended: Mutex<Vec<String>>,
    released: Mutex<bool>,
    changed: Condvar,
}

impl Gated {
    fn wait_for(&self, what: impl Fn(&[String], &[String]) -> bool) {
        let mut released = self.released.lock().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !what(&self.started.lock().unwrap(), &self.ended.lock().unwrap()) {
            assert!(std::time::Instant::now() < deadline, "the delegates never got there");
            released = self.changed.wait_timeout(released, Duration::from_millis(50)).unwrap().0;
        }
    }

    fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.changed.notify_all();
    }
}

impl Gated {
    /// A delegate ADD: noted when it starts and ends; `slow`'s waits for [`Gated::release`].
    fn add(&self, a: &Attachment) {
        self.started.lock().unwrap().push(a.network.clone());
        self.changed.notify_all();
        if a.network == "slow" {
            let released = self.released.lock().unwrap();
            drop(self.changed.wait_while(released, |r| !*r).unwrap());
        }
        self.ended.lock().unwrap().push(a.network.clone());
        self.changed.notify_all();
    }
}

/// Delegates whose ADD runs the closure, then returns the attachment's interface; DEL and CHECK
/// succeed.
struct AddsOnly<F>(F);

impl<F: Fn(&Attachment) + Send + Sync> Delegates for AddsOnly<F> {
    fn add(&self, a: &Attachment, _: &DelegateEnv) -> Result<(CniResult, Value), Error> {
        (self.0)(a);
        interface_named(a)
    }

    fn del(&self, _: &Attachment, _: &DelegateEnv) -> Result<(), Error> {
        Ok(())
    }

    fn check(&self, _: &Attachment, _: &DelegateEnv) -> Result<(), Error> {
        Ok(())
    }
}

#[test]
fn the_device_move_turn_is_held_for_a_pods_moves_only_not_for_a_slow_delegate_beside_them() {
    let dir = tempfile::tempdir().unwrap();
    let one = |network: &str, ifname: &str, plugin: &str| -> Attachment {
        serde_json::from_value(json!({"network": network, "ifname": ifname,
            "conf": {"cniVersion": "1.0.0", "name": network, "type": plugin}}))
        .unwrap()
    };
    let mut state = Cache {
        version: cache::CACHE_VERSION,
        container_id: "c1".into(),
        netns: None,
        pod_ref: None,
        attachments: vec![one("port0", "net1", "plexus-host-device"), one("slow", "net2", "fake")],
    };
    let cache_path = dir.path().join("c1");
    cache::save(&cache_path, &state).unwrap();
    let gated = Gated::default();
    std::thread::scope(|s| {
        let pod = s.spawn(|| {
            let mut undo = Undo::new();
            let delegates = AddsOnly(|a: &Attachment| gated.add(a));
            attach_all(&mut state, true, &Pod::default(), &env(), &cache_path, &mut undo, &delegates).map(|r| r.len())
        });
        // The pod's port has moved and its slow delegate still runs: the node's turn comes free
        // for another pod's moves (it was held for the whole group, until the slow one ended).
        gated.wait_for(|started, ended| started.iter().any(|n| n == "slow") && ended.iter().any(|n| n == "port0"));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let free = loop {
            let turn = std::fs::File::open(dir.path()).unwrap();
            match nix::fcntl::Flock::lock(turn, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(taken) => break Some(taken),
                Err(_) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                Err(_) => break None,
            }
        };
        let still_slow = !gated.ended.lock().unwrap().iter().any(|n| n == "slow");
        gated.release();
        assert!(free.is_some() && still_slow, "the turn was still held while only the slow delegate ran");
        drop(free);
        assert_eq!(pod.join().unwrap().unwrap(), 2, "both attached, results in order");
    });
}

/// A log that keeps what is written to it.
#[derive(Clone, Default)]
struct Kept(Arc<Mutex<Vec<u8>>>);

impl Write for Kept {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn what_a_groups_threads_log_reaches_the_requests_log_in_its_span() {
    let kept = Kept::default();
    let log = kept.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || log.clone()).with_ansi(false).finish();
    // The request's log is this thread's subscriber, as the plugin entry point sets it.
    let _request = tracing::subscriber::set_default(subscriber);
    let span = tracing::info_span!("cni", container = "c1");
    let _in = span.enter();
    let answers = crate::attach::run_group(&[0, 1, 2, 3], |i| {
        tracing::info!("attaching rail {i}");
        i * 10
    });
    assert_eq!(answers, [0, 10, 20, 30]);
    let text = String::from_utf8(kept.0.lock().unwrap().clone()).unwrap();
    for i in 0..4 {
        assert!(
            text.lines().any(|l| l.contains(&format!("attaching rail {i}")) && l.contains("container=\"c1\"")),
            "rail {i} missing:\n{text}"
        );
    }
}

/// A node switched from Multus: `dir/multus` holds Multus's cache of container `0123abcd` (three
/// delegates) and libcni's result of its macvlan; `dir/plexus` is plexus's cache directory.
fn switched_node(dir: &std::path::Path) -> Value {
    let multus = dir.join("multus");
    std::fs::create_dir_all(multus.join("results")).unwrap();
    std::fs::write(multus.join("0123abcd"), include_str!("../tests/multus/v4-fields-cache.json")).unwrap();
    std::fs::write(multus.join("results/rail0-0123abcd-net1"), include_str!("../tests/multus/v4-fields-result.json"))
        .unwrap();
    json!({"cniVersion": "1.0.0", "name": "plexus", "type": "plexus", "parallel": false,
        "cniDir": dir.join("plexus"), "multusCacheDir": multus})
}

fn meta_request(command: &str, container_id: &str, conf: &Value) -> plexus_plugin::Request {
    meta_request_in(command, container_id, conf, std::path::Path::new("/nonexistent"))
}

fn meta_request_in(
    command: &str,
    container_id: &str,
    conf: &Value,
    cni_path: &std::path::Path,
) -> plexus_plugin::Request {
    let vars = [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", container_id),
        ("CNI_NETNS", ""),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", cni_path.to_str().unwrap()),
    ];
    plexus_plugin::testing::request(&vars, conf, Policy::default())
}

#[test]
fn del_of_a_sandbox_multus_attached_dels_what_its_cache_names_in_reverse_then_removes_multus_files() {
    let dir = tempfile::tempdir().unwrap();
    let conf = switched_node(dir.path());
    let fake = Arc::new(Fake::default());
    let meta = super::Meta { view: None, delegates: fake.clone() };
    plexus_plugin::Plugin::del(&meta, &meta_request("DEL", "0123abcd", &conf)).unwrap();
    assert_eq!(fake.calls(Command::Del), ["exclusive", "rail0", "cbr0"]);
    assert!(!dir.path().join("multus/0123abcd").exists(), "Multus's cache removed");
    assert!(!dir.path().join("multus/results/rail0-0123abcd-net1").exists(), "libcni's result removed");
    // DEL again (the runtime retries): nothing left to delete, and it succeeds.
    plexus_plugin::Plugin::del(&meta, &meta_request("DEL", "0123abcd", &conf)).unwrap();
    assert_eq!(fake.calls(Command::Del).len(), 3);
}

#[test]
fn a_multus_sandbox_whose_del_fails_keeps_multus_cache_when_del_is_to_be_retried() {
    let dir = tempfile::tempdir().unwrap();
    let mut conf = switched_node(dir.path());
    conf["retryDeleteOnError"] = json!(true);
    let fake = Arc::new(Fake { refuse_del: vec![("rail0", 11)], ..Fake::default() });
    let meta = super::Meta { view: None, delegates: fake.clone() };
    let err = plexus_plugin::Plugin::del(&meta, &meta_request("DEL", "0123abcd", &conf)).unwrap_err();
    assert!(format!("{err:?}").contains("rail0"), "{err:?}");
    assert_eq!(fake.calls(Command::Del), ["exclusive", "rail0", "cbr0"], "past the failure");
    assert!(dir.path().join("multus/0123abcd").exists(), "kept for the retry");
}

/// `dir/bin/recorder`, a delegate that writes the config it gets to `dir/<verb>.json`.
fn recorder(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let recorder = bin.join("recorder");
    std::fs::write(&recorder, format!("#!/bin/sh\ncat > {}/$CNI_COMMAND.json\n", dir.display())).unwrap();
    std::fs::set_permissions(&recorder, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// GC on a switched node: a stale Multus sandbox is deleted and its files removed; a valid one is
/// kept, and the cluster network's own GC (a real delegate process that records its config) is
/// told it is still valid — else an IPAM's GC would release the addresses of a running pod.
#[test]
fn gc_dels_multus_sandboxes_the_runtime_no_longer_knows_and_tells_the_networks_gc_of_the_valid_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut conf = switched_node(dir.path());
    let multus = dir.path().join("multus");
    std::fs::copy(multus.join("0123abcd"), multus.join("4567ef01")).unwrap();
    let bin = recorder(dir.path());
    conf["delegates"] = json!([{"cniVersion": "1.1.0", "name": "cbr0", "type": "recorder"}]);
    conf["cni.dev/valid-attachments"] = json!([{"containerID": "4567ef01", "ifname": "eth0"}]);
    let fake = Arc::new(Fake::default());
    let meta = super::Meta { view: None, delegates: fake.clone() };
    plexus_plugin::Plugin::gc(&meta, &meta_request_in("GC", "", &conf, &bin)).unwrap();
    assert_eq!(fake.calls(Command::Del), ["exclusive", "rail0", "cbr0"], "one sandbox's delegates");
    assert!(!multus.join("0123abcd").exists());
    assert!(multus.join("4567ef01").exists(), "a valid container's cache stays");
    let gc: Value = serde_json::from_slice(&std::fs::read(dir.path().join("GC.json")).unwrap()).unwrap();
    assert_eq!(gc["cni.dev/valid-attachments"], json!([{"containerID": "4567ef01", "ifname": "eth0"}]));
}

/// A container plexus attached with `writeMultusCache` has both caches: GC DELs it once, from
/// plexus's, and removes both.
#[test]
fn gc_of_a_container_plexus_attached_dels_it_once_and_removes_the_multus_cache_written_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut conf = switched_node(dir.path());
    std::fs::create_dir(dir.path().join("plexus")).unwrap();
    let ours = Cache {
        version: cache::CACHE_VERSION,
        container_id: "0123abcd".into(),
        netns: None,
        pod_ref: None,
        attachments: attachments(1),
    };
    cache::save(&dir.path().join("plexus/0123abcd"), &ours).unwrap();
    let bin = recorder(dir.path());
    conf["delegates"] = json!([{"cniVersion": "1.1.0", "name": "cbr0", "type": "recorder"}]);
    conf["cni.dev/valid-attachments"] = json!([]);
    let fake = Arc::new(Fake::default());
    let meta = super::Meta { view: None, delegates: fake.clone() };
    plexus_plugin::Plugin::gc(&meta, &meta_request_in("GC", "", &conf, &bin)).unwrap();
    assert_eq!(fake.calls(Command::Del), ["rail0", "cluster"], "plexus's attachments, once");
    assert!(!dir.path().join("plexus/0123abcd").exists());
    assert!(!dir.path().join("multus/0123abcd").exists());
}

#[test]
fn writing_multus_cache_into_plexus_own_cache_directory_is_refused_naming_the_keys() {
    let conf = json!({"cniVersion": "1.0.0", "name": "plexus", "type": "plexus",
        "cniDir": "/var/lib/cni/multus", "multusCacheDir": "/var/lib/cni/multus", "writeMultusCache": true});
    let err = crate::conf::MetaConf::load(&meta_request("DEL", "c1", &conf)).unwrap_err();
    assert_eq!(err.code, plexus_cni::code::INVALID_NETWORK_CONFIG);
    assert!(err.msg.contains("\"writeMultusCache\"") && err.msg.contains("/var/lib/cni/multus"), "{err:?}");
}

/// When a pod's delegate ADD started and ended.
type Ran = Arc<Mutex<Vec<(&'static str, std::time::Instant, std::time::Instant)>>>;

#[test]
fn pods_moving_whole_devices_take_turns_and_pods_of_other_delegates_do_not_wait() {
    let dir = tempfile::tempdir().unwrap();
    let run = |kind: &'static str| {
        let ran: Ran = Arc::new(Mutex::new(Vec::new()));
        std::thread::scope(|s| {
            for pod in ["a", "b"] {
                let ran = ran.clone();
                let dir = dir.path();
                s.spawn(move || {
                    let rails = (0..3).map(|i| {
                        serde_json::from_value(json!({"network": format!("rail{i}"), "ifname": format!("net{}", i + 1),
                            "conf": {"cniVersion": "1.0.0", "name": "ports", "type": kind}}))
                        .unwrap()
                    });
                    let mut state = Cache {
                        version: cache::CACHE_VERSION,
                        container_id: pod.into(),
                        netns: None,
                        pod_ref: None,
                        attachments: rails.collect(),
                    };
                    let cache_path = dir.join(pod);
                    cache::save(&cache_path, &state).unwrap();
                    let mut undo = Undo::new();
                    // Each ADD takes 40 ms; when each of this pod's ran is noted.
                    let delegates = AddsOnly(|_: &Attachment| {
                        let start = std::time::Instant::now();
                        std::thread::sleep(Duration::from_millis(40));
                        ran.lock().unwrap().push((pod, start, std::time::Instant::now()));
                    });
                    attach_all(&mut state, true, &Pod::default(), &env(), &cache_path, &mut undo, &delegates).unwrap();
                    undo.commit();
                });
            }
        });
        let ran = ran.lock().unwrap().clone();
        let span = |pod| {
            let of: Vec<_> = ran.iter().filter(|r| r.0 == pod).collect();
            (of.iter().map(|r| r.1).min().unwrap(), of.iter().map(|r| r.2).max().unwrap())
        };
        let ((a0, a1), (b0, b1)) = (span("a"), span("b"));
        a1 <= b0 || b1 <= a0
    };
    assert!(run("plexus-host-device"), "one pod's device moves after the other's");
    assert!(!run("plexus-macvlan"), "macvlans are made at once");
}
