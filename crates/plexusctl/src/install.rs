//! `plexusctl install`: the entrypoint of plexus's DaemonSet image (which has no shell), on the
//! library `plexus_install`.
//!
//!   run               install, then keep the kubeconfig, meta config and policy current; in
//!                     daemon mode start plexus-daemon (the command after `--`) and pass it
//!                     SIGTERM; when the pod ends because its DaemonSet was removed, uninstall
//!   once              install and exit (an init container, or by hand)
//!   uninstall         remove every file an install put on the node
//!   remove-daemonset  the chart's pre-delete hook
//!   installed         the readiness probe of thin mode: `run` has installed (its ready file is
//!                     there), so `kubectl rollout status` and `helm --wait` mean "on the node"
//!
//! A subcommand of plexusctl rather than a binary of its own: both link the same API client, and
//! the image is one 8 MB binary smaller.

use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use plexus_install::credentials::{self, Source};
use plexus_install::node::{self, Installed, Layout};
use plexus_k8s::api::Reply;
use plexus_node::paths;

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Install, keep it current, run the daemon given after `--`, uninstall when the DaemonSet goes.
    Run {
        #[command(flatten)]
        what: What,
        /// Seconds between looks at the service account, meta config and policy for changes.
        #[arg(long, default_value_t = 10)]
        refresh_seconds: u64,
        /// The DaemonSet (in this pod's namespace) whose removal means "uninstall from the node":
        /// at SIGTERM, when it is gone or being deleted, everything installed is removed.
        #[arg(long, env = "PLEXUS_DAEMONSET")]
        uninstall_when_removed: Option<String>,
        /// Written (in the container) once everything is installed: what `installed` looks for.
        #[arg(long, default_value = READY_FILE)]
        ready_file: PathBuf,
        /// The daemon to run and supervise (daemon mode): `-- /plexus/bin/plexus-daemon ...`.
        #[arg(last = true)]
        daemon: Vec<String>,
    },
    /// Exit 0 when `run` has installed (its ready file is there), 1 before: the DaemonSet's
    /// readiness probe in thin mode (daemon mode's is the daemon's /readyz, started after the
    /// install).
    Installed {
        #[arg(long, default_value = READY_FILE)]
        ready_file: PathBuf,
    },
    /// Install and exit.
    Once {
        #[command(flatten)]
        what: What,
    },
    /// Remove the binaries, meta config, credentials and policy an install put on the node.
    Uninstall {
        #[command(flatten)]
        what: What,
    },
    /// Delete the DaemonSet NAME (this pod's namespace) in the foreground and wait until it is
    /// gone: each of its pods, running `run --uninstall-when-removed`, uninstalls on its way out.
    /// The chart's pre-delete hook.
    RemoveDaemonset {
        name: String,
        /// The pod's service account mount.
        #[arg(long, default_value = SERVICE_ACCOUNT)]
        service_account: PathBuf,
        /// The longest wait for the pods to end.
        #[arg(long, default_value_t = 120)]
        timeout_seconds: u64,
    },
}

const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// `run`'s ready file: in the container's own file system, gone with the container.
const READY_FILE: &str = "/plexus/installed";

