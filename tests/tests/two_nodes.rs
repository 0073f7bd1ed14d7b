//! Two nodes joined to one control plane (`cluster.sh up --nodes 2`), each node's RoCE ports
//! cabled rail by rail to a bridge in the fabric namespace (MTU 9000): pods on different nodes
//! reach each other over plexus's interfaces, every rail's traffic on its own rail; cluster-wide
//! IPAM holds when both nodes allocate from one range at once; and a lost node's pods keep their
//! addresses until it returns, then release everything.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use plexus_tests::cluster::{Cluster, Interrupt, wait_until};
use plexus_tests::etcd::Etcd;
use serde_json::{Value, json};

/// The two nodes: A runs the control plane too.
const A: u32 = 1;
const B: u32 = 2;

/// `tool args` in the network namespace at `netns` (a node's `/run/netns/…` or a pod's
/// `/proc/PID/ns/net`), from the host.
fn in_netns(netns: &str, tool: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={netns}")).arg("--").arg(tool).args(args);
    cmd
}

/// iperf3 and iputils' ping (don't-fragment) on the host, named when missing.
fn need_traffic_tools() {
    let tools = [("iperf3", "-v", "iperf 3", "iperf3"), ("ping", "-V", "iputils", "iputils-ping")];
    for (tool, flag, says, package) in tools {
        let out = Command::new(tool).arg(flag).output();
        let ok = out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(says));
        assert!(ok, "{tool} missing: install Debian's {package} (scripts/test.sh does)");
    }
}

fn pod_netns(c: &Cluster, k: u32, pod: &str) -> String {
    format!("/proc/{}/ns/net", c.sandbox_pid(k, "default", pod))
}

fn node_netns(c: &Cluster, k: u32) -> String {
    format!("/run/netns/{}", c.node_netns(k))
}

fn succeed(mut cmd: Command) -> String {
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?}: {text}");
    text
}

/// The pod's address on `ifname` (without its prefix length), from its network-status.
fn addr_of(c: &Cluster, pod: &str, ifname: &str) -> String {
    let status = c.network_status("default", pod);
    let entry = status.iter().find(|s| s["interface"] == ifname);
    let ip = entry.and_then(|s| s["ips"][0].as_str()).unwrap_or_else(|| panic!("{pod} has no {ifname}: {status:?}"));
    ip.split('/').next().unwrap().to_string()
}

/// Jumbo frames from `src` to `dst` in `netns`, don't-fragment set: 8972 bytes of ICMP payload
/// make a 9000-byte packet, which passes only if every hop has MTU 9000.
fn ping_jumbo(netns: &str, src: &str, dst: &str) {
    succeed(in_netns(netns, "ping", &["-c", "3", "-i", "0.2", "-W", "2", "-M", "do", "-s", "8972", "-I", src, dst]));
}

/// An iperf3 server, ended (by its PID) on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const TRANSFER: u64 = 100 << 20;

/// The bytes the interface holding `addr` in `netns` has received (its kernel counter).
fn rx_bytes(netns: &str, addr: &str) -> u64 {
    let found: Value =
        serde_json::from_str(&succeed(in_netns(netns, "ip", &["-j", "addr", "show", "to", addr]))).unwrap();
    let dev = found[0]["ifname"].as_str().unwrap_or_else(|| panic!("no interface holds {addr} in {netns}"));
    let link: Value =
        serde_json::from_str(&succeed(in_netns(netns, "ip", &["-j", "-s", "link", "show", "dev", dev]))).unwrap();
    link[0]["stats64"]["rx"]["bytes"].as_u64().unwrap()
}

