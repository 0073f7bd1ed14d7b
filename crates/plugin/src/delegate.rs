//! Delegation: find a plugin by `type` in `CNI_PATH` and run it (no shell), as libcni
//! `pkg/invoke` does. The delegate inherits this process's environment with the `CNI_*`
//! variables replaced by the ones given.
//!
//! Unlike libcni, a delegate runs within the request's deadline ([`plexus_cni::deadline`]): it runs in
//! a process group of its own, and when it has not finished by then (it hangs, it spins, it prints
//! nothing) the whole group is killed and the delegation fails with code 11. The group is killed
//! when the delegate ends as well, so nothing it started outlives the request; its output is read
//! up to [`OUTPUT_MAX`].
//!
//! The trust rule lives here, at the one place every delegation passes — a meta-plugin's
//! network, a chained plugin, an attaching plugin's IPAM, a delegate of a delegate, exec'd or
//! in-process: a binary that is not a CNI delegate is never run as one ([`resolve`]). By its
//! name (plexus's and Multus's meta-plugins, plexus's tools) and by what the file itself says it
//! is (its role note, [`crate::role`]: the meta-plugin under any name, a copy, a link). Whatever
//! the config, wherever it came from, nothing else decides it: no environment variable, no
//! caller's check. A DEL or GC of such a delegate succeeds with nothing run (nothing of it can
//! exist: it never ran). Every delegate is also handed [`DELEGATED_ENV`], for what this seam
//! cannot see: a binary it does not know (a wrapper script, another project's plugin) that runs
//! plexus in turn passes its environment on.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};

use serde_json::Value;

use plexus_cni::env::{CniEnv, Command};

use crate::builtin::Runner;
use crate::role::Role;
use plexus_cni::error::{Error, code};
use plexus_cni::result::CniResult;

/// How much of a failed delegate's unstructured output an error repeats.
const OUTPUT_EXCERPT: usize = 2048;

/// The most a delegate may print on stdout or stderr: beyond it, it is killed (a result is a few
/// KiB; the bound keeps a delegate that prints forever from growing the caller's memory).
pub const OUTPUT_MAX: usize = crate::STDIN_MAX_BYTES;

/// Set (to `1`) in every delegate's environment: a plexus that finds it in its request's
/// environment was run by a delegation, with a config a network chose ([`crate::Request::delegated`]).
/// Who may set it: anyone who execs plexus; it can only make plexus refuse more.
pub const DELEGATED_ENV: &str = "PLEXUS_META_DELEGATE";

/// Meta-plugins by name: a delegate may not be one (it would run its own delegates with a config
/// a network wrote: `binDir`, `kubeconfig`, `delegates`). plexus's own is known by its role note
/// under any name too.
pub const META_PLUGINS: &[&str] = &["plexus", "multus", "multus-shim"];

/// plexus's own binaries that are not CNI plugins, by name; by their role note under any name.
/// Each of them also refuses to run when it finds `CNI_COMMAND` in its environment
/// ([`crate::refuse_as_delegate`]).
pub const NOT_PLUGINS: &[&str] = &["plexus-daemon", "plexusctl"];

/// Why `plugin_type`, found at `binary`, may not be a delegate; `None` when it may.
fn forbidden(plugin_type: &str, binary: Option<&Path>) -> Option<Error> {
    let role = if META_PLUGINS.contains(&plugin_type) {
        Role::Meta
    } else if NOT_PLUGINS.contains(&plugin_type) {
        Role::Tool
    } else {
        binary.and_then(crate::role::of_file).unwrap_or(Role::Delegate)
    };
    match role {
        Role::Delegate => None,
        Role::Meta => Some(
            Error::invalid_config(format!("plugin type {plugin_type:?} is a meta-plugin: a network may not run one"))
                .with_details("it would run its own delegates with settings the network chose"),
        ),
        Role::Tool => Some(
            Error::invalid_config(format!("plugin type {plugin_type:?} is not a CNI plugin"))
                .with_details(format!("plexus's own {NOT_PLUGINS:?} are never run as a delegate")),
        ),
    }
}

