//! podman (Debian's 4.3, CNI backend) runs a container on a plexus-macvlan + plexus-ipam conflist:
//! inside, the interface has its address and MTU; after `--rm` the address is released. podman
//! itself runs in the node namespace (setns only, so /sys and the cgroup mounts stay as they are),
//! so the plugins it execs see the veth "NIC" and nothing of the host's network.

use std::path::{Path, PathBuf};
use std::process::Command;

use plexus_tests::runner::enter_netns;
use plexus_tests::{DataDir, Lab, plugin_bin, test_policy};
use serde_json::json;

struct Podman {
    dir: tempfile::TempDir,
    ipam: DataDir,
}

impl Podman {
    fn new(lab: &Lab) -> Podman {
        assert!(Path::new("/usr/bin/podman").exists(), "podman missing: scripts/test.sh installs it");
        let p = Podman { dir: tempfile::tempdir().unwrap(), ipam: DataDir::new("ipam") };
        let conf_dir = p.dir.path().join("net.d");
        std::fs::create_dir_all(&conf_dir).unwrap();
        std::fs::write(
            p.dir.path().join("containers.conf"),
            format!(
                "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\
                 [engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\nruntime = \"runc\"\n\
                 env = [\"PLEXUS_POLICY={}\"]\n\
                 [network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [\"{}\", \"/usr/lib/cni\"]\nnetwork_config_dir = \"{}\"\n",
                test_policy().display(),
                plugin_bin("plexus").parent().unwrap().display(),
                conf_dir.display()
            ),
        )
        .unwrap();
        let list = json!({"cniVersion": "1.0.0", "name": "roce", "plugins": [
            {"type": "plexus-macvlan", "master": "nic0",
             "ipam": {"type": "plexus-ipam", "range": "198.18.90.0/24", "dataDir": p.ipam_dir(), "nodeName": "node-a"}}]});
        std::fs::write(conf_dir.join("roce.conflist"), list.to_string()).unwrap();
        // A local image: busybox-static as the whole root file system (no registry here).
        let rootfs = p.dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        for tool in ["sh", "ip", "cat", "sleep"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(tool)).unwrap();
        }
        let tar = p.dir.path().join("rootfs.tar");
        assert!(Command::new("tar").arg("-C").arg(&rootfs).arg("-cf").arg(&tar).arg(".").status().unwrap().success());
        let (ok, out) = p.podman(lab, &["import", tar.to_str().unwrap(), "localhost/plexus-bb:test"]);
        assert!(ok, "podman import: {out}");
        p
    }

    fn ipam_dir(&self) -> PathBuf {
        self.ipam.path().to_path_buf()
    }

    fn podman(&self, lab: &Lab, args: &[&str]) -> (bool, String) {
        let mut cmd = Command::new("podman");
        cmd.arg("--root")
            .arg(self.dir.path().join("root"))
            .arg("--runroot")
            .arg(self.dir.path().join("runroot"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .env("CONTAINERS_CONF", self.dir.path().join("containers.conf"))
            .env("TMPDIR", self.dir.path());
        enter_netns(&mut cmd, &lab.node.path());
        let out = cmd.output().expect("run podman");
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    }

    fn held(&self) -> usize {
        std::fs::read_dir(self.ipam_dir().join("default/ips")).map(|d| d.count()).unwrap_or(0)
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Unmount what podman's storage left mounted in the temp dir before it is removed.
        plexus_tests::unmount_below(self.dir.path());
    }
}

#[test]
fn podman_runs_a_container_on_plexus_and_releases_the_address_after_rm() {
    let lab = Lab::new();
    lab.add_nic("nic0", 9000);
    let p = Podman::new(&lab);
    let (ok, out) = p.podman(
        &lab,
        &["run", "--rm", "--network", "roce", "localhost/plexus-bb:test", "ip", "-o", "addr", "show", "eth0"],
    );
    assert!(ok, "podman run: {out}");
    eprintln!("in the container: {}", out.trim());
    assert!(out.contains("inet 198.18.90.1/24"), "the container's interface has its address: {out}");
    let (ok, out) = p.podman(
        &lab,
        &["run", "--rm", "--network", "roce", "localhost/plexus-bb:test", "cat", "/sys/class/net/eth0/mtu"],
    );
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "9000", "the parent's MTU");
    assert_eq!(p.held(), 0, "--rm released the address");
    let (ok, out) = p.podman(&lab, &["ps", "-a", "-q"]);
    assert!(ok && out.trim().is_empty(), "no container left: {out}");
}
