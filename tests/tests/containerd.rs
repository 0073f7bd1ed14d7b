//! containerd 1.6 (`ctr run --cni`) with `plexus` as the first CNI config: ADD gets
//! `/proc/<pid>/ns/net`, DEL arrives with an EMPTY `CNI_NETNS`, and the address is still released.
//!
//! containerd runs with its own root, state and socket in a temp dir. `ctr` reads the first file in
//! /etc/cni/net.d and the plugins in /opt/cni/bin: it runs in a private mount namespace where our
//! directories are bind-mounted there (a tmpfs on /opt gives /opt/cni/bin a place), and in the
//! node network namespace, so the host's files and network are untouched.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use plexus_tests::runner::enter_netns;
use plexus_tests::{Lab, plugin_bin, test_policy};
use serde_json::json;

struct Containerd {
    dir: tempfile::TempDir,
    daemon: Child,
}

impl Containerd {
    fn start() -> Containerd {
        assert!(Path::new("/usr/bin/containerd").exists(), "containerd missing: scripts/test.sh installs it");
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("config.toml"),
            format!(
                "version = 2\nroot = \"{r}/root\"\nstate = \"{r}/state\"\n\
                 disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
                 [grpc]\n  address = \"{r}/containerd.sock\"\n[ttrpc]\n  address = \"{r}/containerd-ttrpc.sock\"\n",
                r = d.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(d.join("containerd.log")).unwrap();
        let daemon = Command::new("containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let c = Containerd { dir, daemon };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !c.ctr(&["version"]).0 {
            assert!(
                Instant::now() < deadline,
                "containerd did not start: {}",
                std::fs::read_to_string(c.dir.path().join("containerd.log")).unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        c
    }

    fn sock(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    fn ctr(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("ctr").arg("-a").arg(self.sock()).args(["-n", "plexus"]).args(args).output().unwrap();
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        plexus_tests::unmount_below(self.dir.path());
    }
}

/// A docker-archive of busybox-static, made with podman (no registry here).
fn busybox_archive(dir: &Path) -> PathBuf {
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    for tool in ["sh", "ip", "cat", "sleep"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(tool)).unwrap();
    }
    let tar = dir.join("rootfs.tar");
    assert!(Command::new("tar").arg("-C").arg(&rootfs).arg("-cf").arg(&tar).arg(".").status().unwrap().success());
    let podman = |args: &[&str]| {
        let out = Command::new("podman")
            .arg("--root")
            .arg(dir.join("proot"))
            .arg("--runroot")
            .arg(dir.join("prunroot"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "podman {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    podman(&["import", tar.to_str().unwrap(), "localhost/plexus-bb:test"]);
    let archive = dir.join("image.tar");
    podman(&["save", "--format", "docker-archive", "-o", archive.to_str().unwrap(), "localhost/plexus-bb:test"]);
    plexus_tests::unmount_below(&dir.join("proot"));
    plexus_tests::unmount_below(&dir.join("prunroot"));
    archive
}

#[test]
fn ctr_run_cni_attaches_through_plexus_and_del_with_empty_netns_releases_the_address() {
    let lab = Lab::new();
    lab.add_nic("nic0", 9000);
    let c = Containerd::start();
    let work = tempfile::tempdir().unwrap();
    let work_ipam = plexus_tests::DataDir::new("ipam");
    let archive = busybox_archive(work.path());
    let (ok, out) = c.ctr(&["images", "import", archive.to_str().unwrap()]);
    assert!(ok, "ctr images import: {out}");

    // plexus as the first (only) config; a NAD from files selecting plexus-macvlan + plexus-ipam.
    let netd = work.path().join("net.d");
    let nads = work.path().join("nads");
    std::fs::create_dir_all(&netd).unwrap();
    std::fs::create_dir_all(&nads).unwrap();
    let nad = json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
        "ipam": {"type": "plexus-ipam", "range": "198.18.95.0/24", "dataDir": work_ipam.path()}});
    std::fs::write(
        nads.join("rail0.yaml"),
        format!("apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: rail0\nspec:\n  config: '{nad}'\n"),
    )
    .unwrap();
    let bin = plugin_bin("plexus").parent().unwrap().to_path_buf();
    let log = work.path().join("plexus.log");
    let meta = json!({"cniVersion": "1.0.0", "name": "plexus", "plugins": [{"type": "plexus", "nadDir": nads,
        "networks": "rail0@eth0", "cniDir": work.path().join("cache"), "binDir": bin,
        "logFile": log, "logLevel": "debug"}]});
    std::fs::write(netd.join("00-plexus.conflist"), meta.to_string()).unwrap();

    let script = format!(
        "set -e; mount -t tmpfs tmpfs /opt; mkdir -p /opt/cni/bin; mount --bind {bin} /opt/cni/bin; \
         mount --bind {netd} /etc/cni/net.d; \
         exec ctr -a {sock} -n plexus run --rm --cni localhost/plexus-bb:test plexus-c1 ip -o addr show eth0",
        bin = bin.display(),
        netd = netd.display(),
        sock = c.sock().display()
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c", &script]).env("PLEXUS_POLICY", test_policy());
    enter_netns(&mut cmd, &lab.node.path());
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "ctr run --cni: {text}\nplexus log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(text.contains("inet 198.18.95.1/24"), "the task's eth0 has its address: {text}");

    // The plexus log shows what containerd sent: a /proc/<pid>/ns/net on ADD, nothing on DEL.
    let logged = std::fs::read_to_string(&log).unwrap();
    let add = logged.lines().find(|l| l.contains("command=ADD")).unwrap_or_else(|| panic!("no ADD logged: {logged}"));
    assert!(add.contains("netns=/proc/") && add.contains("/ns/net"), "ADD gets /proc/<pid>/ns/net: {add}");
    let del = logged.lines().find(|l| l.contains("command=DEL")).unwrap_or_else(|| panic!("no DEL logged: {logged}"));
    assert!(del.contains("netns=}") || del.contains("netns= "), "DEL arrives with an empty CNI_NETNS: {del}");
    let held = std::fs::read_dir(work_ipam.path().join("default/ips")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(held, 0, "DEL with an empty CNI_NETNS still released the address");
    assert_eq!(std::fs::read_dir(work.path().join("cache")).unwrap().count(), 0, "no delegate cache left");
    let (ok, out) = c.ctr(&["containers", "list", "-q"]);
    assert!(ok && out.trim().is_empty(), "no container left: {out}");
}