/// The executable for plugin `plugin_type` in the directories of `CNI_PATH`, whatever it is.
pub fn find_plugin(plugin_type: &str, cni_path: &[PathBuf]) -> Result<PathBuf, Error> {
    if plugin_type.is_empty() || plugin_type == "." || plugin_type == ".." || plugin_type.contains('/') {
        return Err(Error::invalid_config(format!("invalid plugin type {plugin_type:?}"))
            .with_details("a plugin type is a file name in CNI_PATH, without '/'"));
    }
    cni_path.iter().map(|dir| dir.join(plugin_type)).find(|p| is_executable_file(p)).ok_or_else(|| {
        let dirs: Vec<String> = cni_path.iter().map(|d| d.display().to_string()).collect();
        Error::new(
            code::DELEGATE_NOT_FOUND,
            format!("failed to find plugin {plugin_type:?} in path [{}]", dirs.join(" ")),
        )
        .with_details("CNI_PATH lists the directories searched; install the plugin there or fix \"type\"")
    })
}

/// The executable a delegation of `plugin_type` runs: found in `cni_path`, and a delegate (code
/// 7 for a meta-plugin or a plexus binary that is not a plugin, by name or by its role note).
/// Every delegation runs through it; a caller may ask it first, to refuse before anything runs.
pub fn resolve(plugin_type: &str, cni_path: &[PathBuf]) -> Result<PathBuf, Error> {
    if let Some(e) = forbidden(plugin_type, None) {
        return Err(e);
    }
    let binary = find_plugin(plugin_type, cni_path)?;
    match forbidden(plugin_type, Some(&binary)) {
        Some(e) => Err(e),
        None => Ok(binary),
    }
}

/// Refuse `plugin_type` when a delegation of it would be refused as not a delegate ([`resolve`]);
/// a type not installed is left for its delegation to report. For a caller that refuses a whole
/// network before any of it runs.
pub fn refuse_forbidden(plugin_type: &str, cni_path: &[PathBuf]) -> Result<(), Error> {
    match resolve(plugin_type, cni_path) {
        Err(e) if e.code == code::INVALID_NETWORK_CONFIG => Err(e),
        _ => Ok(()),
    }
}

fn is_executable_file(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Runner {
    /// Run `plugin_type` for `command` with `config` on stdin and `env` as its CNI environment.
    /// ADD returns the delegate's result (in whatever version it printed); the other verbs `None`.
    pub fn exec(
        &self,
        plugin_type: &str,
        command: Command,
        env: &CniEnv,
        config: &Value,
    ) -> Result<Option<CniResult>, Error> {
        self.start(plugin_type, command, env, config, Waited::Now)?.wait()
    }

    /// Start `plugin_type` for `command`; [`Running::wait`] collects its outcome.
    pub fn spawn(&self, plugin_type: &str, command: Command, env: &CniEnv, config: &Value) -> Result<Running, Error> {
        self.start(plugin_type, command, env, config, Waited::Later)
    }

    fn start(
        &self,
        plugin_type: &str,
        command: Command,
        env: &CniEnv,
        config: &Value,
        waited: Waited,
    ) -> Result<Running, Error> {
        let found =
            if self.is_runtime() { find_plugin(plugin_type, &env.path) } else { resolve(plugin_type, &env.path) };
        let binary = match found {
            Ok(binary) => binary,
            // Never run, so nothing of it exists to delete or collect.
            Err(e) if e.code == code::INVALID_NETWORK_CONFIG && matches!(command, Command::Del | Command::Gc) => {
                tracing::error!(plugin = plugin_type, %command, "not run, nothing to release: {e}");
                return Ok(Running::skipped(plugin_type, command, env, self));
            }
            Err(e) => return Err(e),
        };
        plexus_node::fault::at(plexus_node::fault::Point::Exec)?;
        // Out of time a moment before this request: what ran out is still reported.
        let env = &CniEnv { deadline: env.deadline.a_moment_before(), ..env.clone() };
        let stdin =
            serde_json::to_vec(config).map_err(|e| Error::internal(format!("encoding delegate config: {e}")))?;
        let failed =
            |e: std::io::Error| Error::new(code::DELEGATE_FAILED, format!("running plugin {plugin_type:?}: {e}"));
        let run = match self.lookup(&binary) {
            Some(builtin) => {
                tracing::debug!(plugin = plugin_type, %command, binary = %binary.display(), "delegating, in-process");
                let env = child_env(command, env, !self.is_runtime()).map_err(failed)?;
                match waited {
                    Waited::Now => Run::Ran(crate::builtin::run(builtin, self, &env, &stdin)),
                    Waited::Later => {
                        Run::InProcess(crate::builtin::start(builtin, self.clone(), env, stdin).map_err(failed)?)
                    }
                }
            }
            None => {
                tracing::debug!(plugin = plugin_type, %command, binary = %binary.display(), "delegating");
                let (child, feeder) = start(&binary, command, env, !self.is_runtime(), stdin).map_err(failed)?;
                Run::Child { child, feeder }
            }
        };
        Ok(Running { plugin_type: plugin_type.to_string(), command, run, deadline: env.deadline, runner: self.clone() })
    }
}

/// A delegate started and not yet waited for: it runs while the caller does other work.
#[derive(Debug)]
pub struct Running {
    plugin_type: String,
    command: Command,
    run: Run,
    deadline: plexus_cni::Deadline,
    /// The runner it was started by: an in-process run that overruns gives up its in-process runs.
    runner: Runner,
}

/// How a delegate runs: its binary as a child process, or (a plugin this process carries, of
/// this build: [`crate::builtin`]) in this process — on a thread of its own, or already run on
/// the caller's when the caller waits for it at once.
#[derive(Debug)]
enum Run {
    Child { child: Child, feeder: Option<std::thread::JoinHandle<()>> },
    InProcess(std::sync::mpsc::Receiver<std::process::Output>),
    Ran(std::process::Output),
}

/// Whether the caller waits for the delegate at once ([`Runner::exec`]) or works meanwhile ([`Runner::spawn`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waited {
    Now,
    Later,
}

