//! The plugin entry point: one function a plugin's `main` calls with its handlers.
//!
//! It reads the environment and stdin, validates them the way libcni's `pkg/skel` does, answers
//! VERSION, refuses verbs the config's version does not have, sets up logging, calls the handler
//! and prints exactly one JSON document on stdout: the result, or the error (with a non-zero exit).

use std::io::{Read, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::process::ExitCode;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::builtin::Runner;
use crate::logging::{self, LogTarget};
use plexus_cni::config::NetConf;
use plexus_cni::env::{CniEnv, Command, validate_network_name};
use plexus_cni::error::{Error, code};
use plexus_cni::result::{CniResult, write_json};
use plexus_cni::version::SpecVersion;
use plexus_node::policy::Policy;

/// The most configuration read from stdin (a NAD's config is tenant-written); more is code 6.
pub const STDIN_MAX_BYTES: usize = 16 * 1024 * 1024;

/// One invocation: the environment, the raw config and its parsed common part, and the node
/// policy.
#[derive(Clone, Debug)]
pub struct Request {
    pub env: CniEnv,
    pub version: SpecVersion,
    pub config: NetConf,
    pub stdin: Vec<u8>,
    pub policy: Policy,
    /// Where this invocation logs (chosen once, by the entry point; the meta-plugin hands it on).
    pub log: LogTarget,
    /// How its delegates run: the process's that dispatched it ([`dispatch`]).
    pub runner: Runner,
    /// Whether a delegation ran it: its environment carries [`crate::delegate::DELEGATED_ENV`]
    /// (read from the request's own environment, which in plexus-daemon is not the process's).
    pub delegated: bool,
}

/// An attachment the runtime still considers valid (GC).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ValidAttachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

impl Request {
    /// The plugin's own view of the config. Type errors name the key (`mtu: invalid type ...`).
    pub fn config_as<T: DeserializeOwned>(&self) -> Result<T, Error> {
        let de = &mut serde_json::Deserializer::from_slice(&self.stdin);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            Error::invalid_config(format!("invalid network config: {path}: {}", e.inner()))
        })
    }

    /// The sysfs root this request reads the node through ([`plexus_node::paths::SYSFS_ROOT_ENV`]
    /// in its environment, else `/sys`).
    pub fn sysfs_root(&self) -> std::path::PathBuf {
        let named = self.env.vars.iter().find(|(k, _)| k == plexus_node::paths::SYSFS_ROOT_ENV);
        plexus_node::paths::sysfs_root(named.map(|(_, v)| v.as_str()))
    }

    pub fn netns(&self) -> Option<&Path> {
        self.env.netns.as_deref()
    }

    /// The pod's namespace as the runtime names it (`CNI_ARGS` `K8S_POD_NAMESPACE`): the scope
    /// of the policy's per-namespace allow-lists.
    pub fn pod_namespace(&self) -> Option<&str> {
        self.env.args.get("K8S_POD_NAMESPACE").filter(|n| !n.is_empty())
    }

    /// GC: the attachments to keep, from `cni.dev/valid-attachments` or, from runtimes that
    /// followed the `spec-v1.1.0` text, `cni.dev/attachments` (cni#1101).
    pub fn valid_attachments(&self) -> Result<Vec<ValidAttachment>, Error> {
        for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
            if let Some(v) = self.config.extra.get(key) {
                return serde_json::from_value(v.clone()).map_err(|e| Error::decoding(format!("{key}: {e}")));
            }
        }
        Ok(Vec::new())
    }
}

