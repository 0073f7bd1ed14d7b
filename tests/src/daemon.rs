//! A `plexus-daemon` process for tests: started inside a node namespace with its socket and
//! metrics port there, stopped (by its PID) on drop and on panic.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::runner::{enter_netns, plugin_bin};

/// The daemon's health and metrics port inside its namespace.
pub const METRICS_PORT: u16 = 9134;

pub struct DaemonProcess {
    child: Option<Child>,
    pub socket: PathBuf,
    pub log: PathBuf,
    netns: PathBuf,
}

impl DaemonProcess {
    /// Start `plexus-daemon` in the namespace at `netns` with its socket at `socket` and its log
    /// in `log`, plus `args`; waits until it serves (socket there, /readyz 200).
    pub fn start(netns: &Path, socket: &Path, log: &Path, args: &[&str]) -> DaemonProcess {
        DaemonProcess::start_binary(&plugin_bin("plexus-daemon"), netns, socket, log, args, &[])
    }

    /// [`DaemonProcess::start`] of the plexus-daemon at `binary` (this tree's is
    /// `plugin_bin("plexus-daemon")`, another release's elsewhere), with `env` in its environment
    /// (besides `PATH`).
    pub fn start_binary(
        binary: &Path,
        netns: &Path,
        socket: &Path,
        log: &Path,
        args: &[&str],
        env: &[(&str, &Path)],
    ) -> DaemonProcess {
        let mut cmd = Command::new(binary);
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .envs(env.iter().copied())
            .arg("--socket")
            .arg(socket)
            .arg("--status-journal")
            .arg(socket.parent().expect("the socket's directory").join("network-status"))
            .arg("--metrics-address")
            .arg(format!("127.0.0.1:{METRICS_PORT}"))
            .arg("--log-level")
            .arg("debug")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("daemon log"));
        enter_netns(&mut cmd, netns);
        let child = cmd.spawn().expect("spawn plexus-daemon");
        let d = DaemonProcess { child: Some(child), socket: socket.into(), log: log.into(), netns: netns.into() };
        d.wait_ready(Duration::from_secs(30));
        d
    }

    /// Wait until the socket is there and /readyz answers 200.
    pub fn wait_ready(&self, within: Duration) {
        let start = Instant::now();
        loop {
            if self.socket.exists() && self.get("/readyz").is_some_and(|(code, _)| code == 200) {
                return;
            }
            assert!(
                start.elapsed() < within,
                "plexus-daemon not ready within {within:?}; its log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET `path` on the daemon's port, from inside its namespace: (status, body).
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(&self.netns, METRICS_PORT, path)
    }

    /// The metrics exposition.
    pub fn metrics(&self) -> String {
        let (code, body) = self.get("/metrics").expect("GET /metrics");
        assert_eq!(code, 200);
        body
    }

    /// The value of one sample (`name{labels}` exactly as exposed), 0 when absent.
    pub fn sample(&self, series: &str) -> f64 {
        sample(&self.metrics(), series)
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM; the daemon finishes what it took and exits.
    pub fn terminate(&self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), nix::sys::signal::Signal::SIGTERM);
    }

    /// Wait for the process to exit (after [`DaemonProcess::terminate`]): its exit status.
    pub fn wait(&mut self, within: Duration) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let start = Instant::now();
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                return status;
            }
            if start.elapsed() > within {
                let _ = c.kill();
                let _ = c.wait();
                panic!("plexus-daemon did not exit within {within:?}; its log:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// GET `path` on 127.0.0.1:`port` in the network namespace at `netns`, from a thread that joins
/// it: (status, body).
pub fn http_get(netns: &Path, port: u16, path: &str) -> Option<(u16, String)> {
    let ns = std::fs::File::open(netns).ok()?;
    let path = path.to_string();
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Some((code, body))
    })
    .join()
    .ok()
    .flatten()
}

/// The value of one sample of an exposition (`name{labels}` exactly as exposed), 0 when absent.
pub fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).map(|v| v.trim().parse().unwrap()))
        .unwrap_or(0.0)
}

/// Writes `path`, a delegate that runs `plugin` behind a gate: its ADD first creates
/// `gate/entered-<CNI_CONTAINERID>`, then waits until `gate/open` exists (other verbs pass
/// straight through). Lets a test act while a delegate is mid-ADD.
pub fn write_gated_delegate(path: &Path, gate: &Path, plugin: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let script = format!(
        "#!/bin/sh\nif [ \"$CNI_COMMAND\" = ADD ]; then\n  touch {g}/entered-$CNI_CONTAINERID\n  while [ ! -e {g}/open ]; do sleep 0.02; done\nfi\nexec {m}\n",
        g = gate.display(),
        m = plugin.display()
    );
    std::fs::write(path, script).expect("write the gated delegate");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("make it executable");
}
