//! Network namespaces for tests: a `Lab` is one node namespace (where plugins run), one pod
//! namespace, and a fabric namespace holding the far ends of the veth "NICs".

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A short name unique to this process and call, usable in netns and link names.
pub fn unique(role: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("plx{}x{n}{role}", std::process::id())
}

/// A named network namespace (`ip netns add`), deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    pub fn new(role: &str) -> Netns {
        crate::require_root();
        let name = unique(role);
        ip(&["netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The path runtimes pass as `CNI_NETNS`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// `ip -n <ns> <args>`; panics with ip's message on failure.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// `ip -n <ns> <args>`, returning whether it succeeded (for probing).
    pub fn try_ip(&self, args: &[&str]) -> bool {
        Command::new("ip").arg("-n").arg(&self.name).args(args).output().is_ok_and(|o| o.status.success())
    }

    /// Read a sysctl inside the namespace (`net.ipv4.conf.net1.arp_ignore`).
    pub fn sysctl(&self, key: &str) -> String {
        let out =
            Command::new("ip").args(["netns", "exec", &self.name, "sysctl", "-n", key]).output().expect("run sysctl");
        assert!(out.status.success(), "sysctl {key} in {}: {}", self.name, String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Delete now (a test of DEL after the pod namespace is gone).
    pub fn delete(self) {
        drop(self)
    }

    pub fn exists(name: &str) -> bool {
        std::path::Path::new("/run/netns").join(name).exists()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

pub(crate) fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip (iproute2)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A node namespace where plugins run, a pod namespace, and veth NICs between the node and a
/// fabric namespace. Everything goes away on drop, also when a test panics.
#[derive(Debug)]
pub struct Lab {
    // Drop order: pod first, then node, then fabric.
    pub pod: Netns,
    pub node: Netns,
    pub fabric: Netns,
}

impl Lab {
    pub fn new() -> Lab {
        Lab { pod: Netns::new("p"), node: Netns::new("n"), fabric: Netns::new("f") }
    }

    /// A RoCE-port stand-in: veth `name` in the node namespace (up, `mtu`), its peer of the same
    /// name in the fabric namespace (up).
    pub fn add_nic(&self, name: &str, mtu: u32) {
        let mtu = mtu.to_string();
        self.node.ip(&[
            "link",
            "add",
            name,
            "mtu",
            &mtu,
            "type",
            "veth",
            "peer",
            "name",
            name,
            "mtu",
            &mtu,
            "netns",
            self.fabric.name(),
        ]);
        self.node.ip(&["link", "set", name, "up"]);
        self.fabric.ip(&["link", "set", name, "up"]);
    }

    /// Another pod namespace on the same node.
    pub fn another_pod(&self) -> Netns {
        Netns::new("q")
    }
}

impl Default for Lab {
    fn default() -> Self {
        Lab::new()
    }
}

/// A TCP listener on the loopback of the namespace at `netns_path`, any free port: bound inside
/// the namespace on a thread of its own; the socket stays there whichever thread serves it.
pub fn loopback_listener(netns_path: &std::path::Path) -> std::net::TcpListener {
    let ns = std::fs::File::open(netns_path).unwrap();
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS).unwrap();
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        std::net::TcpListener::bind("127.0.0.1:0").unwrap()
    })
    .join()
    .unwrap()
}
