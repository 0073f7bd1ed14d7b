//! How a request's delegates run: the [`Runner`], and the plugins a long-running process carries
//! and runs in-process (plexus-daemon's delegates).
//!
//! A delegate's process start costs about as much as the meta-plugin's whole work (0.8 ms on a
//! 2-core machine), so plexus-daemon links plexus's own plugins and runs them on a thread of its
//! own instead of exec'ing their binaries. The rule that keeps this exactly what exec would do:
//! a delegation runs a carried plugin in-process only when the file it would exec *is* that
//! plugin of this very build. Only a file named as a carried plugin is considered, and it is
//! asked once: run with [`crate::IDENTIFY_ENV`] and no
//! `CNI_COMMAND`, a plexus plugin prints its name, its build and the device and inode of the
//! executable the kernel runs (`/proc/self/exe`), and all four must match — the carried plugin's
//! name and build, the file's device and inode. Anything else is exec'd as before: another
//! version, an admin's own plugin under the name, a file that cannot be run, and a wrapper script
//! that execs the real plugin (what answers is then another file than the one delegated to, and
//! the script's own steps must run). The answer is kept per path until the file changes (its
//! [`FileStamp`]), so an upgrade is seen at the next delegation.
//!
//! In-process, the plugin runs through the same entry point as its binary ([`plugin::dispatch`])
//! with the environment the binary would get and the config on its stdin, and answers with the
//! same bytes: the delegation reads them as it reads a child's. A panic is the plugin's CNI error
//! (code 999), as in its binary. A delegation waited for at once runs on the caller's thread; one
//! the caller works beside (an IPAM ADD started early) on a thread of its own.
//!
//! In-process work is bounded work: the plugins end every loop and wait at the request's
//! deadline, which they get in their environment as a process would. Should one ever overrun it
//! anyway, a thread cannot be killed: the caller stops waiting for it and [`Runner::give_up`]
//! makes every later delegation of that runner exec its binary, which can be.
//!
//! Which plugins run in-process is a [`Runner`]'s, which a process hands to every request it
//! dispatches ([`crate::dispatch`]): nothing here is global. A plugin binary's runner execs every
//! delegate; plexus-daemon's carries the plugins it links.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plexus_cni::error::Error;
use plexus_node::files::FileStamp;
use plexus_node::{Policy, PolicyMemo};

use crate::plugin::{self, About, IDENTIFY_ENV, Plugin};

/// A plugin carried by this process.
pub struct Builtin {
    pub about: About,
    pub plugin: &'static (dyn Plugin + Sync),
}

impl std::fmt::Debug for Builtin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builtin").field("about", &self.about).finish()
    }
}

/// How this process runs its delegates: what every request it dispatches gets
/// ([`crate::Request::runner`]) and delegates with.
///
/// [`Runner::default`] is a plugin binary's: every delegate is exec'd. [`Runner::parent`] is a
/// long-running parent's (plexus-daemon): the plugins it carries run in-process. Either way a
/// delegate dies (SIGKILL) when the thread that started it ends: a plugin killed mid-request (a
/// runtime's timeout, a crash) must not leave its delegates running on, racing the DEL the
/// runtime sends next — an IPAM ADD finishing after that DEL would hold its address for good.
/// Clones share what was learned (which binary is which plugin, whether in-process runs were
/// given up).
#[derive(Clone, Default)]
pub struct Runner {
    parent: Option<Arc<Parent>>,
    /// A CNI runtime's ([`Runner::runtime`]): it runs the admin's network configs themselves, not
    /// a network's delegates.
    runtime: bool,
}

struct Parent {
    carried: &'static [Builtin],
    /// What each binary was found to be, while its file is unchanged.
    seen: Mutex<HashMap<PathBuf, (FileStamp, Option<&'static Builtin>)>>,
    /// Set once an in-process run overran its request's deadline: from then on every delegate is
    /// exec'd (a process can be killed at its deadline, a thread cannot).
    given_up: AtomicBool,
    /// The node policies its requests named, kept while their files are unchanged.
    policies: PolicyMemo,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.parent {
            None if self.runtime => f.write_str("Runner(runtime)"),
            None => f.write_str("Runner(exec)"),
            Some(p) => {
                let names: Vec<&str> = p.carried.iter().map(|b| b.about.name).collect();
                write!(f, "Runner(parent, carrying {names:?}, given up: {})", p.given_up.load(Ordering::SeqCst))
            }
        }
    }
}

/// How long a binary has to say what it is.
const PROBE_DEADLINE: Duration = Duration::from_secs(2);

impl Runner {
    /// A long-running parent's runner: `carried` run in-process whenever a delegation finds one of
    /// them, of this build, in `CNI_PATH` (none: every delegate is exec'd). Plugins without a
    /// build are never run in-process.
    pub fn parent(carried: &'static [Builtin]) -> Runner {
        let parent = Parent {
            carried,
            seen: Mutex::default(),
            given_up: AtomicBool::new(false),
            policies: PolicyMemo::default(),
        };
        Runner { parent: Some(Arc::new(parent)), runtime: false }
    }

    /// A CNI runtime's runner (plexusctl's, as cnitool's libcni): it runs the network configs the
    /// admin installed, whatever their plugins are — the meta-plugin among them, as the kubelet's
    /// runtime does — so neither the rule that only delegates are delegates nor the delegation's
    /// mark applies to what it runs. Every plugin it runs delegates with a runner of its own.
    pub fn runtime() -> Runner {
        Runner { parent: None, runtime: true }
    }

    /// Whether this is a CNI runtime's runner ([`Runner::runtime`]).
    pub fn is_runtime(&self) -> bool {
        self.runtime
    }

