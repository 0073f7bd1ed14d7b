//! A real etcd (Debian `etcd-server`) for tests: on the loopback of a namespace the test made
//! (the node namespace, where the plugins run) or on an address of a cluster node's namespace,
//! free ports, a temp data dir; stopped by its PID.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Etcd {
    netns: PathBuf,
    /// The address it listens on in `netns` (the loopback unless [`Etcd::start_on`]).
    host: String,
    child: Option<Child>,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
}

/// Two distinct ports free on the host's loopback; the namespace's loopback is empty, so they are
/// free there too. Both listeners are held until both are chosen: one dropped first could be
/// handed out again as the second (etcd then fails to bind its peer port).
fn free_ports() -> (u16, u16) {
    let (a, b) = (TcpListener::bind("127.0.0.1:0").unwrap(), TcpListener::bind("127.0.0.1:0").unwrap());
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
}

impl Etcd {
    /// Start etcd inside the namespace at `netns` (a `Lab`'s node namespace).
    pub fn start_in(netns: &crate::Netns) -> Etcd {
        Etcd::start_on(&netns.path(), "127.0.0.1")
    }

    /// Start etcd in the namespace at `netns_path`, listening on `host` there (an address of
    /// that namespace's, e.g. a cluster node's, for clients in other namespaces).
    pub fn start_on(netns_path: &std::path::Path, host: &str) -> Etcd {
        assert!(
            std::path::Path::new("/usr/bin/etcd").exists(),
            "etcd missing: install Debian's etcd-server (scripts/test.sh does)"
        );
        let (client_port, peer_port) = free_ports();
        let mut e = Etcd {
            netns: netns_path.to_path_buf(),
            host: host.to_string(),
            child: None,
            dir: tempfile::tempdir().unwrap(),
            client_port,
            peer_port,
        };
        e.launch();
        e
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.host, self.client_port)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn launch(&mut self) {
        let peer = format!("http://{}:{}", self.host, self.peer_port);
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).unwrap();
        let mut cmd = Command::new("/usr/bin/etcd");
        crate::runner::enter_netns(&mut cmd, &self.netns);
        let child = cmd
            .args(["--name", "plx", "--data-dir"])
            .arg(self.data_dir())
            .args(["--listen-client-urls", &self.endpoint(), "--advertise-client-urls", &self.endpoint()])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("plx={peer}"), "--log-level", "error"])
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
        self.wait_healthy();
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let ok = self
                .etcdctl()
                .args(["--endpoints", &self.endpoint(), "--command-timeout=1s", "endpoint", "health"])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        panic!("etcd did not become healthy in 20 s:\n{log}");
    }

    fn etcdctl(&self) -> Command {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3");
        crate::runner::enter_netns(&mut cmd, &self.netns);
        cmd
    }

    /// Stop it (SIGKILL by PID); the data directory stays for a restart.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start it again on the same ports and data.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Every key under `prefix` with its value (`etcdctl get --prefix`; values without newlines).
    pub fn pairs(&self, prefix: &str) -> Vec<(String, String)> {
        let out = self.etcdctl().args(["--endpoints", &self.endpoint(), "get", "--prefix", prefix]).output().unwrap();
        assert!(out.status.success(), "etcdctl get: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        lines.chunks(2).filter(|p| p.len() == 2).map(|p| (p[0].to_string(), p[1].to_string())).collect()
    }

    /// `etcdctl get --prefix <prefix> --keys-only`
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let out = self
            .etcdctl()
            .args(["--endpoints", &self.endpoint(), "get", "--prefix", prefix, "--keys-only"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(String::from).collect()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
