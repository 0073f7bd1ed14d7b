//! A plugin the process carries runs in-process exactly while the binary a delegation finds says
//! it is that plugin of this build; its answer, its environment and its failures are a child's.
//! Which plugins run in-process is a [`Runner`]'s, handed to each request: each test makes its own,
//! and what one runner learns or gives up is not another's.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use plexus_cni::{CniArgs, CniEnv, CniResult, Command, Error, IpConfig, code};
use plexus_plugin::builtin::{Builtin, Runner};
use plexus_plugin::{About, Plugin, Request};
use serde_json::json;

const NAME: &str = "probe-plugin";
const BUILD: &str = "0123456789abcdef";

/// The carried plugin: ADD answers with 198.18.0.2 and what its environment said; CHECK panics.
struct InProcess;

impl Plugin for InProcess {
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let mut r = CniResult::default();
        r.ips.push(IpConfig { address: "198.18.0.2/24".parse().unwrap(), gateway: None, interface: None });
        r.interfaces.push(plexus_cni::Interface {
            name: format!(
                "{}/{}/{}",
                req.env.ifname,
                req.env.container_id,
                req.env.args.get("K8S_POD_NAME").unwrap_or("-")
            ),
            sandbox: req.env.netns.as_ref().map(|p| p.display().to_string()),
            ..Default::default()
        });
        let file = req.log.file.as_ref().map(|f| f.display().to_string()).unwrap_or_default();
        r.dns.domain = format!("{file} {}", req.log.level.as_deref().unwrap_or_default());
        // How its own delegates would run (plexus-macvlan's IPAM, in plexus-daemon).
        r.dns.search.push(format!("{:?}", req.runner));
        Ok(r)
    }
    fn del(&self, _req: &Request) -> Result<(), Error> {
        Err(Error::new(code::DELEGATE_FAILED, "in-process DEL says no"))
    }
    fn check(&self, _req: &Request) -> Result<(), Error> {
        panic!("a bug in the plugin")
    }
}

static CARRIED: [Builtin; 1] =
    [Builtin { about: About { name: NAME, version: "0.1.0", build: Some(BUILD) }, plugin: &InProcess }];

/// The plugin's binary: a script that, asked what it is, says `NAME` of `build` and gives the
/// device and inode of `who` (itself, as a plugin binary gives its own executable's), and answers
/// ADD with 198.18.0.1 (so an exec'd run is told from an in-process one).
fn install_as(dir: &Path, build: &str, who: &str) -> PathBuf {
    let path = dir.join(NAME);
    let script = format!(
        "#!/bin/sh\nif [ -z \"$CNI_COMMAND\" ]; then\n  [ -n \"$PLEXUS_IDENTIFY\" ] && echo \"{NAME} {build} $(stat -L -c '%d %i' {who})\"\n  exit 0\nfi\n\
         cat > /dev/null\necho '{{\"cniVersion\":\"1.0.0\",\"ips\":[{{\"address\":\"198.18.0.1/24\"}}]}}'\n"
    );
    let tmp = dir.join(".new");
    std::fs::write(&tmp, script).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

fn install(dir: &Path, build: &str) -> PathBuf {
    install_as(dir, build, "\"$0\"")
}

fn env(dir: &Path, command: Command) -> CniEnv {
    CniEnv {
        command,
        container_id: "c1".into(),
        netns: Some("/var/run/netns/pod-1".into()),
        ifname: "net1".into(),
        args: CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAME=pod-1").unwrap(),
        path: vec![dir.to_path_buf()],
        netns_override: false,
        vars: vec![
            ("PLEXUS_LOG_FILE".into(), dir.join("log").display().to_string()),
            ("PLEXUS_LOG_LEVEL".into(), "debug".into()),
        ],
        deadline: plexus_cni::Deadline::after(std::time::Duration::from_secs(60)),
    }
}

fn add(runner: &Runner, dir: &Path) -> CniResult {
    let conf = json!({"cniVersion": "1.0.0", "name": "n", "type": NAME});
    runner.exec(NAME, Command::Add, &env(dir, Command::Add), &conf).unwrap().unwrap()
}

fn address(r: &CniResult) -> String {
    r.ips[0].address.to_string()
}

#[test]
fn a_carried_plugin_runs_in_process_only_while_its_binary_says_it_is_this_build() {
    let runner = Runner::parent(&CARRIED);
    let dir = tempfile::tempdir().unwrap();
    install(dir.path(), BUILD);
    let r = add(&runner, dir.path());
    assert_eq!(address(&r), "198.18.0.2/24", "the binary is this build: in-process");
    assert_eq!(r.interfaces[0].name, "net1/c1/pod-1", "the CNI environment is the delegation's");
    assert_eq!(r.interfaces[0].sandbox.as_deref(), Some("/var/run/netns/pod-1"));
    let log = dir.path().join("log");
    assert_eq!(r.dns.domain, format!("{} debug", log.display()), "the delegation's own variables reach the plugin");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("invoked") && logged.contains("c1"), "it logs where they say: {logged}");

    // Another build installed over it (a new file): seen at the next delegation.
    std::thread::sleep(std::time::Duration::from_millis(10));
    install(dir.path(), "fedcba9876543210");
    assert_eq!(address(&add(&runner, dir.path())), "198.18.0.1/24", "another build: exec'd");
    install(dir.path(), BUILD);
    assert_eq!(address(&add(&runner, dir.path())), "198.18.0.2/24");
}