    /// Stop running delegates in-process, for the rest of this runner's life: `why` an
    /// in-process run could not be stopped (it overran its deadline). Its thread is left to end
    /// by itself.
    pub fn give_up(&self, why: &str) {
        if let Some(p) = &self.parent
            && !p.given_up.swap(true, Ordering::SeqCst)
            && !p.carried.is_empty()
        {
            tracing::error!("{why}: every delegate is exec'd from now on (a process can be killed at its deadline)");
        }
    }

    /// The node policy of a request with the environment `getenv` ([`Policy::load`]): a parent's
    /// runner reads each file again only when it changed.
    pub fn policy(&self, getenv: impl Fn(&str) -> Option<String>) -> Result<Policy, Error> {
        match &self.parent {
            Some(p) => p.policies.load(getenv),
            None => Policy::load(getenv),
        }
    }

    /// Whether in-process runs were given up ([`Runner::give_up`]).
    pub fn given_up(&self) -> bool {
        self.parent.as_ref().is_some_and(|p| p.given_up.load(Ordering::SeqCst))
    }

    /// The carried plugin `binary` is, when it is one of this build; `None` when nothing is
    /// carried, in-process runs were given up, or the binary is anything else.
    pub(crate) fn lookup(&self, binary: &Path) -> Option<&'static Builtin> {
        let parent = self.parent.as_ref().filter(|p| !p.carried.is_empty())?;
        if self.given_up() {
            return None;
        }
        // Only a file named as a carried plugin is asked: any other plugin is exec'd unasked.
        let name = binary.file_name()?.to_str()?;
        if !parent.carried.iter().any(|b| b.about.name == name) {
            return None;
        }
        let seen = || parent.seen.lock().unwrap_or_else(|p| p.into_inner());
        let id = FileStamp::of_path(binary)?;
        if let Some((known, builtin)) = seen().get(binary).copied()
            && known == id
        {
            return builtin;
        }
        let builtin = identify(binary, id, parent.carried);
        // Kept only if the file did not change while it was asked.
        if FileStamp::of_path(binary) == Some(id) {
            seen().insert(binary.to_path_buf(), (id, builtin));
        }
        match builtin {
            Some(b) => tracing::info!(binary = %binary.display(), plugin = b.about.name, "runs in-process: this build"),
            None => tracing::info!(binary = %binary.display(), "exec'd: not a plugin of this build"),
        }
        builtin
    }
}

/// Ask the file `id` is (at `binary`) what it is, and match the answer to the carried plugins.
fn identify(binary: &Path, id: FileStamp, carried: &'static [Builtin]) -> Option<&'static Builtin> {
    let said = identity_of(binary)?;
    let mut words = said.split_whitespace();
    let (name, build, dev, ino) = (words.next()?, words.next()?, words.next()?, words.next()?);
    if words.next().is_some() || (dev.parse().ok(), ino.parse().ok()) != (Some(id.dev), Some(id.ino)) {
        return None;
    }
    carried.iter().find(|b| b.about.name == name && b.about.build == Some(build))
}

/// What `binary` prints on stdout when run with only [`IDENTIFY_ENV`] in its environment, if it
/// exits 0 in time.
fn identity_of(binary: &Path) -> Option<String> {
    let mut child = Process::new(binary)
        .env_clear()
        .env(IDENTIFY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < PROBE_DEADLINE => std::thread::sleep(Duration::from_millis(1)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!(binary = %binary.display(), "did not say what it is within {PROBE_DEADLINE:?}");
                return None;
            }
        }
    };
    // What it printed is in the pipe now; a process it left behind holding the pipe open must
    // not keep this reading: what is there is read, nothing is waited for.
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    use std::io::Read;
    let out = child.stdout.take()?;
    fcntl(&out, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).ok()?;
    let mut said = Vec::new();
    match out.take(4096).read_to_end(&mut said) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Err(_) => return None,
    }
    status.success().then(|| String::from_utf8(said).ok()).flatten()
}

/// Run `builtin` for one delegation on this thread: `env` is what the environment of its binary
/// would change (a name mapped to `None` is unset), `stdin` its config. The exit status, stdout
/// and stderr come back as the child's would.
pub(crate) fn run(
    builtin: &Builtin,
    runner: &Runner,
    env: &HashMap<String, Option<String>>,
    stdin: &[u8],
) -> std::process::Output {
    use std::os::unix::process::ExitStatusExt;
    let getenv = |k: &str| match env.get(k) {
        Some(v) => v.clone(),
        None => std::env::var(k).ok(),
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    // dispatch answers a panic of the plugin's verbs itself; one in its own preparation must not
    // reach the caller either.
    let exit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        plugin::dispatch(builtin.about, builtin.plugin, runner, getenv, &mut &stdin[..], &mut stdout, &mut stderr)
    }))
    .unwrap_or_else(|_| {
        let e = plexus_cni::Error::internal(format!("plugin {} panicked", builtin.about.name));
        stdout.clear();
        let _ = plexus_cni::result::write_json(&e.to_json(plexus_cni::SpecVersion::LATEST), &mut stdout);
        1
    });
    std::process::Output { status: std::process::ExitStatus::from_raw(i32::from(exit) << 8), stdout, stderr }
}

/// [`run`] on a thread of its own, while the caller goes on; its output arrives on the channel
/// (which the caller may stop waiting on at its deadline).
pub(crate) fn start(
    builtin: &'static Builtin,
    runner: Runner,
    env: HashMap<String, Option<String>>,
    stdin: Vec<u8>,
) -> std::io::Result<std::sync::mpsc::Receiver<std::process::Output>> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new().name(builtin.about.name.into()).spawn(move || {
        let _ = tx.send(run(builtin, &runner, &env, &stdin));
    })?;
    Ok(rx)
}