/// What a plugin does for each verb. CHECK, GC and STATUS are the plugin's to define; a plugin
/// without resources of its own for GC/STATUS can keep the defaults, which succeed.
pub trait Plugin {
    fn add(&self, req: &Request) -> Result<CniResult, Error>;
    fn del(&self, req: &Request) -> Result<(), Error>;
    fn check(&self, req: &Request) -> Result<(), Error>;
    fn gc(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }
    fn status(&self, _req: &Request) -> Result<(), Error> {
        Ok(())
    }
    /// The `CNI_ARGS` keys this plugin (or a plugin it runs) reads, beyond the runtime's
    /// [`RUNTIME_ARGS`]: any other key fails ADD and CHECK with code 4 unless `CNI_ARGS` sets
    /// `IgnoreUnknown` (libcni's `types.LoadArgs`). DEL, GC and STATUS accept any.
    fn known_args(&self) -> &'static [&'static str] {
        &[]
    }
    /// Whether this invocation's config is the admin's (the meta-plugin run by the runtime from
    /// the CNI conf dir), so that its log settings apply. Delegate configs are not.
    fn admin_config(&self, _req: &Request) -> bool {
        false
    }
}

/// The plugin's name, version and build, printed on stderr when run without `CNI_COMMAND`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct About {
    pub name: &'static str,
    pub version: &'static str,
    /// The build's identity (`plexus_build_id::BUILD`), for plexus's own plugins: a long-running
    /// parent runs a plugin of its own build in-process ([`crate::builtin`]).
    pub build: Option<&'static str>,
}

impl About {
    /// The first line printed without `CNI_COMMAND`: `CNI plugin <name> <version>`, then
    /// ` (build <build>)` when the plugin has one.
    pub fn line(&self) -> String {
        match self.build {
            Some(build) => format!("CNI plugin {} {} (build {build})", self.name, self.version),
            None => format!("CNI plugin {} {}", self.name, self.version),
        }
    }
}

/// Set (to anything) with no `CNI_COMMAND`: a plexus plugin prints [`identity`] on stdout and
/// exits. Who may set it: whoever execs the binary; it only makes the binary say what it is.
pub const IDENTIFY_ENV: &str = "PLEXUS_IDENTIFY";

/// What a plugin of `about` answers to [`IDENTIFY_ENV`]: `<name> <build> <device> <inode>` of the
/// executable running it; `None` for a plugin without a build or an executable that cannot be
/// read.
pub fn identity(about: &About) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let build = about.build?;
    let exe = std::fs::metadata("/proc/self/exe").ok()?;
    Some(format!("{} {build} {} {}", about.name, exe.dev(), exe.ino()))
}

/// Run the plugin as a process: the whole `main` of a plugin binary.
pub fn run(about: About, plugin: &(impl Plugin + ?Sized)) -> ExitCode {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let runner = Runner::default();
    let env = |k: &str| std::env::var(k).ok();
    let status = dispatch(about, plugin, &runner, env, &mut stdin.lock(), &mut stdout.lock(), &mut stderr.lock());
    ExitCode::from(status)
}

/// For plexus's binaries that are not plugins (plexus-daemon, plexusctl): run as a delegate (a
/// `CNI_COMMAND` in the environment, whatever name the binary was installed under), print the
/// CNI error (code 7) a runtime or meta-plugin can read and exit at once; `None` otherwise.
pub fn refuse_as_delegate(name: &str) -> Option<ExitCode> {
    std::env::var_os("CNI_COMMAND").filter(|c| !c.is_empty())?;
    let e = Error::invalid_config(format!("{name} is not a CNI plugin: it does not run as a delegate"))
        .with_details(format!("plexus's own {:?} are never a network's \"type\"", crate::delegate::NOT_PLUGINS));
    let _ = write_json(&e.to_json(SpecVersion::LATEST), &mut std::io::stdout().lock());
    Some(ExitCode::FAILURE)
}