/// Where things come from and where they go. Set by the cluster admin (the DaemonSet's args).
#[derive(Args)]
pub(crate) struct What {
    /// Where the host's `/` is mounted in this container.
    #[arg(long, env = "PLEXUS_HOST_ROOT", default_value = "/host")]
    host_root: PathBuf,
    /// The binaries to install (default: the directory of this binary, the image's /plexus/bin).
    #[arg(long)]
    from: Option<PathBuf>,
    /// The node's CNI bin dir (a host path).
    #[arg(long, env = "CNI_BIN_DIR", default_value = paths::CNI_BIN_DIR)]
    bin_dir: PathBuf,
    /// The node's CNI conf dir (a host path).
    #[arg(long, env = "CNI_CONF_DIR", default_value = paths::CNI_CONF_DIR)]
    conf_dir: PathBuf,
    /// The meta config to install into the conf dir under its file name (e.g. a ConfigMap's
    /// `00-plexus.conflist`).
    #[arg(long)]
    meta_config: Option<PathBuf>,
    /// The node policy to install (0600) at --policy-path.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Where the node policy goes (a host path; plexus reads it there unless PLEXUS_POLICY says otherwise).
    #[arg(long, default_value = paths::POLICY_FILE)]
    policy_path: PathBuf,
    /// The pod's service account mount; its token and CA become the node's kubeconfig.
    #[arg(long, default_value = SERVICE_ACCOUNT)]
    service_account: PathBuf,
    /// Write no kubeconfig (plexus used without the Kubernetes API).
    #[arg(long)]
    no_kubeconfig: bool,
}

struct Plan {
    layout: Layout,
    from: PathBuf,
    binaries: Vec<String>,
    meta_config: Option<PathBuf>,
    policy: Option<PathBuf>,
    credentials: Option<Source>,
    service_account: PathBuf,
}

impl What {
    fn plan(self) -> Result<Plan> {
        let from = match self.from {
            Some(f) => f,
            None => std::env::current_exe()?.parent().context("this binary's directory")?.to_path_buf(),
        };
        let layout = Layout::new(self.host_root, self.bin_dir, self.conf_dir, self.policy_path)?;
        let binaries = node::shipped_binaries(&from)?;
        if binaries.is_empty() {
            bail!("no binaries to install in {}", from.display());
        }
        if let Some(m) = &self.meta_config {
            node::meta_config_name(m)?;
        }
        let credentials = if self.no_kubeconfig {
            None
        } else {
            let env = |k| std::env::var(k).unwrap_or_default();
            Some(Source::in_cluster(
                self.service_account.clone(),
                &env("KUBERNETES_SERVICE_HOST"),
                &env("KUBERNETES_SERVICE_PORT"),
            )?)
        };
        Ok(Plan {
            layout,
            from,
            binaries,
            meta_config: self.meta_config,
            policy: self.policy,
            credentials,
            service_account: self.service_account,
        })
    }
}

impl Plan {
    /// Everything in place: binaries first, credentials next, the meta config last (a runtime
    /// that finds it can run what it names).
    fn install(&self) -> Result<()> {
        let changed = node::install_binaries(&self.layout, &self.from, &self.binaries)?;
        log(&format!(
            "binaries in {}: {} replaced of {}",
            self.layout.bin_dir.display(),
            changed.len(),
            self.binaries.len()
        ));
        self.refresh(true)
    }

    /// Whatever changed since the last look: the token or CA, the meta config, the policy.
    fn refresh(&self, first: bool) -> Result<()> {
        if let Some(source) = &self.credentials
            && credentials::refresh(&self.layout, source)?
        {
            let dir = self.layout.credentials_dir();
            log(&format!("kubeconfig {} written", dir.join(credentials::KUBECONFIG).display()));
        }
        if let Some(policy) = &self.policy
            && node::install_policy(&self.layout, policy)?
        {
            log(&format!("node policy {} written", self.layout.policy_path.display()));
        }
        if let Some(meta) = &self.meta_config
            && (node::install_meta_config(&self.layout, meta)? || first)
        {
            log(&format!(
                "meta config {} in place",
                self.layout.conf_dir.join(node::meta_config_name(meta)?).display()
            ));
        }
        Ok(())
    }

    fn uninstall(&self) -> Result<()> {
        let meta = self.meta_config.as_deref().map(node::meta_config_name).transpose()?;
        let what = Installed { binaries: &self.binaries, meta_config: meta.as_deref(), policy: self.policy.is_some() };
        for p in node::uninstall(&self.layout, &what)? {
            log(&format!("removed {}", p.display()));
        }
        Ok(())
    }
}