/// 100 MiB over one TCP connection (iperf3) from `client_addr` in `client_ns` to `server_addr` in
/// `server_ns`; the throughput in Gbit/s. That it all arrived is read from the receiving
/// interface's own counter, not from iperf3's server report (which can close before the last
/// bytes are counted on a busy machine: 94.5 of 100 MiB seen once, all of them delivered).
fn transfer(server_ns: &str, server_addr: &str, client_ns: &str, client_addr: &str) -> f64 {
    let rx_before = rx_bytes(server_ns, server_addr);
    let log = tempfile::NamedTempFile::new().unwrap();
    let serve = || {
        let cmd = in_netns(server_ns, "iperf3", &["-s", "-1", "-B", server_addr, "-p", "5201"])
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap())
            .spawn();
        Server(cmd.unwrap())
    };
    let mut server = serve();
    // A little more is sent: the receiver's count ends when the sender's does.
    let bytes = (TRANSFER + TRANSFER / 10).to_string();
    let args = ["-c", server_addr, "-B", client_addr, "-p", "5201", "-n", &bytes, "-J"];
    // The client is refused until the server listens (seconds, on a machine busy with builds);
    // a one-off server whose client failed halfway has ended, and is started again.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let report = loop {
        let out = in_netns(client_ns, "iperf3", &args).output().unwrap();
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        // iperf3 3.12 with --json exits 0 also when refused: its report says whether it ran.
        let ran = out.status.success() && report["error"].is_null() && report["end"]["sum_received"].is_object();
        if ran || std::time::Instant::now() > deadline {
            break report;
        }
        if server.0.try_wait().unwrap().is_some() {
            server = serve();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let sent = &report["end"]["sum_sent"];
    assert!(
        sent["bytes"].as_u64().unwrap_or(0) >= TRANSFER,
        "{client_addr} sent less than 100 MiB: {report}\nthe server said: {}",
        std::fs::read_to_string(log.path()).unwrap_or_default()
    );
    let received = rx_bytes(server_ns, server_addr) - rx_before;
    assert!(received >= TRANSFER, "{server_addr}'s interface received {received} bytes, less than 100 MiB: {report}");
    sent["bits_per_second"].as_f64().unwrap() / 1e9
}

/// Packets the fabric received on node `k`'s port of `rail` (its cable's end in the switch).
fn rail_rx(c: &Cluster, k: u32, rail: u32) -> u64 {
    let port = if k == 1 { format!("ens{rail}f0np0") } else { format!("n{k}r{rail}") };
    let out = succeed(in_netns(
        &format!("/run/netns/{}", c.var("FABRIC_NETNS")),
        "ip",
        &["-j", "-s", "link", "show", "dev", &port],
    ));
    let v: Value = serde_json::from_str(&out).unwrap();
    v[0]["stats64"]["rx"]["packets"].as_u64().unwrap()
}