#[test]
fn a_wrapper_that_execs_the_plugin_and_a_binary_of_another_name_are_execd() {
    let runner = Runner::parent(&CARRIED);
    let dir = tempfile::tempdir().unwrap();
    // What answers is another executable than the file delegated to (a wrapper script that execs
    // the plugin): the wrapper's own steps must run, so it is exec'd.
    install_as(dir.path(), BUILD, "/bin/sh");
    assert_eq!(address(&add(&runner, dir.path())), "198.18.0.1/24", "a wrapper");
    let path = install(dir.path(), BUILD);
    let renamed =
        std::fs::read_to_string(&path).unwrap().replace(&format!("{NAME} {BUILD}"), &format!("other {BUILD}"));
    std::fs::write(dir.path().join(".other"), renamed).unwrap();
    std::fs::set_permissions(dir.path().join(".other"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::rename(dir.path().join(".other"), &path).unwrap();
    assert_eq!(address(&add(&runner, dir.path())), "198.18.0.1/24", "another plugin of this build");
    // A file of another name is never asked, even one that would say it is the carried plugin.
    let asked = dir.path().join("asked");
    let other = dir.path().join("other-plugin");
    let script = format!(
        "#!/bin/sh\nif [ -n \"$PLEXUS_IDENTIFY\" ]; then touch {}; echo \"{NAME} {BUILD} $(stat -L -c '%d %i' \"$0\")\"; exit 0; fi\n\
         cat > /dev/null\necho '{{\"cniVersion\":\"1.0.0\",\"ips\":[{{\"address\":\"198.18.0.3/24\"}}]}}'\n",
        asked.display()
    );
    std::fs::write(&other, script).unwrap();
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
    let conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "other-plugin"});
    let r = runner.exec("other-plugin", Command::Add, &env(dir.path(), Command::Add), &conf).unwrap().unwrap();
    assert_eq!(address(&r), "198.18.0.3/24");
    assert!(!asked.exists(), "a plugin of another name was asked what it is");
}

#[test]
fn an_in_process_plugin_fails_and_panics_as_its_binary_would() {
    let runner = Runner::parent(&CARRIED);
    let dir = tempfile::tempdir().unwrap();
    install(dir.path(), BUILD);
    let conf = json!({"cniVersion": "1.0.0", "name": "n", "type": NAME});
    let e = runner.exec(NAME, Command::Del, &env(dir.path(), Command::Del), &conf).unwrap_err();
    assert_eq!((e.code, e.msg.as_str()), (code::DELEGATE_FAILED, "in-process DEL says no"));
    let e = runner.exec(NAME, Command::Check, &env(dir.path(), Command::Check), &conf).unwrap_err();
    assert_eq!(e.code, code::INTERNAL);
    assert!(e.msg.contains("plugin panicked: a bug in the plugin"), "{e}");
    // ... and the process goes on: the next delegation is served.
    assert_eq!(address(&add(&runner, dir.path())), "198.18.0.2/24");
}

#[test]
fn a_binary_that_leaves_a_process_holding_its_output_is_not_waited_for() {
    let runner = Runner::parent(&CARRIED);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(NAME);
    let pid_file = dir.path().join("lingering.pid");
    // Asked what it is, it answers and exits, leaving a process with its stdout open behind.
    let script = format!(
        "#!/bin/sh\nif [ -z \"$CNI_COMMAND\" ]; then\n  echo \"{NAME} {BUILD} $(stat -L -c '%d %i' \"$0\")\"\n  \
         sleep 20 &\n  echo $! > {}\n  exit 0\nfi\n",
        pid_file.display()
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let started = std::time::Instant::now();
    let r = add(&runner, dir.path());
    let took = started.elapsed();
    if let Ok(pid) = std::fs::read_to_string(&pid_file) {
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid.trim().parse().unwrap()), nix::sys::signal::SIGKILL);
    }
    assert_eq!(address(&r), "198.18.0.2/24", "its answer was read: in-process");
    assert!(took < std::time::Duration::from_secs(10), "the delegation waited {took:?} for the lingering process");
}

#[test]
fn a_plugin_run_in_process_delegates_as_its_parent_does() {
    let runner = Runner::parent(&CARRIED);
    let dir = tempfile::tempdir().unwrap();
    install(dir.path(), BUILD);
    let r = add(&runner, dir.path());
    assert_eq!(address(&r), "198.18.0.2/24");
    let said = &r.dns.search[0];
    assert!(said.contains("parent") && said.contains(NAME), "the request's runner is not its parent's: {said}");
}

#[test]
fn a_plugin_binarys_runner_execs_every_delegate_even_one_of_this_build() {
    let dir = tempfile::tempdir().unwrap();
    install(dir.path(), BUILD);
    assert_eq!(address(&add(&Runner::default(), dir.path())), "198.18.0.1/24");
    assert!(!Runner::default().given_up());
}

#[test]
fn a_runner_that_gave_up_execs_from_then_on_and_others_do_not_follow() {
    let (gave_up, other) = (Runner::parent(&CARRIED), Runner::parent(&CARRIED));
    let dir = tempfile::tempdir().unwrap();
    install(dir.path(), BUILD);
    assert_eq!(address(&add(&gave_up, dir.path())), "198.18.0.2/24");
    gave_up.give_up("a test's request overran");
    assert!(gave_up.given_up() && gave_up.clone().given_up(), "a clone shares what its runner gave up");
    assert_eq!(address(&add(&gave_up, dir.path())), "198.18.0.1/24", "given up: exec'd");
    assert!(!other.given_up());
    assert_eq!(address(&add(&other, dir.path())), "198.18.0.2/24", "another runner still runs it in-process");
}