fn log(msg: &str) {
    eprintln!("plexusctl install: {}", plexus_plugin::logging::escape_controls(msg));
}

/// Runs `plexusctl install CMD`. Its exit code is the supervised daemon's when that ended first.
pub(crate) fn main(cmd: Cmd) -> ExitCode {
    match execute(cmd) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            log(&format!("error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

fn execute(cmd: Cmd) -> Result<u8> {
    match cmd {
        Cmd::Once { what } => {
            what.plan()?.install()?;
            Ok(0)
        }
        Cmd::Uninstall { what } => {
            let mut plan = what.plan_for_removal()?;
            plan.credentials = None;
            plan.uninstall()?;
            Ok(0)
        }
        Cmd::RemoveDaemonset { name, service_account, timeout_seconds } => {
            remove_daemonset(&service_account, &name, Duration::from_secs(timeout_seconds))?;
            Ok(0)
        }
        Cmd::Run { what, refresh_seconds, uninstall_when_removed, ready_file, daemon } => {
            let plan = what.plan()?;
            let period = Duration::from_secs(refresh_seconds.max(1));
            run(&plan, period, uninstall_when_removed.as_deref(), &ready_file, &daemon)
        }
        Cmd::Installed { ready_file } => Ok(if ready_file.exists() { 0 } else { 1 }),
    }
}

impl What {
    /// [`What::plan`] without the service-account check: removal needs no credentials.
    fn plan_for_removal(mut self) -> Result<Plan> {
        self.no_kubeconfig = true;
        self.plan()
    }
}

/// Install, then wait for signals, a change to look at, or the daemon's end.
fn run(plan: &Plan, period: Duration, daemonset: Option<&str>, ready_file: &Path, daemon: &[String]) -> Result<u8> {
    let mut mask = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGCHLD] {
        mask.add(s);
    }
    mask.thread_block()?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC)?;
    plan.install()?;
    std::fs::write(ready_file, b"").with_context(|| format!("ready file {}", ready_file.display()))?;
    let mut child: Option<Child> = match daemon.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args);
            // The child starts with the signals this process blocked unblocked again: the daemon
            // gets SIGTERM as usual. (pthread_sigmask is async-signal-safe.)
            unsafe {
                command.pre_exec(move || mask.thread_unblock().map_err(std::io::Error::from));
            }
            let c = command.spawn().with_context(|| format!("start {program}"))?;
            log(&format!("started {program} (pid {})", c.id()));
            Some(c)
        }
        None => None,
    };
    let timeout = PollTimeout::try_from(period.as_millis().min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX);
    loop {
        let mut fds = [PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(0) => {
                if let Err(e) = plan.refresh(false) {
                    log(&format!("refresh: {e:#}")); // kept trying: the next look may succeed
                }
                continue;
            }
            Ok(_) => {}
        }
        let Some(info) = signals.read_signal()? else { continue };
        let signal = Signal::try_from(info.ssi_signo as i32)?;
        if signal == Signal::SIGCHLD {
            if let Some(code) = reap(&mut child) {
                log(&format!("the daemon ended ({code}); leaving"));
                return Ok(code);
            }
            continue;
        }
        log(&format!("{signal}: stopping"));
        let status = stop(&mut child, signal);
        if let Some(name) = daemonset {
            match removed(plan, name) {
                Ok(true) => {
                    log(&format!("DaemonSet {name} is removed: uninstalling"));
                    plan.uninstall()?;
                }
                Ok(false) => log(&format!("DaemonSet {name} is still there: plexus stays installed")),
                Err(e) => {
                    log(&format!("could not tell whether DaemonSet {name} is removed ({e:#}): plexus stays installed"))
                }
            }
        }
        return Ok(status);
    }
}

