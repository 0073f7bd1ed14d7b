//! plexus-ipam as a process: concurrency, churn, kill -9, errors, idempotence, GC, CHECK, STATUS,
//! the etcd store against a real etcd, and end to end with plexus-macvlan in a real pod namespace.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use plexus_tests::etcd::Etcd;
use plexus_tests::{Lab, Outcome, PluginRun, plugin_bin, test_policy, write_policy};
use serde_json::{Value, json};

const IPAM: &str = "plexus-ipam";

fn conf(version: &str, ipam: Value) -> Value {
    json!({"cniVersion": version, "name": "rail0", "type": "test", "ipam": ipam})
}

fn file_ipam(dir: &Path, range: &str) -> Value {
    json!({"type": IPAM, "range": range, "dataDir": dir.to_str().unwrap(), "nodeName": "node-a"})
}

fn cni_path() -> String {
    plugin_bin(IPAM).parent().unwrap().display().to_string()
}

fn run(lab: &Lab, verb: &str, cid: &str, c: &Value) -> Outcome {
    run_args(lab, verb, cid, c, "")
}

fn run_args(lab: &Lab, verb: &str, cid: &str, c: &Value, args: &str) -> Outcome {
    run_under(lab, verb, cid, c, args, &test_policy())
}

/// A run under node policy `policy`.
fn run_under(lab: &Lab, verb: &str, cid: &str, c: &Value, args: &str, policy: &Path) -> Outcome {
    PluginRun::new(plugin_bin(IPAM), verb)
        .attachment(cid, &lab.pod.path(), "net1", &cni_path())
        .env("CNI_ARGS", args)
        .env("PLEXUS_POLICY", policy.to_str().unwrap())
        .stdin(c)
        .in_netns(&lab.node)
        .run()
}

fn address(out: &Outcome) -> String {
    out.result()["ips"][0]["address"].as_str().unwrap().to_string()
}

/// Read the file store directly (not through plexus): every held address file names a record
/// that lists it; no address is held twice. Returns the held addresses.
fn consistent_file_store(domain_dir: &Path) -> BTreeSet<String> {
    let mut held = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(domain_dir.join("ips")) else { return held };
    for e in entries {
        let e = e.unwrap();
        let ip = e.file_name().to_string_lossy().into_owned();
        let holder = std::fs::read_to_string(e.path()).unwrap();
        let record = domain_dir.join("attachments").join(&holder);
        let rec: Value = serde_json::from_slice(
            &std::fs::read(&record)
                .unwrap_or_else(|_| panic!("address {ip} is held by {holder}, which has no record: a leak")),
        )
        .unwrap();
        assert!(rec["ips"].as_array().unwrap().iter().any(|h| h["ip"] == ip.as_str()), "{holder}'s record lacks {ip}");
        assert!(held.insert(ip.clone()), "{ip} held twice");
    }
    held
}