impl Running {
    fn skipped(plugin_type: &str, command: Command, env: &CniEnv, runner: &Runner) -> Running {
        use std::os::unix::process::ExitStatusExt;
        let out = std::process::Output {
            status: std::process::ExitStatus::from_raw(0),
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        Running {
            plugin_type: plugin_type.to_string(),
            command,
            run: Run::Ran(out),
            deadline: env.deadline,
            runner: runner.clone(),
        }
    }

    /// Wait for the delegate: ADD yields its result, the other verbs `None`; a failure yields the
    /// delegate's own CNI error.
    pub fn wait(self) -> Result<Option<CniResult>, Error> {
        let Running { plugin_type, command, run, deadline, runner } = self;
        let failed = |e: String| Error::new(code::DELEGATE_FAILED, format!("running plugin {plugin_type:?}: {e}"));
        let out = match run {
            Run::Child { child, feeder } => {
                let out = collect(child, deadline).map_err(|e| match e {
                    Collected::Failed(e) => failed(e.to_string()),
                    Collected::TimedOut => {
                        deadline.expired(format!("plugin {plugin_type:?} ({command}) did not finish: killed"))
                    }
                    Collected::TooMuch => failed(format!("it printed more than {OUTPUT_MAX} bytes: killed")),
                })?;
                if let Some(f) = feeder {
                    let _ = f.join();
                }
                out
            }
            Run::InProcess(answer) => match answer.recv_timeout(deadline.remaining()) {
                Ok(out) => out,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    // A thread cannot be killed: it is left, and no delegate runs in-process from
                    // now on (a process can be killed at its deadline).
                    runner.give_up(&format!("plugin {plugin_type:?} ({command}) overran its deadline"));
                    return Err(
                        deadline.expired(format!("plugin {plugin_type:?} ({command}, in-process) did not finish"))
                    );
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(failed("its in-process thread panicked".into()));
                }
            },
            Run::Ran(out) => out,
        };
        if !out.status.success() {
            let err = delegate_error(&plugin_type, &out);
            tracing::debug!(plugin = %plugin_type, %command, code = err.code, "delegate failed: {err}");
            return Err(err);
        }
        if command != Command::Add {
            return Ok(None);
        }
        CniResult::parse(&out.stdout).map(Some).map_err(|e| {
            Error::new(
                code::DELEGATE_FAILED,
                format!("plugin {plugin_type:?} returned an unreadable result: {}", e.msg),
            )
            .with_details(excerpt(&out.stdout))
        })
    }
}