/// Reap every ended child (this is PID 1 in its container: orphans come here too). The daemon's
/// exit code when it is among them.
fn reap(child: &mut Option<Child>) -> Option<u8> {
    let daemon = child.as_ref().map(|c| Pid::from_raw(c.id() as i32));
    let mut ended = None;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if Some(pid) == daemon => ended = Some(code as u8),
            Ok(WaitStatus::Signaled(pid, sig, _)) if Some(pid) == daemon => ended = Some(128 + sig as i32 as u8),
            Ok(WaitStatus::StillAlive) | Err(_) => break,
            Ok(_) => {}
        }
    }
    if ended.is_some() {
        *child = None;
    }
    ended
}

/// Pass `signal` to the daemon and wait for it (its own grace period bounds the wait; the
/// kubelet's termination grace bounds ours). The code to exit with.
fn stop(child: &mut Option<Child>, signal: Signal) -> u8 {
    let Some(c) = child.take() else { return 0 };
    let pid = Pid::from_raw(c.id() as i32);
    let _ = kill(pid, signal);
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => return code as u8,
            Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32 as u8,
            Err(nix::errno::Errno::EINTR) | Ok(_) => continue,
            Err(_) => return 0, // already reaped
        }
    }
}

/// The DaemonSet `name` of this pod's namespace: its API path and a client with this pod's
/// service account.
fn daemonset(
    service_account: &std::path::Path,
    name: &str,
) -> Result<(plexus_k8s::names::ApiPath, String, plexus_k8s::api::ApiClient)> {
    let ns = std::fs::read_to_string(service_account.join("namespace")).context("the service account's namespace")?;
    let ns = ns.trim();
    let path = plexus_k8s::names::ApiPath::object("/apis/apps/v1", ns, "daemonsets", "DaemonSet", name)?;
    let env = |k| std::env::var(k).unwrap_or_default();
    let source = Source::in_cluster(
        service_account.to_path_buf(),
        &env("KUBERNETES_SERVICE_HOST"),
        &env("KUBERNETES_SERVICE_PORT"),
    )?;
    let client = source.client(Duration::from_secs(5))?;
    Ok((path, format!("{ns}/{name}"), client))
}

/// Whether the DaemonSet `name` in this pod's namespace is gone or being deleted.
fn removed(plan: &Plan, name: &str) -> Result<bool> {
    if plan.credentials.is_none() {
        bail!("--no-kubeconfig: no API server to ask");
    }
    let (path, shown, client) = daemonset(&plan.service_account, name)?;
    let reply = client.send(&format!("get daemonset {shown}"), http::Method::GET, &path, "application/json", None)?;
    Ok(match reply {
        Reply::NotFound => true,
        Reply::Ok(ds) => !ds["metadata"]["deletionTimestamp"].is_null(),
        Reply::Conflict(m) => bail!("{m}"),
    })
}

/// Delete in the foreground (the DaemonSet stays, being deleted, until its pods are gone), then
/// wait for it to go.
fn remove_daemonset(service_account: &std::path::Path, name: &str, timeout: Duration) -> Result<()> {
    let (path, shown, client) = daemonset(service_account, name)?;
    let body = serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"});
    let what = format!("delete daemonset {shown}");
    match client.send(&what, http::Method::DELETE, &path, "application/json", Some(&body))? {
        Reply::NotFound => {
            log(&format!("DaemonSet {shown} is not there"));
            return Ok(());
        }
        Reply::Conflict(m) => bail!("{what}: {m}"),
        Reply::Ok(_) => log(&format!("DaemonSet {shown}: deleting in the foreground")),
    }
    let start = std::time::Instant::now();
    loop {
        match client.send(&format!("get daemonset {shown}"), http::Method::GET, &path, "application/json", None)? {
            Reply::NotFound => {
                log(&format!("DaemonSet {shown} is gone, its pods with it"));
                return Ok(());
            }
            _ if start.elapsed() >= timeout => bail!("DaemonSet {shown} still there after {timeout:?}"),
            _ => std::thread::sleep(Duration::from_secs(1)),
        }
    }
}
