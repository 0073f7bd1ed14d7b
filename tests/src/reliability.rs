//! The rigs of the reliability tests (fault injection, full and read-only disks): a plugin set-up
//! on a lab, run the way a runtime runs it, and a snapshot of everything a plugin may leave
//! behind — links, addresses, routes, rules and sysctls of node and pod, and every file in the
//! IPAM, host-device state, cache and device-info directories.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{DataDir, Lab, Outcome, PluginRun, REFERENCE_CNI_DIR, plugin_bin, write_policy};

/// One plugin set-up: the binary the runtime runs and its config.
pub struct Rig {
    pub lab: Lab,
    pub dir: tempfile::TempDir,
    /// plexus-ipam's and plexus-host-device's data directories.
    pub ipam: DataDir,
    pub state: DataDir,
    pub binary: &'static str,
    pub config: Value,
    pub policy: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    Fail,
    Kill,
}

pub fn bin_dir() -> PathBuf {
    plugin_bin("plexus").parent().unwrap().to_path_buf()
}

/// Every file below `dir` (relative), directories included.
pub fn files(dir: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            out.insert(p.strip_prefix(root).unwrap().display().to_string());
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// Wait until no process of this attachment is left (a delegate whose parent was killed runs
/// on to its end, as it would on a node).
pub fn wait_for_orphans(container_id: &str) {
    let needle = format!("CNI_CONTAINERID={container_id}\0");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let running = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("environ"))
                .map(|env| env.windows(needle.len()).any(|w| w == needle.as_bytes()))
                .unwrap_or(false)
        });
        if !running {
            return;
        }
        assert!(Instant::now() < deadline, "processes of {container_id} still running after 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Rig {
    pub fn macvlan() -> Rig {
        let lab = Lab::new();
        lab.add_nic("nic0", 9000);
        let dir = tempfile::tempdir().unwrap();
        let ipam = DataDir::new("ipam");
        let config = json!({"cniVersion": "1.1.0", "name": "rail0", "type": "plexus-macvlan", "master": "nic0",
            "multiRail": true,
            "ipam": {"type": "plexus-ipam", "range": "198.18.60.0/24", "dataDir": ipam,
                     "routes": [{"dst": "198.19.60.0/24", "gw": "198.18.60.254"}]},
            "runtimeConfig": {"CNIDeviceInfoFile": dir.path().join("devinfo/rail0-net1.json")}});
        Rig::with(lab, dir, ipam, DataDir::new("state"), "plexus-macvlan", config)
    }

    pub fn host_device() -> Rig {
        let lab = Lab::new();
        lab.add_nic("ens1f0", 9000);
        lab.node.ip(&["addr", "add", "198.18.61.5/24", "dev", "ens1f0"]);
        lab.node.ip(&["link", "set", "ens1f0", "alias", "rail-0 uplink"]);
        let dir = tempfile::tempdir().unwrap();
        let (ipam, state) = (DataDir::new("ipam"), DataDir::new("state"));
        let config = json!({"cniVersion": "1.1.0", "name": "rail0", "type": "plexus-host-device",
            "device": "ens1f0", "mtu": 4200, "dataDir": state,
            "ipam": {"type": "plexus-ipam", "range": "198.18.62.0/24", "dataDir": ipam},
            "runtimeConfig": {"CNIDeviceInfoFile": dir.path().join("devinfo/rail0-net1.json")}});
        Rig::with(lab, dir, ipam, state, "plexus-host-device", config)
    }

    /// plexus with two NADs from a directory: a macvlan rail and a conflist (macvlan + tuning).
    pub fn meta() -> Rig {
        let lab = Lab::new();
        lab.add_nic("nic0", 9000);
        lab.add_nic("nic1", 9000);
        let dir = tempfile::tempdir().unwrap();
        let nads = dir.path().join("nads");
        std::fs::create_dir_all(&nads).unwrap();
        let ipam = DataDir::new("ipam");
        let nad = |name: &str, config: Value| {
            let yaml = format!(
                "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  config: '{config}'\n"
            );
            std::fs::write(nads.join(format!("{name}.yaml")), yaml).unwrap();
        };
        nad(
            "rail0",
            json!({"cniVersion": "1.0.0", "type": "plexus-macvlan", "master": "nic0",
                   "ipam": {"type": "plexus-ipam", "range": "198.18.63.0/24", "dataDir": &ipam}}),
        );
        nad(
            "rail1",
            json!({"cniVersion": "1.0.0", "name": "rail1-chain", "plugins": [
                {"type": "plexus-macvlan", "master": "nic1",
                 "ipam": {"type": "plexus-ipam", "range": "198.18.64.0/24", "dataDir": &ipam}},
                {"type": "tuning", "promisc": true}]}),
        );
        let config = json!({"cniVersion": "1.1.0", "name": "plexus", "type": "plexus", "nadDir": nads,
            "networks": "rail0,rail1", "cniDir": dir.path().join("cache"), "binDir": bin_dir()});
        Rig::with(lab, dir, ipam, DataDir::new("state"), "plexus", config)
    }

    pub fn with(
        lab: Lab,
        dir: tempfile::TempDir,
        ipam: DataDir,
        state: DataDir,
        binary: &'static str,
        config: Value,
    ) -> Rig {
        std::fs::create_dir_all(dir.path().join("devinfo")).unwrap();
        let policy = write_policy(
            dir.path(),
            "policy.json",
            &json!({"dataRoots": [std::env::temp_dir()], "deviceInfoDir": dir.path().join("devinfo")}),
        );
        Rig { lab, dir, ipam, state, binary, config, policy }
    }

    pub fn container_id(&self) -> String {
        format!("fi-{}", self.lab.pod.name())
    }

    pub fn run(&self, verb: &str, fault: Option<(&str, usize, Mode)>, log: &Path) -> Outcome {
        let cni_path = format!("{}:{REFERENCE_CNI_DIR}", bin_dir().display());
        let mut run = PluginRun::new(plugin_bin(self.binary), verb)
            .attachment(&self.container_id(), &self.lab.pod.path(), "net1", &cni_path)
            .env("PLEXUS_POLICY", self.policy.to_str().unwrap())
            .env("PLEXUS_FAULT_LOG", log.to_str().unwrap())
            .env("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod1")
            .stdin(&self.config)
            .in_netns(&self.lab.node);
        if let Some((binary, n, mode)) = fault {
            let kill = if mode == Mode::Kill { ":kill" } else { "" };
            run = run.env("PLEXUS_FAULT", &format!("{binary}:{n}{kill}"));
        }
        let out = run.run();
        wait_for_orphans(&self.container_id());
        out
    }

    /// The node as the test compares it: its namespaces, and every file of the rig's
    /// directories (the data directories' under `ipam/` and `state/`).
    pub fn snapshot(&self) -> (Vec<String>, Vec<String>, BTreeSet<String>) {
        let mut all = files(self.dir.path());
        all.remove("policy.json");
        for (role, d) in [("ipam", &self.ipam), ("state", &self.state)] {
            all.extend(files(d.path()).into_iter().map(|f| format!("{role}/{f}")));
        }
        (self.lab.node.state(), self.lab.pod.state(), all)
    }

    /// Points one `binary` process passes in a clean `verb` (ADD, or DEL after a clean ADD).
    pub fn count_points(&self, binary: &str, verb: &str) -> usize {
        let log = self.dir.path().join("..").join(format!("{}.points", self.lab.pod.name()));
        let _ = std::fs::remove_file(&log);
        if verb == "DEL" {
            assert!(self.run("ADD", None, Path::new("/dev/null")).success());
        }
        let out = self.run(verb, None, &log);
        assert!(out.success(), "clean {verb}: {}", out.stdout);
        if verb == "ADD" {
            assert!(self.run("DEL", None, Path::new("/dev/null")).success());
        }
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        // Each process counts its own points: two delegates of one binary both fail at their
        // n-th point, so the points to cover are the most that one process passed.
        text.lines()
            .filter_map(|l| l.split_once(' ').filter(|(b, _)| *b == binary))
            .filter_map(|(_, rest)| rest.split(' ').next()?.parse::<usize>().ok())
            .max()
            .unwrap_or(0)
    }

    /// Inject at every point of `binary` in `verb`, both modes; after each, the runtime's DEL
    /// (`cache_gone`: with the meta-plugin's cache removed first) must restore `before`.
    /// Returns the number of points covered.
    pub fn every_point(&self, binary: &str, verb: &str, cache_gone: bool) -> usize {
        // A first cycle creates what stays (the IPAM store's directories and lock file).
        assert!(self.run("ADD", None, Path::new("/dev/null")).success());
        assert!(self.run("DEL", None, Path::new("/dev/null")).success());
        let before = self.snapshot();
        let points = self.count_points(binary, verb);
        assert!(points > 0, "{binary} passed no injection point in {verb}");
        for n in 1..=points {
            for mode in [Mode::Fail, Mode::Kill] {
                let what = format!("{binary} {verb} point {n}/{points} {mode:?}");
                if verb == "DEL" {
                    let add = self.run("ADD", None, Path::new("/dev/null"));
                    assert!(add.success(), "{what}: ADD: {}", add.stdout);
                }
                let faulted = self.run(verb, Some((binary, n, mode)), Path::new("/dev/null"));
                if mode == Mode::Fail && verb == "ADD" {
                    // An injected failure is reported, never swallowed into a success that holds
                    // less than it says (a result that succeeds anyway must still be complete:
                    // the DEL below cleans it).
                    if !faulted.success() {
                        let (code, msg, _) = faulted.error();
                        assert!(code != 0 && !msg.is_empty(), "{what}: {}", faulted.stdout);
                    }
                }
                if cache_gone {
                    for f in std::fs::read_dir(self.dir.path().join("cache")).into_iter().flatten().flatten() {
                        std::fs::remove_file(f.path()).unwrap();
                    }
                }
                let del = self.run("DEL", None, Path::new("/dev/null"));
                assert!(del.success(), "{what}: the runtime's DEL failed: {}", del.stdout);
                let after = self.snapshot();
                assert_eq!(after.0, before.0, "{what}: the node namespace changed");
                assert_eq!(after.1, before.1, "{what}: the pod namespace changed");
                assert_eq!(after.2, before.2, "{what}: files left or lost");
            }
        }
        eprintln!(
            "{binary} {verb}{}: {points} injection points, 2 modes each",
            if cache_gone { " (cache gone)" } else { "" }
        );
        points
    }
}