fn kubernetes_ipam(range: &str) -> String {
    format!(r#""ipam": {{"type": "plexus-ipam", "range": "{range}", "store": "kubernetes"}}"#)
}

/// The entries of the IPPool of `range` as address → container ID.
fn pool_holders(c: &Cluster, pool: &str, base: [u8; 4]) -> BTreeMap<String, String> {
    let base = u32::from_be_bytes(base);
    c.pool_entries(pool)
        .iter()
        .map(|(offset, e)| {
            let ip = std::net::Ipv4Addr::from(base + offset.parse::<u32>().unwrap());
            (ip.to_string(), e["id"].as_str().unwrap_or_default().to_string())
        })
        .collect()
}

#[test]
fn pods_on_two_nodes_reach_each_other_at_mtu_9000_over_macvlan_host_device_and_four_rails_each_on_its_own() {
    need_traffic_tools();
    let c = Cluster::bare_nodes(None, 2);
    c.install("", false, "manifests");
    c.use_kubernetes_ipam_store();
    let data = c.data().display().to_string();
    let rails: String = (3..=6)
        .map(|k| {
            c.nad(
                "default",
                &format!("rail{k}"),
                &format!(
                    r#"{{"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "ens{k}f0np0", "multiRail": true, {}}}"#,
                    kubernetes_ipam("198.18.192.0/24")
                ),
            )
        })
        .collect();
    c.apply(&format!(
        "{}{}{rails}",
        c.nad(
            "default",
            "mv",
            &format!(
                r#"{{"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "ens1f0np0", {}}}"#,
                kubernetes_ipam("198.18.190.0/24")
            )
        ),
        c.nad(
            "default",
            "hd",
            &format!(
                r#"{{"cniVersion": "1.0.0", "type": "plexus-host-device", "device": "ens2f0np0", "dataDir": "{data}/hd", {}}}"#,
                kubernetes_ipam("198.18.191.0/24")
            )
        ),
    ));
    let networks = "mv,hd,rail3,rail4,rail5,rail6";
    c.apply(&format!(
        "{}{}",
        c.pod_on("default", "a", networks, Some(c.node_name(A))),
        c.pod_on("default", "b", networks, Some(c.node_name(B)))
    ));
    c.wait_ready("default", "pod/a", "120s");
    c.wait_ready("default", "pod/b", "120s");
    let (a_ns, b_ns) = (pod_netns(&c, A, "a"), pod_netns(&c, B, "b"));
    // The whole port went into each pod on the host-device network.
    assert!(!c.node_link_up_on(A, "ens2f0np0") && !c.node_link_up_on(B, "ens2f0np0"));

    // ICMP at MTU 9000 and 100 MiB over TCP, on the shared port (macvlan) and the whole port.
    let mut figures = Vec::new();
    for (net, ifname) in [("macvlan", "net1"), ("host-device", "net2")] {
        let (a, b) = (addr_of(&c, "a", ifname), addr_of(&c, "b", ifname));
        ping_jumbo(&a_ns, &a, &b);
        ping_jumbo(&b_ns, &b, &a);
        figures.push((net, transfer(&b_ns, &b, &a_ns, &a)));
    }
    // The same transfer between the two nodes' own ports, without plexus: rail 7.
    let (na, nb) = (node_netns(&c, A), node_netns(&c, B));
    succeed(in_netns(&na, "ip", &["addr", "add", "198.18.193.1/24", "dev", "ens7f0np0"]));
    succeed(in_netns(&nb, "ip", &["addr", "add", "198.18.193.2/24", "dev", "ens7f0np0"]));
    ping_jumbo(&na, "198.18.193.1", "198.18.193.2");
    figures.push(("the nodes' ports, no plexus", transfer(&nb, "198.18.193.2", &na, "198.18.193.1")));
    succeed(in_netns(&na, "ip", &["addr", "del", "198.18.193.1/24", "dev", "ens7f0np0"]));
    succeed(in_netns(&nb, "ip", &["addr", "del", "198.18.193.2/24", "dev", "ens7f0np0"]));
    eprintln!("100 MiB over TCP between the nodes (Gbit/s, one run, not a benchmark): {figures:?}");

    // Four rails in one subnet: from each address, traffic leaves by its own rail and its
    // answers come back on it; the other rails carry next to nothing meanwhile.
    for rail in 3..=6u32 {
        let ifname = format!("net{rail}");
        let (a, b) = (addr_of(&c, "a", &ifname), addr_of(&c, "b", &ifname));
        let before: Vec<(u64, u64)> = (3..=6).map(|r| (rail_rx(&c, A, r), rail_rx(&c, B, r))).collect();
        succeed(in_netns(&a_ns, "ping", &["-c", "40", "-i", "0.02", "-W", "2", "-I", &a, &b]));
        let after: Vec<(u64, u64)> = (3..=6).map(|r| (rail_rx(&c, A, r), rail_rx(&c, B, r))).collect();
        for (i, r) in (3..=6u32).enumerate() {
            let (from_a, from_b) = (after[i].0 - before[i].0, after[i].1 - before[i].1);
            if r == rail {
                assert!(
                    from_a >= 40 && from_b >= 40,
                    "rail {r} carried {from_a} from A, {from_b} from B for {a} → {b}"
                );
            } else {
                assert!(
                    from_a < 10 && from_b < 10,
                    "{a} → {b} (rail {rail}) also used rail {r}: {from_a} from A, {from_b} from B"
                );
            }
        }
    }

    c.delete("default", &["pod", "a", "b"]);
    wait_until("the whole ports back on both nodes", Duration::from_secs(60), || {
        c.node_link_up_on(A, "ens2f0np0") && c.node_link_up_on(B, "ens2f0np0")
    });
    for pool in ["198.18.190.0-24", "198.18.191.0-24", "198.18.192.0-24"] {
        wait_until(&format!("{pool} released"), Duration::from_secs(30), || c.pool_entries(pool).is_empty());
    }
    for k in [A, B] {
        assert_eq!((c.data_names_on(k, "hd"), c.data_names_on(k, "meta")), (vec![], vec![]), "node {k}");
    }
}

#[test]
fn a_lost_nodes_pods_keep_their_addresses_until_it_returns_then_release_every_address_device_and_cache_entry() {
    let c = Cluster::bare_nodes(None, 2);
    c.install("", false, "manifests");
    c.use_kubernetes_ipam_store();
    let data = c.data().display().to_string();
    // Ranges of six addresses, so that the other node would be given the lost node's at once.
    c.apply(&format!(
        "{}{}",
        c.nad(
            "default",
            "mv",
            &format!(
                r#"{{"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "ens1f0np0", {}}}"#,
                kubernetes_ipam("198.18.194.0/29")
            )
        ),
        c.nad(
            "default",
            "hd",
            &format!(
                r#"{{"cniVersion": "1.0.0", "type": "plexus-host-device", "device": "ens2f0np0", "dataDir": "{data}/hd", {}}}"#,
                kubernetes_ipam("198.18.195.0/29")
            )
        ),
    ));
    let on = |pods: &[(&str, &str)], k: u32| -> String {
        pods.iter().map(|(name, nets)| c.pod_on("default", name, nets, Some(c.node_name(k)))).collect()
    };
    c.apply(&on(&[("b1", "mv,hd"), ("b2", "mv"), ("b3", "mv")], B));
    for p in ["b1", "b2", "b3"] {
        c.wait_ready("default", &format!("pod/{p}"), "120s");
    }
    let b_mv: Vec<String> = ["b1", "b2", "b3"].iter().map(|p| addr_of(&c, p, "net1")).collect();
    let b_hd = addr_of(&c, "b1", "net2");
    let held_by_b = || (pool_holders(&c, "198.18.194.0-29", [198, 18, 194, 0]), c.pool_entries("198.18.195.0-29"));
    let (mv_before, hd_before) = held_by_b();
    assert_eq!((mv_before.len(), hd_before.len()), (3, 1), "{mv_before:?} {hd_before:?}");

    // Node B lost: its kubelet and containerd killed; the pods keep running there, unseen.
    c.daemon_on(B, "kill", "kubelet");
    c.daemon_on(B, "kill", "containerd");
    let (ok, out) =
        c.kubectl(&["-n", "default", "delete", "pod", "b1", "b2", "b3", "--force", "--grace-period=0"], None);
    assert!(ok, "{out}");
    // Node A's pods get the other addresses; the range then has none left for a fourth.
    c.apply(&on(&[("a1", "mv,hd"), ("a2", "mv"), ("a3", "mv")], A));
    for p in ["a1", "a2", "a3"] {
        c.wait_ready("default", &format!("pod/{p}"), "120s");
    }
    c.apply(&on(&[("a4", "mv")], A));
    let a_mv: Vec<String> = ["a1", "a2", "a3"].iter().map(|p| addr_of(&c, p, "net1")).collect();
    assert!(a_mv.iter().all(|a| !b_mv.contains(a)), "node A got a lost pod's address: {a_mv:?} {b_mv:?}");
    assert_ne!(addr_of(&c, "a1", "net2"), b_hd);
    c.wait_event("default", "a4", "no free address left in range");
    let (mv_down, hd_down) = held_by_b();
    for ip in &b_mv {
        assert_eq!(mv_down.get(ip), mv_before.get(ip), "{ip} held for its lost pod while B is down");
    }
    assert!(hd_before.keys().all(|k| hd_down.get(k) == hd_before.get(k)));
    assert!(!c.node_link_up_on(B, "ens2f0np0"), "the whole port still in the lost pod");

    // B comes back: its kubelet finds pods the API no longer has, stops their containers, and
    // its garbage collection (each minute) tears their sandboxes down.
    c.daemon_on(B, "start", "containerd");
    c.daemon_on(B, "start", "kubelet");
    let torn_down = || {
        let (ok, out) = c.crictl_on(B, &["pods", "--namespace", "default", "--state", "ready", "-q"]);
        ok && !out.lines().any(|l| l.len() == 64 && l.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !torn_down() {
        if std::time::Instant::now() > deadline {
            let tail = |f: &str| {
                let log = std::fs::read_to_string(c.node_files(B).join("log").join(f)).unwrap_or_default();
                let lines: Vec<&str> = log.lines().filter(|l| !l.contains("level=debug")).collect();
                lines[lines.len().saturating_sub(30)..].join("\n")
            };
            panic!(
                "node B kept the lost pods' sandboxes\ncontainerd:\n{}\nkubelet:\n{}",
                tail("containerd.log"),
                tail("kubelet.log")
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    wait_until("their addresses released", Duration::from_secs(60), || {
        let (mv, hd) = held_by_b();
        b_mv.iter().all(|ip| mv.get(ip) != mv_before.get(ip)) && hd.keys().all(|k| hd_before.get(k) != hd.get(k))
    });
    wait_until("the whole port back on node B", Duration::from_secs(30), || c.node_link_up_on(B, "ens2f0np0"));
    for sub in ["meta", "hd", "devinfo"] {
        let left = c.data_names_on(B, sub);
        assert!(left.is_empty(), "node B kept {sub}: {left:?}");
    }
    // The fourth pod of A's, retried by its kubelet, gets one of them now.
    c.wait_ready("default", "pod/a4", "120s");
    assert!(b_mv.contains(&addr_of(&c, "a4", "net1")));
    // Every DEL of node B's succeeded the first time.
    let log = std::fs::read_to_string(c.node_files(B).join("log/containerd.log")).unwrap();
    let failed: Vec<&str> = log.lines().filter(|l| l.contains("failed to destroy network for sandbox")).collect();
    assert!(failed.is_empty(), "{failed:?}");
}

/// An IPAM plugin run for container `cid` (of a pod of that name) on node `k`.
fn ipam_on(c: &Cluster, k: u32, bin: &Path, verb: &str, cid: &str, conf: &Value) -> (bool, Value) {
    c.ipam_run_on(k, bin, verb, cid, cid, conf, Interrupt::Fault(""))
}

/// One node's allocator in a churn: its binary, its network config, a name for its containers.
struct Allocator<'a> {
    node: u32,
    bin: &'a Path,
    conf: Value,
    who: &'static str,
}

/// Pods per node in each churn, concurrent clients per node, addresses each client holds at once.
const PODS_PER_NODE: usize = 250;
const CLIENTS: usize = 8;
const HOLD: usize = 4;

/// `PODS_PER_NODE` pods' worth of ADD and DEL on both nodes at once: each client ADDs, holds
/// up to `HOLD` addresses, DELs its oldest. While it runs, every address handed out is checked
/// against those held (no address held twice), and the store, read again and again, must name as
/// holder of every address held throughout the read the container that holds it
/// (`store_view`: address → container ID). A failed whereabouts ADD (its Lease under contention)
/// is DELeted and tried again, as the kubelet does; plexus-ipam's must not fail.
fn churn(c: &Cluster, allocators: &[Allocator], store_view: &(dyn Fn() -> BTreeMap<String, String> + Sync)) {
    let held: Mutex<HashMap<String, String>> = Mutex::default();
    let violations: Mutex<Vec<String>> = Mutex::default();
    let (done, reads, compared) = (AtomicBool::new(false), AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let first = held.lock().unwrap().clone();
                let view = store_view();
                let second = held.lock().unwrap().clone();
                for (ip, cid) in first.iter().filter(|(ip, cid)| second.get(*ip) == Some(*cid)) {
                    compared.fetch_add(1, Ordering::Relaxed);
                    if view.get(ip) != Some(cid) {
                        violations
                            .lock()
                            .unwrap()
                            .push(format!("{ip} held by {cid}, the store says {:?}", view.get(ip)));
                    }
                }
                reads.fetch_add(1, Ordering::Relaxed);
                // A read is a kubectl or etcdctl process: a few a second, not every core's worth.
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let workers: Vec<_> = allocators
            .iter()
            .flat_map(|a| (0..CLIENTS).map(move |client| (a, client)))
            .map(|(a, client)| {
                let (held, violations) = (&held, &violations);
                s.spawn(move || {
                    let mut mine = VecDeque::new();
                    let release = |mine: &mut VecDeque<(String, String)>| {
                        let (ip, cid): (String, String) = mine.pop_front().unwrap();
                        held.lock().unwrap().remove(&ip);
                        let (ok, r) = ipam_on(c, a.node, a.bin, "DEL", &cid, &a.conf);
                        assert!(ok, "{} DEL {cid}: {r}", a.who);
                    };
                    for i in 0..PODS_PER_NODE / CLIENTS {
                        let cid = format!("{}-n{}-c{client}-{i}", a.who, a.node);
                        let mut attempt = 0;
                        let r = loop {
                            let (ok, r) = ipam_on(c, a.node, a.bin, "ADD", &cid, &a.conf);
                            if ok {
                                break r;
                            }
                            assert!(a.who == "wb" && attempt < 10, "{} ADD {cid}: {r}", a.who);
                            assert!(ipam_on(c, a.node, a.bin, "DEL", &cid, &a.conf).0);
                            attempt += 1;
                        };
                        let ip = r["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
                        if let Some(other) = held.lock().unwrap().insert(ip.clone(), cid.clone()) {
                            violations.lock().unwrap().push(format!("{ip} given to {cid} while {other} held it"));
                        }
                        mine.push_back((ip, cid));
                        if mine.len() > HOLD {
                            release(&mut mine);
                        }
                    }
                    while !mine.is_empty() {
                        release(&mut mine);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    let violations = violations.into_inner().unwrap();
    assert!(
        violations.is_empty(),
        "{} violations, first: {:?}",
        violations.len(),
        &violations[..violations.len().min(5)]
    );
    // The check saw the churn: the store was read while addresses were held.
    let (reads, compared) = (reads.into_inner(), compared.into_inner());
    eprintln!("churn: the store read {reads} times while it ran, {compared} held addresses compared");
    assert!(reads >= 5 && compared >= 50, "the store was read {reads} times, {compared} addresses compared");
}

#[test]
fn two_nodes_churning_one_range_at_once_never_hold_an_address_twice_on_the_api_server_or_etcd() {
    let c = Cluster::bare_nodes(None, 2);
    // Both nodes' plexus-ipam: the API server's store with the admin's credentials, and an etcd
    // on node A's management address, which node B reaches across the fabric.
    let etcd = Etcd::start_on(Path::new(&node_netns(&c, A)), "198.18.250.1");
    let policy = json!({"dataRoots": [c.data()], "deviceInfoDir": c.state().join("devinfo"),
        "kubernetes": {"kubeconfig": c.var("KUBECONFIG"), "namespace": "kube-system"},
        "stores": {"fabric": {"etcd": {"endpoints": [etcd.endpoint()], "prefix": "/plexus-test", "blockSize": 8}}}});
    std::fs::write(c.var("PLEXUS_POLICY"), policy.to_string()).unwrap();
    let range = "198.18.196.0/25";
    let px = plexus_tests::plugin_bin("plexus-ipam");
    let wb = Path::new(c.var("PEERS_BIN")).join("whereabouts");
    let plexus = |k: u32, store: &str| Allocator {
        node: k,
        bin: &px,
        conf: json!({"cniVersion": "1.0.0", "name": "churn",
            "ipam": {"type": "plexus-ipam", "range": range, "store": store, "nodeName": c.node_name(k)}}),
        who: "px",
    };
    let whereabouts = |k: u32| Allocator {
        node: k,
        bin: &wb,
        conf: json!({"cniVersion": "1.0.0", "name": "churn",
            "ipam": {"type": "whereabouts", "range": range, "configuration_path": c.whereabouts_flat_conf()}}),
        who: "wb",
    };
    let pool = || pool_holders(&c, "198.18.196.0-25", [198, 18, 196, 0]);
    // What is left in the API: pool entries and reservations, each as (address, container ID).
    let api_left = || -> Vec<(String, String)> { pool().into_iter().chain(c.reservation_holders()).collect() };

    // plexus-ipam's Kubernetes store on node A, whereabouts on node B: one pool.
    churn(&c, &[plexus(A, "kubernetes"), whereabouts(B)], &pool);
    // plexus-ipam leaves nothing. whereabouts' DEL answers success whatever failed (its cmdDel
    // returns nil; the reservation goes after the pool entry, within a 10 s request context its
    // pool retries may have spent), so under this contention it may leave a reservation or an
    // entry of its own: reported, then removed, so that the next churn starts from an empty pool.
    let (theirs, ours): (Vec<_>, Vec<_>) = api_left().into_iter().partition(|(_, cid)| cid.starts_with("wb-"));
    assert_eq!(ours, [], "left in the API after plexus-ipam beside whereabouts, other than whereabouts' own");
    if !theirs.is_empty() {
        eprintln!("whereabouts left in the API (its DEL answered success): {theirs:?}");
        for kind in ["ippools", "overlappingrangeipreservations"] {
            let (ok, out) =
                c.kubectl(&["-n", "kube-system", "delete", &format!("{kind}.whereabouts.cni.cncf.io"), "--all"], None);
            assert!(ok, "{out}");
        }
    }
    // plexus-ipam on both nodes.
    churn(&c, &[plexus(A, "kubernetes"), plexus(B, "kubernetes")], &pool);
    assert_eq!(api_left(), [], "left in the API after plexus-ipam on both nodes");
    // The etcd store on both nodes.
    let etcd_view = || -> BTreeMap<String, String> {
        etcd.pairs("/plexus-test/")
            .into_iter()
            .filter(|(k, _)| k.contains("/ips/"))
            .map(|(_, v)| {
                let a: Value = serde_json::from_str(&v).unwrap();
                (a["ip"].as_str().unwrap().to_string(), a["containerID"].as_str().unwrap().to_string())
            })
            .collect()
    };
    churn(&c, &[plexus(A, "fabric"), plexus(B, "fabric")], &etcd_view);
    let left: Vec<String> =
        etcd.keys("/plexus-test/").into_iter().filter(|k| k.contains("/ips/") || k.contains("/attachments/")).collect();
    assert!(left.is_empty(), "left in etcd: {left:?}");
}