/// [`run`] with its inputs and outputs given: returns the exit status. The request's delegates
/// run as `runner` says.
pub fn dispatch(
    about: About,
    plugin: &(impl Plugin + ?Sized),
    runner: &Runner,
    getenv: impl Fn(&str) -> Option<String>,
    stdin: &mut impl Read,
    stdout: &mut impl Write,
    stderr: &mut impl Write,
) -> u8 {
    let command_set = getenv("CNI_COMMAND").is_some_and(|c| !c.is_empty());
    if !command_set && let Some(identity) = getenv(IDENTIFY_ENV).and(identity(&about)) {
        let _ = writeln!(stdout, "{identity}");
        return 0;
    }
    if !command_set {
        // skel: without a command, say what this is on stderr and succeed.
        let _ = writeln!(stderr, "{}", about.line());
        let _ = writeln!(stderr, "CNI protocol versions supported: {}", SpecVersion::supported_strings().join(", "));
        return 0;
    }
    let mut print_version = SpecVersion::LATEST;
    let outcome = prepare(runner, &getenv, stdin, &mut print_version).and_then(|req| match req {
        None => Ok(Some(version_document())),
        Some(mut req) => {
            req.log = LogTarget::choose(&req.config, plugin.admin_config(&req), &getenv, &req.policy);
            let _log = logging::init(&req.log, about.name);
            let netns = req.env.netns.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
            let span = tracing::info_span!("cni", command = %req.env.command, container = %req.env.container_id, ifname = %req.env.ifname, netns = %netns);
            let _enter = span.enter();
            tracing::debug!(config = %String::from_utf8_lossy(&req.stdin), "invoked");
            let out = catch_unwind(AssertUnwindSafe(|| call(plugin, &req)))
                .unwrap_or_else(|panic| Err(Error::internal(format!("plugin panicked: {}", panic_text(&panic)))));
            match &out {
                Ok(_) => tracing::debug!("succeeded"),
                Err(e) => tracing::error!(code = e.code, "{e}"),
            }
            out
        }
    });
    match outcome {
        Ok(None) => 0,
        Ok(Some(doc)) => match write_json(&doc, stdout) {
            Ok(()) => 0,
            Err(e) => {
                let _ = writeln!(stderr, "{e}");
                1
            }
        },
        Err(e) => {
            let _ = write_json(&e.to_json(print_version), stdout);
            1
        }
    }
}

fn version_document() -> Value {
    serde_json::json!({
        "cniVersion": SpecVersion::LATEST.as_str(),
        "supportedVersions": SpecVersion::supported_strings(),
    })
}

/// Validate env and stdin; `None` means VERSION. The request's delegates run as `runner` says,
/// and its node policy is read through it.
fn prepare(
    runner: &Runner,
    getenv: impl Fn(&str) -> Option<String>,
    stdin: &mut impl Read,
    print_version: &mut SpecVersion,
) -> Result<Option<Request>, Error> {
    // The policy's limit replaces the default once the policy is read (below).
    let env = CniEnv::from_lookup(&getenv, plexus_node::policy::Limits::default().request_timeout())?;
    if env.command == Command::Version {
        return Ok(None);
    }
    let raw = plexus_node::files::read_capped(stdin, STDIN_MAX_BYTES as u64)
        .map_err(|e| Error::io(format!("error reading from stdin: {e}")))?
        .ok_or_else(|| {
            Error::decoding(format!("network config on stdin is larger than {STDIN_MAX_BYTES} bytes: refused unread"))
        })?;
    let config = NetConf::parse(&raw)?;
    let version = config.version()?;
    *print_version = version;
    validate_network_name(&config.name)?;
    let min = match env.command {
        Command::Check => Some(SpecVersion::CHECK_MIN),
        Command::Gc | Command::Status => Some(SpecVersion::GC_STATUS_MIN),
        _ => None,
    };
    if let Some(min) = min
        && version < min
    {
        return Err(Error::new(
            code::INCOMPATIBLE_CNI_VERSION,
            format!("config version does not allow {}", env.command),
        )
        .with_details(format!("{} needs cniVersion {min} or later, config is {version}", env.command)));
    }
    if matches!(env.command, Command::Add | Command::Del) && !env.netns_override {
        refuse_own_netns(env.netns.as_deref())?;
    }
    let policy = runner.policy(&getenv)?;
    let mut env = env;
    env.deadline = plexus_cni::Deadline::from_env(&getenv, policy.limits.request_timeout());
    // The node policy this plugin runs under is its delegates' too (said outright: a plugin
    // served by plexus-daemon does not inherit the runtime's environment).
    // So is the view of the node: the sysfs root it reads through (plexus-daemon's in-process
    // delegates see their request's, not the daemon's environment).
    for key in [plexus_node::paths::POLICY_ENV, plexus_node::paths::SYSFS_ROOT_ENV] {
        if let Some(value) = getenv(key).filter(|v| !v.is_empty()) {
            env.vars.push((key.to_string(), value));
        }
    }
    // So is the runtime's trace context (also where the process's own environment is not the
    // runtime's: plexus-daemon, an in-process delegate).
    env.vars.extend(crate::trace::carried(&getenv));
    let delegated = getenv(crate::delegate::DELEGATED_ENV).is_some_and(|v| !v.is_empty());
    Ok(Some(Request {
        env,
        version,
        config,
        stdin: raw,
        policy,
        log: LogTarget::default(),
        runner: runner.clone(),
        delegated,
    }))
}