#[test]
fn sixty_four_processes_at_once_get_sixty_four_distinct_addresses() {
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let c = conf("1.1.0", file_ipam(dir.path(), "198.18.8.0/24"));
    let addrs: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..64)
            .map(|i| {
                let (lab, c) = (&lab, &c);
                s.spawn(move || address(&run(lab, "ADD", &format!("ctr{i}"), c)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let distinct: BTreeSet<&String> = addrs.iter().collect();
    assert_eq!(distinct.len(), 64, "{addrs:?}");
    assert_eq!(consistent_file_store(&dir.path().join("default")).len(), 64);
}

#[test]
fn a_thousand_add_del_cycles_leave_nothing_allocated() {
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let c = conf("1.1.0", file_ipam(dir.path(), "198.18.9.0/26"));
    std::thread::scope(|s| {
        for t in 0..4 {
            let (lab, c) = (&lab, &c);
            s.spawn(move || {
                for i in 0..250 {
                    let cid = format!("t{t}c{i}");
                    let add = run(lab, "ADD", &cid, c);
                    assert!(add.success(), "{}", add.stdout);
                    let del = run(lab, "DEL", &cid, c);
                    assert!(del.success(), "{}", del.stdout);
                }
            });
        }
    });
    // Nothing leaked, and nothing of the store is left: it went with its last attachment.
    assert!(consistent_file_store(&dir.path().join("default")).is_empty(), "leaked addresses");
    assert!(!dir.path().exists(), "the store's directory outlived its attachments");
}

#[test]
fn kill_9_mid_add_and_mid_del_never_duplicates_or_leaks() {
    use std::process::{Command, Stdio};
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let c = conf("1.1.0", file_ipam(dir.path(), "198.18.10.0/24"));
    let domain = dir.path().join("default");
    let spawn = |verb: &str, cid: &str| {
        let mut child = Command::new(plugin_bin(IPAM))
            .env_clear()
            .env("CNI_COMMAND", verb)
            .env("PLEXUS_POLICY", test_policy())
            .env("CNI_CONTAINERID", cid)
            .env("CNI_NETNS", lab.pod.path())
            .env("CNI_IFNAME", "net1")
            .env("CNI_PATH", cni_path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write;
        let _ = child.stdin.take().unwrap().write_all(c.to_string().as_bytes());
        child
    };
    let mut killed = 0;
    for round in 0..150u64 {
        let cid = format!("k{round}");
        // Kill at a different moment each round: 0 to ~3 ms into the process.
        let mut add = spawn("ADD", &cid);
        std::thread::sleep(Duration::from_micros((round * 37) % 3000));
        killed += u32::from(add.try_wait().unwrap().is_none());
        let _ = add.kill();
        let _ = add.wait();
        if round % 2 == 0 {
            let mut del = spawn("DEL", &cid);
            std::thread::sleep(Duration::from_micros((round * 53) % 3000));
            let _ = del.kill();
            let _ = del.wait();
        }
        consistent_file_store(&domain);
    }
    assert!(killed > 20, "the loop must really kill processes mid-flight (killed {killed})");
    // What survived is consistent; the runtime's DEL of every attachment frees everything.
    for round in 0..150u64 {
        assert!(run(&lab, "DEL", &format!("k{round}"), &c).success());
    }
    assert!(consistent_file_store(&domain).is_empty(), "leaked after DEL of everything");
    // Records, temp files of killed processes, the domain, the directory: all gone with the last
    // attachment.
    assert!(!dir.path().exists(), "left: {:?}", plexus_tests::reliability::files(dir.path()));
}

#[test]
fn exhaustion_is_a_clear_error_and_status_reports_it() {
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let c = conf("1.1.0", file_ipam(dir.path(), "198.18.11.0/30"));
    assert!(run(&lab, "ADD", "a", &c).success());
    let status = PluginRun::new(plugin_bin(IPAM), "STATUS").stdin(&c).in_netns(&lab.node).run();
    assert!(status.success(), "one address left: {}", status.stdout);
    assert!(run(&lab, "ADD", "b", &c).success());
    let (code, msg, _) = run(&lab, "ADD", "c", &c).error();
    assert_eq!((code, msg.as_str()), (110, "no free address left in range 198.18.11.0/30-198.18.11.1-198.18.11.2"));
    let (code, msg, details) = PluginRun::new(plugin_bin(IPAM), "STATUS").stdin(&c).in_netns(&lab.node).run().error();
    assert_eq!(code, 50);
    assert!(msg.starts_with("no free address left in range 198.18.11.0/30"), "{msg}");
    assert_eq!(details, "2 of 2 addresses allocated");
}

#[test]
fn requested_addresses_are_granted_or_refused_by_name() {
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let mut c = conf("1.1.0", file_ipam(dir.path(), "198.18.12.0/24"));
    c["runtimeConfig"] = json!({"ips": ["198.18.12.77/24"]});
    assert_eq!(address(&run(&lab, "ADD", "a", &c)), "198.18.12.77/24");
    let (code, msg, _) = run(&lab, "ADD", "b", &c).error();
    // The runtime named no pod: the holder is only "another attachment", never its container ID.
    assert_eq!(
        (code, msg.as_str()),
        (111, "requested address 198.18.12.77 is already allocated to another attachment")
    );
    let plain = conf("1.1.0", file_ipam(dir.path(), "198.18.12.0/24"));
    let (code, msg, _) = run_args(&lab, "ADD", "c", &plain, "IgnoreUnknown=1;IP=198.19.0.1").error();
    assert_eq!(
        (code, msg.as_str()),
        (112, "requested address 198.19.0.1 is outside every range of this network (or excluded)")
    );
    let mut args_cni = plain.clone();
    args_cni["args"] = json!({"cni": {"ips": ["198.18.12.78"]}});
    assert_eq!(address(&run(&lab, "ADD", "d", &args_cni)), "198.18.12.78/24");
    assert_eq!(address(&run_args(&lab, "ADD", "e", &plain, "IP=198.18.12.79")), "198.18.12.79/24");
}

#[test]
fn bad_config_is_code_7_naming_key_and_value() {
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    for (ipam, want) in [
        (json!({"type": IPAM, "range": "198.18.0.0"}), "invalid range \"198.18.0.0\""),
        (json!({"type": IPAM, "range": "198.18.0.0/24", "exclude": ["nope"]}), "invalid exclude \"nope\""),
        (json!({"type": IPAM, "range": "198.18.0.0/24", "store": "redis"}), "store \"redis\" is neither \"file\""),
        (
            json!({"type": IPAM, "range": "198.18.0.0/24", "store": {"etcd": {"endpoints": []}}}),
            "store.etcd in a network config is refused",
        ),
        (json!({"type": IPAM}), "ipam needs \"range\" or \"ipRanges\""),
    ] {
        let mut ipam = ipam;
        ipam["dataDir"] = dir.path().to_str().unwrap().into();
        let (code, msg, _) = run(&lab, "ADD", "a", &conf("1.1.0", ipam)).error();
        assert_eq!(code, 7, "{msg}");
        assert!(msg.contains(want), "{msg} lacks {want}");
    }
}

#[test]
fn add_is_idempotent_and_a_recreated_pod_gets_its_address_back() {
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let c = conf("1.1.0", file_ipam(dir.path(), "198.18.13.0/24"));
    let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ml;K8S_POD_NAME=trainer-0";
    let first = address(&run_args(&lab, "ADD", "sandbox1", &c, args));
    assert_eq!(address(&run_args(&lab, "ADD", "sandbox1", &c, args)), first, "same attachment, same address");
    assert_eq!(address(&run_args(&lab, "ADD", "sandbox2", &c, args)), first, "re-created sandbox, same address");
    assert!(run(&lab, "DEL", "sandbox1", &c).success(), "DEL of the old sandbox");
    let held = consistent_file_store(&dir.path().join("default"));
    assert_eq!(held, BTreeSet::from([first.trim_end_matches("/24").to_string()]), "the new sandbox keeps it");
    assert!(run(&lab, "DEL", "sandbox2", &c).success());
    assert!(run(&lab, "DEL", "sandbox2", &c).success(), "nothing to release is success");
    assert!(consistent_file_store(&dir.path().join("default")).is_empty());
}

#[test]
fn check_matches_prev_result_and_gc_releases_only_stale_attachments_of_this_node() {
    let lab = Lab::new();
    let dir = tempfile::tempdir().unwrap();
    let c = conf("1.1.0", file_ipam(dir.path(), "198.18.14.0/24"));
    let r = run(&lab, "ADD", "keep", &c).result();
    for cid in ["stale1", "stale2"] {
        assert!(run(&lab, "ADD", cid, &c).success());
    }
    // Another network and another node share the domain; GC of rail0 on node-a leaves them.
    let mut other_net = c.clone();
    other_net["name"] = "rail1".into();
    assert!(run(&lab, "ADD", "othernet", &other_net).success());
    let mut other_node = c.clone();
    other_node["ipam"]["nodeName"] = "node-b".into();
    assert!(run(&lab, "ADD", "othernode", &other_node).success());

    let mut with_prev = c.clone();
    with_prev["prevResult"] = r.clone();
    assert!(run(&lab, "CHECK", "keep", &with_prev).success());
    let (code, _, _) = run(&lab, "CHECK", "stale1", &with_prev).error();
    assert_eq!(code, 104, "stale1 holds another address than prevResult");

    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "keep", "ifname": "net1"}]);
    let out = PluginRun::new(plugin_bin(IPAM), "GC").env("CNI_PATH", &cni_path()).stdin(&gc).in_netns(&lab.node).run();
    assert!(out.success(), "{}", out.stdout);
    let records: BTreeSet<String> = std::fs::read_dir(dir.path().join("default/attachments"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(records, BTreeSet::from(["keep=net1".into(), "othernet=net1".into(), "othernode=net1".into()]));
    assert!(run(&lab, "DEL", "keep", &c).success());
    assert_eq!(run(&lab, "CHECK", "keep", &with_prev).error().0, 104, "CHECK fails once released");
}

#[test]
fn dual_stack_end_to_end_with_plexus_macvlan_in_a_pod_namespace() {
    let lab = Lab::new();
    lab.add_nic("nic0", 9000);
    let dir = tempfile::tempdir().unwrap();
    let c = json!({"cniVersion": "1.1.0", "name": "rail0", "type": "plexus-macvlan", "master": "nic0",
        "ipam": {"type": IPAM, "range": "198.18.15.0/24", "gateway": "198.18.15.1",
                 "ipRanges": [{"range": "2001:db8:15::/64"}], "routes": [{"dst": "198.19.0.0/16"}],
                 "dataDir": dir.path().to_str().unwrap(), "nodeName": "node-a"}});
    let add = PluginRun::new(plugin_bin("plexus-macvlan"), "ADD")
        .attachment("ctr1", &lab.pod.path(), "net1", &cni_path())
        .stdin(&c)
        .in_netns(&lab.node)
        .run();
    let r = add.result();
    assert_eq!(r["ips"][0]["address"], "198.18.15.2/24", "the gateway .1 is skipped");
    assert_eq!(r["ips"][1]["address"], "2001:db8:15::1/64");
    let addrs: Vec<String> = lab.pod.addrs("net1").iter().map(|a| a.cidr()).collect();
    assert_eq!(addrs, ["198.18.15.2/24", "2001:db8:15::1/64"]);
    assert!(lab.pod.routes().iter().any(|r| r.dst == "198.19.0.0/16" && r.gateway.as_deref() == Some("198.18.15.1")));
    let del = PluginRun::new(plugin_bin("plexus-macvlan"), "DEL")
        .attachment("ctr1", &lab.pod.path(), "net1", &cni_path())
        .stdin(&c)
        .in_netns(&lab.node)
        .run();
    assert!(del.success(), "{}", del.stdout);
    assert!(consistent_file_store(&dir.path().join("default")).is_empty());
    assert!(lab.pod.link("net1").is_none());
}

/// A network on the etcd store: the config names the node policy's profile `test-etcd`, which
/// [`etcd_policy`] defines.
fn etcd_ipam(node: &str) -> Value {
    json!({"type": IPAM, "range": "198.18.16.0/24", "nodeName": node, "store": "test-etcd"})
}

/// A node policy (in `dir`) whose store profile `test-etcd` is this etcd.
fn etcd_policy(dir: &Path, etcd: &Etcd, timeout_ms: u64) -> std::path::PathBuf {
    let profile = json!({"etcd": {"endpoints": [etcd.endpoint()], "prefix": "/plexus-test", "blockSize": 8,
                                  "timeoutMs": timeout_ms}});
    write_policy(dir, "policy.json", &json!({"stores": {"test-etcd": profile}}))
}

#[test]
fn etcd_four_nodes_times_sixteen_concurrent_adds_get_distinct_addresses() {
    let lab = Lab::new();
    let etcd = Etcd::start_in(&lab.node);
    let dir = tempfile::tempdir().unwrap();
    let policy = etcd_policy(dir.path(), &etcd, 2000);
    let addrs: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..64)
            .map(|i| {
                let (lab, policy) = (&lab, &policy);
                s.spawn(move || {
                    let c = conf("1.1.0", etcd_ipam(&format!("node-{}", i % 4)));
                    address(&run_under(lab, "ADD", &format!("ctr{i}"), &c, "", policy))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let distinct: BTreeSet<&String> = addrs.iter().collect();
    assert_eq!(distinct.len(), 64, "{addrs:?}");
    assert_eq!(etcd.keys("/plexus-test/default/ips/").len(), 64);
    assert_eq!(etcd.keys("/plexus-test/default/attachments/").len(), 64);
    let blocks = etcd.keys("/plexus-test/default/blocks/");
    assert!(blocks.len() >= 8, "each node reserved blocks: {blocks:?}");
}

#[test]
fn etcd_down_fails_add_and_del_with_code_11_within_the_deadline_and_recovers() {
    let lab = Lab::new();
    let mut etcd = Etcd::start_in(&lab.node);
    let dir = tempfile::tempdir().unwrap();
    let policy = etcd_policy(dir.path(), &etcd, 500);
    let run = |lab: &Lab, verb: &str, cid: &str, c: &Value| run_under(lab, verb, cid, c, "", &policy);
    let c = conf("1.1.0", etcd_ipam("node-a"));
    let kept = address(&run(&lab, "ADD", "before", &c));
    etcd.stop();
    for verb in ["ADD", "DEL"] {
        let t = Instant::now();
        let (code, msg, _) = run(&lab, verb, "before", &c).error();
        let took = t.elapsed();
        assert_eq!(code, 11, "{verb}: {msg}");
        assert!(msg.starts_with("IPAM store unavailable"), "{msg}");
        assert!(took < Duration::from_secs(4), "{verb} took {took:?} with a 500 ms deadline");
    }
    etcd.restart();
    // Nothing was half-written: the allocation made before is intact, and DEL now succeeds.
    assert_eq!(etcd.keys("/plexus-test/default/ips/").len(), 1);
    assert_eq!(address(&run(&lab, "ADD", "before", &c)), kept, "idempotent after the outage");
    assert!(run(&lab, "DEL", "before", &c).success());
    assert!(etcd.keys("/plexus-test/default/ips/").is_empty());
    assert!(etcd.keys("/plexus-test/default/attachments/").is_empty());
}

#[test]
fn etcd_killed_and_restarted_in_a_1000_pod_churn_fails_adds_with_code_11_in_time_and_leaks_nothing() {
    // 16 clients churn 1,000 pods: each ADD keeps its pod alive until the client's 8th next one,
    // then DELs it, as a kubelet would (a failed ADD is DELeted and tried again; a failed DEL is
    // tried again). After 300 ADDs etcd is killed (SIGKILL), and started again 3 s later.
    const PODS: usize = 1000;
    const CLIENTS: usize = 16;
    const LIVE: usize = 8;
    let lab = Lab::new();
    let etcd = std::sync::Mutex::new(Etcd::start_in(&lab.node));
    let dir = tempfile::tempdir().unwrap();
    let policy = etcd_policy(dir.path(), &etcd.lock().unwrap(), 500);
    let c = conf("1.1.0", etcd_ipam("node-a"));
    // The store's deadline is 5 × the 500 ms timeout; a loaded 2-core machine gets 3 s more.
    let bound = Duration::from_millis(5 * 500 + 3000);
    let live = std::sync::Mutex::new(BTreeSet::<String>::new());
    let adds_done = std::sync::atomic::AtomicUsize::new(0);
    let failed_adds = std::sync::atomic::AtomicUsize::new(0);
    let call = |verb: &str, cid: &str| {
        let t = Instant::now();
        let out = run_under(&lab, verb, cid, &c, "", &policy);
        let took = t.elapsed();
        if !out.success() {
            let (code, msg, _) = out.error();
            assert_eq!(code, 11, "{verb} {cid}: only an unavailable store may fail it: {msg}");
        }
        assert!(took < bound, "{verb} {cid} took {took:?} (deadline 2.5 s)");
        out
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            while adds_done.load(std::sync::atomic::Ordering::SeqCst) < 300 {
                std::thread::sleep(Duration::from_millis(20));
            }
            etcd.lock().unwrap().stop();
            std::thread::sleep(Duration::from_secs(3));
            etcd.lock().unwrap().restart();
        });
        for client in 0..CLIENTS {
            let (call, live, adds_done, failed_adds) = (&call, &live, &adds_done, &failed_adds);
            s.spawn(move || {
                let mut mine = std::collections::VecDeque::new();
                let del = |cid: &str, addr: &str| {
                    // Out of the live set before the DEL frees it for another client's ADD.
                    live.lock().unwrap().remove(addr);
                    while !call("DEL", cid).success() {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                };
                for pod in (client..PODS).step_by(CLIENTS) {
                    let cid = format!("churn{pod}");
                    let addr = loop {
                        let out = call("ADD", &cid);
                        if out.success() {
                            break address(&out);
                        }
                        failed_adds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        while !call("DEL", &cid).success() {
                            std::thread::sleep(Duration::from_millis(200));
                        }
                        std::thread::sleep(Duration::from_millis(200));
                    };
                    assert!(live.lock().unwrap().insert(addr.clone()), "{addr} handed out twice ({cid})");
                    adds_done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    mine.push_back((cid, addr));
                    if mine.len() > LIVE {
                        let (cid, addr) = mine.pop_front().unwrap();
                        del(&cid, &addr);
                    }
                }
                for (cid, addr) in mine {
                    del(&cid, &addr);
                }
            });
        }
    });
    let failed = failed_adds.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("1000-pod churn with etcd killed and restarted: {failed} ADDs failed with code 11 and were retried");
    assert!(failed > 0, "the outage hit no ADD: the test did not test it");
    assert!(live.lock().unwrap().is_empty());
    let etcd = etcd.lock().unwrap();
    assert_eq!(etcd.keys("/plexus-test/default/ips/"), Vec::<String>::new(), "leaked reservations");
    assert_eq!(etcd.keys("/plexus-test/default/attachments/"), Vec::<String>::new(), "leaked records");
}

#[test]
fn on_a_read_only_data_dir_add_fails_naming_it_and_del_of_nothing_succeeds() {
    let lab = Lab::new();
    let data_dir = plexus_tests::DataDir::new("ipam");
    let data = data_dir.path().to_path_buf();
    // Never used: the store does not exist yet.
    std::fs::create_dir_all(&data).unwrap();
    let c = conf("1.0.0", file_ipam(&data, "198.18.17.0/24"));
    {
        let _ro = plexus_tests::Mount::read_only(&data);
        let (code, msg, _) = run(&lab, "ADD", "a", &c).error();
        assert_eq!(code, 5);
        assert!(msg.contains(&data.display().to_string()) && msg.contains("Read-only file system"), "{msg}");
        let out = run(&lab, "DEL", "a", &c);
        assert!(out.success(), "DEL of nothing on a read-only store: {}", out.stdout);
    }
    // A store in use, then read-only: DEL of an attachment it does not hold still succeeds.
    assert!(run(&lab, "ADD", "held", &c).success());
    let _ro = plexus_tests::Mount::read_only(&data);
    let out = run(&lab, "DEL", "never-added", &c);
    assert!(out.success(), "{}", out.stdout);
    let (code, msg, _) = run(&lab, "DEL", "held", &c).error();
    assert_eq!(code, 5, "an address that is held but cannot be released is an error: {msg}");
}
