//! Runs a built plugin binary the way a runtime does: inside the node namespace, with the CNI
//! environment, the config on stdin, and stdout/stderr captured.

use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::netns::Netns;

/// Make `cmd` run inside the network namespace at `path` (the child joins it before exec).
pub fn enter_netns(cmd: &mut Command, path: &Path) {
    let ns = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    // SAFETY: setns is a single syscall, async-signal-safe, and touches only the child.
    unsafe {
        cmd.pre_exec(move || {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
        });
    }
}

/// Where Debian's containernetworking-plugins installs the reference plugins.
pub const REFERENCE_CNI_DIR: &str = "/usr/lib/cni";

/// The directory cargo put this workspace's binaries in (next to the test executable's `deps`),
/// or `PLEXUS_TEST_BIN_DIR` when set: scripts/arm64-check.sh runs tests against the arm64 build,
/// under qemu-user.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PLEXUS_TEST_BIN_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("deps dir");
    if dir.ends_with("deps") { dir.parent().unwrap().to_path_buf() } else { dir.to_path_buf() }
}

/// A plexus binary built from this workspace.
pub fn plugin_bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.is_file(),
        "{} is not built: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        p.display()
    );
    p
}

/// A tool the test command builds into `target/tools` (cnitool).
pub fn tool_bin(name: &str) -> PathBuf {
    let target = bin_dir().parent().expect("target dir").to_path_buf();
    let p = target.join("tools").join(name);
    assert!(p.is_file(), "{} is not built: scripts/test.sh builds it (scripts/tools/build-{name}.sh)", p.display());
    p
}

/// The previous release of plexus, as the test command builds it (`scripts/previous-release.sh`,
/// which `target/tools/previous` points at): `bin/` (its binaries) and `deploy/` (its chart and
/// manifests).
pub fn previous_release() -> PathBuf {
    let target = bin_dir().parent().expect("target dir").to_path_buf();
    let p = target.join("tools/previous");
    assert!(
        p.join("bin/plexus").is_file(),
        "{} is not built: scripts/test.sh builds it (scripts/previous-release.sh)",
        p.display()
    );
    p
}

/// A Debian reference plugin.
pub fn reference_plugin(name: &str) -> PathBuf {
    let p = Path::new(REFERENCE_CNI_DIR).join(name);
    assert!(
        p.is_file(),
        "{} missing: install Debian's containernetworking-plugins (scripts/test.sh does)",
        p.display()
    );
    p
}

/// One plugin invocation being prepared.
#[derive(Debug, Clone)]
pub struct PluginRun {
    binary: PathBuf,
    env: Vec<(String, String)>,
    unset: Vec<String>,
    stdin: Vec<u8>,
    netns: Option<PathBuf>,
}

/// What the plugin did: exit status, stdout, stderr.
#[derive(Debug)]
pub struct Outcome {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }

    /// stdout as the one JSON document it must be (panics otherwise).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!("stdout is not one JSON document ({e}):\n{}\nstderr:\n{}", self.stdout, self.stderr)
        })
    }

    /// The result of a successful ADD.
    pub fn result(&self) -> Value {
        assert!(self.success(), "plugin failed: {}\nstderr: {}", self.stdout, self.stderr);
        self.json()
    }

    /// The CNI error of a failed call: (code, msg, details).
    pub fn error(&self) -> (u64, String, String) {
        assert!(!self.success(), "plugin succeeded but an error was expected: {}", self.stdout);
        let v = self.json();
        let code = v["code"].as_u64().unwrap_or_else(|| panic!("no code in {v}"));
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        (code, text("msg"), text("details"))
    }
}

/// The node policy the tests run under (`PLEXUS_POLICY`): test data directories live in temp
/// dirs, so the system temp dir is a data root; nothing else differs from the defaults. Tests of
/// the policy itself write their own with [`write_policy`].
pub fn test_policy() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let target = bin_dir().parent().expect("target dir").to_path_buf();
        let tmp = std::env::temp_dir();
        write_policy(&target, "plexus-test-policy.json", &serde_json::json!({"dataRoots": [tmp]}))
    })
    .clone()
}

/// Write a node policy file `name` in `dir` (0600, atomically: tests share it) and return its path.
pub fn write_policy(dir: &Path, name: &str, policy: &Value) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.{:?}", std::process::id(), std::thread::current().id()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(policy).unwrap()).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

impl PluginRun {
    /// `binary` with `CNI_COMMAND=command` under the tests' node policy; the rest of the CNI
    /// environment is unset until given.
    pub fn new(binary: impl Into<PathBuf>, command: &str) -> PluginRun {
        PluginRun {
            binary: binary.into(),
            env: vec![
                ("CNI_COMMAND".into(), command.into()),
                ("PLEXUS_POLICY".into(), test_policy().display().to_string()),
            ],
            unset: vec![],
            stdin: vec![],
            netns: None,
        }
    }

    /// The usual per-attachment environment: container ID, netns, ifname and CNI_PATH.
    pub fn attachment(self, container_id: &str, netns: &Path, ifname: &str, cni_path: &str) -> PluginRun {
        self.env("CNI_CONTAINERID", container_id)
            .env("CNI_NETNS", netns.to_str().unwrap())
            .env("CNI_IFNAME", ifname)
            .env("CNI_PATH", cni_path)
    }

    pub fn env(mut self, key: &str, value: &str) -> PluginRun {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn unset(mut self, key: &str) -> PluginRun {
        self.env.retain(|(k, _)| k != key);
        self.unset.push(key.into());
        self
    }

    pub fn stdin(mut self, config: &Value) -> PluginRun {
        self.stdin = serde_json::to_vec(config).unwrap();
        self
    }

    pub fn stdin_raw(mut self, bytes: &[u8]) -> PluginRun {
        self.stdin = bytes.to_vec();
        self
    }

    /// Run the plugin process inside `ns` (the node namespace), never in the host's.
    pub fn in_netns(mut self, ns: &Netns) -> PluginRun {
        self.netns = Some(ns.path());
        self
    }

    pub fn run(&self) -> Outcome {
        let mut cmd = Command::new(&self.binary);
        // Only what a runtime passes: a clean environment plus PATH for the plugin's helpers.
        cmd.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        for k in &self.unset {
            cmd.env_remove(k);
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(path) = &self.netns {
            enter_netns(&mut cmd, path);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", self.binary.display()));
        let mut stdin = child.stdin.take().unwrap();
        let input = self.stdin.clone();
        let feeder = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let out = child.wait_with_output().expect("wait for plugin");
        feeder.join().unwrap();
        Outcome {
            status: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}