/// This process's own network namespace (device and inode), read once: `/proc/self` is the
/// thread group's leader, whose namespace no plexus code changes (setns happens on threads of
/// their own), so a long-running process (plexus-daemon) need not read it on every request.
fn own_netns() -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    static OWN: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    *OWN.get_or_init(|| std::fs::metadata("/proc/self/ns/net").ok().map(|m| (m.dev(), m.ino())))
}

fn refuse_own_netns(netns: Option<&Path>) -> Result<(), Error> {
    use std::os::unix::fs::MetadataExt;
    let Some(netns) = netns else { return Ok(()) };
    let (Ok(target), Some(own)) = (std::fs::metadata(netns), own_netns()) else {
        return Ok(()); // a missing netns is the handler's to judge (DEL must succeed)
    };
    if (target.dev(), target.ino()) == own {
        return Err(Error::new(code::INVALID_NETNS, "plugin's netns and netns from CNI_NETNS should not be the same")
            .with_details(netns.display().to_string()));
    }
    Ok(())
}

/// The `CNI_ARGS` keys runtimes set for a Kubernetes pod, which every plexus plugin reads.
pub const RUNTIME_ARGS: &[&str] = &["K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_INFRA_CONTAINER_ID", "K8S_POD_UID"];

fn call(plugin: &(impl Plugin + ?Sized), req: &Request) -> Result<Option<Value>, Error> {
    if matches!(req.env.command, Command::Add | Command::Check) {
        req.env.args.check_known(&[RUNTIME_ARGS, plugin.known_args()].concat())?;
    }
    match req.env.command {
        Command::Add => plugin.add(req)?.to_value(req.version).map(Some),
        Command::Del => plugin.del(req).map(|_| None),
        Command::Check => plugin.check(req).map(|_| None),
        Command::Gc => plugin.gc(req).map(|_| None),
        Command::Status => plugin.status(req).map(|_| None),
        Command::Version => Ok(Some(version_document())),
    }
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_about_line_names_the_build() {
        let about = About { name: "plexus-macvlan", version: "0.1.0", build: Some("0123456789abcdef") };
        assert_eq!(about.line(), "CNI plugin plexus-macvlan 0.1.0 (build 0123456789abcdef)");
        assert_eq!(About { build: None, ..about }.line(), "CNI plugin plexus-macvlan 0.1.0");
    }

    #[test]
    fn a_plugin_identifies_by_name_build_and_the_executable_running_it() {
        let about = About { name: "plexus-macvlan", version: "0.1.0", build: Some("0123456789abcdef") };
        let exe = std::fs::metadata("/proc/self/exe").unwrap();
        assert_eq!(identity(&about), Some(format!("plexus-macvlan 0123456789abcdef {} {}", exe.dev(), exe.ino())));
        assert_eq!(identity(&About { build: None, ..about }), None);
    }
}