/// Configs up to this size go into the pipe at once (a pipe holds 64 KiB): no thread needed.
const STDIN_INLINE_MAX: usize = 16 * 1024;

/// What a delegate's environment changes from this process's: the `CNI_*` variables of
/// `command` and `env`, then `env`'s own variables; `None` removes a variable.
fn child_env(command: Command, env: &CniEnv, delegated: bool) -> std::io::Result<HashMap<String, Option<String>>> {
    let path = std::env::join_paths(&env.path).map_err(std::io::Error::other)?.to_string_lossy().into_owned();
    let mut vars: HashMap<String, Option<String>> = [
        ("CNI_COMMAND", Some(command.as_str().to_string())),
        ("CNI_CONTAINERID", Some(env.container_id.clone())),
        ("CNI_IFNAME", Some(env.ifname.clone())),
        ("CNI_ARGS", Some(env.args.to_env_string())),
        ("CNI_PATH", Some(path)),
        ("CNI_NETNS", env.netns.as_ref().map(|ns| ns.display().to_string())),
        (plexus_cni::deadline::DEADLINE_ENV, Some(env.deadline.to_env())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    // The trace context is the request's (`env.vars`), never what this process inherited. So are
    // a delegate's node policy and sysfs root: a request that names none is delegated naming
    // none, as it was itself planned (plexus-daemon's own PLEXUS_POLICY is not its requests').
    // A runtime's plugins (plexusctl's, as cnitool's) get the runtime's environment, as ever.
    vars.extend(crate::trace::TRACE_CONTEXT_ENV.iter().map(|(k, _)| (k.to_string(), None)));
    if delegated {
        vars.extend(
            [plexus_node::paths::POLICY_ENV, plexus_node::paths::SYSFS_ROOT_ENV].map(|k| (k.to_string(), None)),
        );
    }
    vars.extend(env.vars.iter().map(|(k, v)| (k.clone(), Some(v.clone()))));
    if delegated {
        vars.insert(DELEGATED_ENV.to_string(), Some("1".to_string()));
    }
    Ok(vars)
}

fn start(
    binary: &Path,
    command: Command,
    env: &CniEnv,
    delegated: bool,
    stdin: Vec<u8>,
) -> std::io::Result<(Child, Option<std::thread::JoinHandle<()>>)> {
    let mut cmd = Process::new(binary);
    for (k, v) in child_env(command, env, delegated)? {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // A group of its own: at its deadline, and when it ends, the group is killed, so nothing it
    // started outlives the request.
    cmd.process_group(0);
    // It dies with the thread that started it ([`crate::builtin::Runner`]).
    let parent = nix::unistd::getpid();
    // SAFETY: between fork and exec only prctl(2) and getppid(2): no allocation, no lock.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other("the parent died before the delegate started"));
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let mut pipe = child.stdin.take().expect("stdin is piped");
    if stdin.len() <= STDIN_INLINE_MAX {
        // Fits in the pipe: written at once, whatever the delegate does first.
        let _ = pipe.write_all(&stdin);
        return Ok((child, None));
    }
    // Larger: from a thread, so a delegate that writes before it reads cannot deadlock us.
    let feeder = std::thread::spawn(move || {
        let _ = pipe.write_all(&stdin);
    });
    Ok((child, Some(feeder)))
}

/// Why a child's output could not be collected.
enum Collected {
    Failed(std::io::Error),
    /// Still running at the deadline: its group was killed.
    TimedOut,
    /// It printed more than [`OUTPUT_MAX`]: its group was killed.
    TooMuch,
}

/// Kill what is left of the delegate's process group (the delegate itself exited, or is to die).
fn kill_group(child: &Child) {
    let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
    let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
}

/// A descriptor that becomes readable when process `pid` exits (`pidfd_open(2)`, Linux 5.3);
/// `None` where the kernel has none (the exit is then looked for every 20 ms).
fn exit_fd(pid: i32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor or -1; no memory is
    // passed.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a descriptor pidfd_open just returned, owned by nothing else.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Read the child's stdout and stderr until both close or the child exits (a process it left
/// may hold them open: what the child wrote is in the pipes by then), then wait for it to exit,
/// all by the deadline; then kill its group (before the child is reaped, so the group's ID is
/// still its own) and reap it.
fn collect(mut child: Child, deadline: plexus_cni::Deadline) -> Result<std::process::Output, Collected> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    use std::io::Read;
    use std::os::fd::AsFd;

    let give_up = |child: &mut Child, why: Collected| {
        kill_group(child);
        let _ = child.wait();
        Err(why)
    };
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let has_exited = || {
        loop {
            match waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG) {
                Ok(WaitStatus::StillAlive) => return Ok(false),
                Ok(_) => return Ok(true),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(std::io::Error::from(e)),
            }
        }
    };
    let exited_fd = exit_fd(pid.as_raw());
    let mut pipes = [child.stdout.take().map(ChildOutput::Out), child.stderr.take().map(ChildOutput::Err)];
    for p in pipes.iter().flatten() {
        let _ = fcntl(p, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
    }
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut chunk = vec![0u8; 64 * 1024];
    // Everything there is to read now, from every pipe still open.
    let mut drain = |pipes: &mut [Option<ChildOutput>; 2]| -> Result<(), Collected> {
        for slot in pipes.iter_mut() {
            while let Some(pipe) = slot {
                let (n, buf) = match pipe {
                    ChildOutput::Out(p) => (p.read(&mut chunk), &mut stdout),
                    ChildOutput::Err(p) => (p.read(&mut chunk), &mut stderr),
                };
                match n {
                    Ok(0) => *slot = None,
                    Ok(n) if buf.len() + n > OUTPUT_MAX => return Err(Collected::TooMuch),
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Collected::Failed(e)),
                }
            }
        }
        Ok(())
    };
    let mut exited = false;
    while pipes.iter().any(Option::is_some) && !exited {
        let left = deadline.remaining();
        if left.is_zero() {
            return give_up(&mut child, Collected::TimedOut);
        }
        let wait = match exited_fd {
            Some(_) => left,
            None => left.min(std::time::Duration::from_millis(20)),
        };
        let polled = {
            let mut fds: Vec<PollFd> =
                pipes.iter().flatten().map(|p| PollFd::new(p.as_fd(), PollFlags::POLLIN)).collect();
            if let Some(fd) = &exited_fd {
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            }
            poll(&mut fds, PollTimeout::try_from(wait).unwrap_or(PollTimeout::MAX))
        };
        match polled {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return give_up(&mut child, Collected::Failed(e.into())),
        }
        if let Err(why) = drain(&mut pipes) {
            return give_up(&mut child, why);
        }
        exited = match has_exited() {
            Ok(e) => e,
            Err(e) => return give_up(&mut child, Collected::Failed(e)),
        };
    }
    if exited && let Err(why) = drain(&mut pipes) {
        return give_up(&mut child, why);
    }
    drop(pipes);
    // Both pipes closed, or it exited: wait for its end (it may hang with its pipes closed): on
    // its exit descriptor, or looking every few milliseconds where there is none.
    let mut pause = std::time::Duration::from_micros(100);
    loop {
        match has_exited() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => return give_up(&mut child, Collected::Failed(e)),
        }
        let left = deadline.remaining();
        if left.is_zero() {
            return give_up(&mut child, Collected::TimedOut);
        }
        match &exited_fd {
            Some(fd) => {
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX));
            }
            None => {
                std::thread::sleep(pause.min(left));
                pause = (pause * 2).min(std::time::Duration::from_millis(10));
            }
        }
    }
    kill_group(&child);
    let status = child.wait().map_err(Collected::Failed)?;
    Ok(std::process::Output { status, stdout, stderr })
}

/// One of a child's output pipes.
enum ChildOutput {
    Out(std::process::ChildStdout),
    Err(std::process::ChildStderr),
}

impl std::os::fd::AsFd for ChildOutput {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            ChildOutput::Out(p) => p.as_fd(),
            ChildOutput::Err(p) => p.as_fd(),
        }
    }
}

/// The delegate's own CNI error from stdout, else from stderr (libcni `pluginErr`), else ours.
fn delegate_error(plugin_type: &str, out: &std::process::Output) -> Error {
    for stream in [&out.stdout, &out.stderr] {
        if let Ok(Value::Object(doc)) = serde_json::from_slice::<Value>(stream)
            && doc.get("code").is_some_and(Value::is_u64)
            && let Ok(e) = serde_json::from_value::<Error>(Value::Object(doc))
        {
            return e;
        }
    }
    let how = match out.status.code() {
        Some(c) => format!("exit status {c}"),
        None => {
            use std::os::unix::process::ExitStatusExt;
            format!("killed by signal {}", out.status.signal().unwrap_or(0))
        }
    };
    let said = if out.stderr.is_empty() { &out.stdout } else { &out.stderr };
    let mut err =
        Error::new(code::DELEGATE_FAILED, format!("plugin {plugin_type:?} failed ({how}) without a CNI error"));
    if !said.is_empty() {
        err = err.with_details(excerpt(said));
    }
    err
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    match text.char_indices().nth(OUTPUT_EXCERPT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_types_that_are_paths_are_refused() {
        for bad in ["", ".", "..", "../bin/sh", "/bin/sh", "a/b"] {
            assert_eq!(
                find_plugin(bad, &[PathBuf::from("/usr/lib/cni")]).unwrap_err().code,
                code::INVALID_NETWORK_CONFIG
            );
        }
    }

    #[test]
    fn missing_plugin_error_names_plugin_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let e = find_plugin("nope", &[dir.path().to_path_buf(), "/x".into()]).unwrap_err();
        assert_eq!(e.code, code::DELEGATE_NOT_FOUND);
        assert_eq!(e.msg, format!("failed to find plugin \"nope\" in path [{} /x]", dir.path().display()));
    }

    /// `name` in a new directory: an executable that says it is a plexus binary of `role`.
    fn binary_of(role: crate::role::Role, name: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join(name);
        std::fs::write(&f, crate::role::elf_with_note(role)).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    fn env_in(dir: &Path, command: Command) -> CniEnv {
        CniEnv {
            command,
            container_id: "c1".into(),
            netns: None,
            ifname: "net1".into(),
            args: Default::default(),
            path: vec![dir.to_path_buf()],
            netns_override: false,
            vars: Vec::new(),
            deadline: plexus_cni::Deadline::after(std::time::Duration::from_secs(10)),
        }
    }

    #[test]
    fn a_binary_whose_note_says_it_is_not_a_delegate_is_never_run_under_any_name() {
        use crate::role::Role;
        let conf = serde_json::json!({"cniVersion": "1.0.0", "name": "n", "type": "innocent"});
        for (role, says) in [(Role::Meta, "is a meta-plugin"), (Role::Tool, "is not a CNI plugin")] {
            let dir = binary_of(role, "innocent");
            let e = resolve("innocent", &[dir.path().to_path_buf()]).unwrap_err();
            assert_eq!(e.code, code::INVALID_NETWORK_CONFIG);
            assert!(e.msg.contains(says), "{}", e.msg);
            // Were it run, its exec would fail ("exec format error"): the refusal comes first.
            let e = Runner::default().exec("innocent", Command::Add, &env_in(dir.path(), Command::Add), &conf);
            assert!(e.unwrap_err().msg.contains(says));
            // Nothing of it exists, so its DEL and GC succeed with nothing run.
            for command in [Command::Del, Command::Gc] {
                let out = Runner::default().exec("innocent", command, &env_in(dir.path(), command), &conf);
                assert!(out.unwrap().is_none(), "{command}");
            }
            assert!(
                Runner::default().exec("innocent", Command::Check, &env_in(dir.path(), Command::Check), &conf).is_err()
            );
        }
        let delegate = binary_of(Role::Delegate, "fine");
        assert_eq!(resolve("fine", &[delegate.path().to_path_buf()]).unwrap(), delegate.path().join("fine"));
        for name in ["plexus", "multus", "multus-shim", "plexus-daemon", "plexusctl"] {
            assert_eq!(
                resolve(name, &[]).unwrap_err().code,
                code::INVALID_NETWORK_CONFIG,
                "{name}, even not installed"
            );
        }
    }

    /// A carried plugin whose ADD delegates to `innocent` (as plexus-macvlan delegates to its
    /// IPAM), run in-process by a long-running parent's runner.
    struct Delegating;

    impl crate::Plugin for Delegating {
        fn add(&self, req: &crate::Request) -> Result<CniResult, Error> {
            let conf = serde_json::json!({"cniVersion": "1.0.0", "name": "n", "type": "innocent"});
            req.runner.exec("innocent", Command::Add, &req.env, &conf)?;
            Err(Error::internal("the delegate ran"))
        }
        fn del(&self, _: &crate::Request) -> Result<(), Error> {
            Ok(())
        }
        fn check(&self, _: &crate::Request) -> Result<(), Error> {
            Ok(())
        }
    }

    #[test]
    fn a_delegate_run_in_process_never_runs_the_meta_plugin_either() {
        static CARRIED: [crate::builtin::Builtin; 1] = [crate::builtin::Builtin {
            about: crate::About { name: "delegating", version: "0", build: Some("test") },
            plugin: &Delegating,
        }];
        let dir = binary_of(crate::role::Role::Meta, "innocent");
        let vars: std::collections::HashMap<String, Option<String>> = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "net1"),
            ("CNI_NETNS", "/run/netns/plexus-test-none"),
            ("CNI_PATH", dir.path().to_str().unwrap()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), Some(v.to_string())))
        .collect();
        let stdin = br#"{"cniVersion": "1.0.0", "name": "n", "type": "delegating"}"#;
        let out = crate::builtin::run(&CARRIED[0], &Runner::parent(&CARRIED), &vars, stdin);
        let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(said["code"], 7, "{said}");
        assert!(said["msg"].as_str().unwrap().contains("\"innocent\" is a meta-plugin"), "{said}");
    }

    #[test]
    fn a_delegate_runs_under_its_requests_policy_and_sysfs_root_never_what_the_process_inherited_a_runtimes_plugin_does()
     {
        use plexus_node::paths::{POLICY_ENV, SYSFS_ROOT_ENV};
        let dir = tempfile::tempdir().unwrap();
        // A request naming neither (plexus-daemon serving a runtime whose environment has none,
        // the daemon's own environment naming its policy): its delegates are told to name none,
        // so an exec'd delegate does not inherit them and an in-process one does not fall back
        // to the process's variables.
        let vars = child_env(Command::Add, &env_in(dir.path(), Command::Add), true).unwrap();
        assert_eq!((vars.get(POLICY_ENV), vars.get(SYSFS_ROOT_ENV)), (Some(&None), Some(&None)));
        // A request naming them: its delegates get exactly those.
        let mut env = env_in(dir.path(), Command::Add);
        env.vars = vec![(POLICY_ENV.into(), "/etc/p.json".into()), (SYSFS_ROOT_ENV.into(), "/fake/sys".into())];
        let vars = child_env(Command::Add, &env, true).unwrap();
        assert_eq!(vars[POLICY_ENV].as_deref(), Some("/etc/p.json"));
        assert_eq!(vars[SYSFS_ROOT_ENV].as_deref(), Some("/fake/sys"));
        // A runtime (plexusctl, as cnitool) runs its plugins in its own environment: the admin's
        // PLEXUS_POLICY reaches them.
        let vars = child_env(Command::Add, &env_in(dir.path(), Command::Add), false).unwrap();
        assert_eq!((vars.get(POLICY_ENV), vars.get(SYSFS_ROOT_ENV)), (None, None));
    }

    #[test]
    fn a_file_without_exec_bit_is_not_a_plugin() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p"), "#!/bin/sh\n").unwrap();
        assert!(find_plugin("p", &[dir.path().to_path_buf()]).is_err());
        std::fs::set_permissions(dir.path().join("p"), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find_plugin("p", &[dir.path().to_path_buf()]).unwrap(), dir.path().join("p"));
    }
}
