//! Plugins a long-running process carries and runs in-process (plexus-daemon's delegates).
//!
//! A delegate's process start costs about as much as the meta-plugin's whole work (0.8 ms on a
//! 2-core machine), so plexus-daemon links plexus's own plugins and runs them on a thread of its
//! own instead of exec'ing their binaries. The rule that keeps this exactly what exec would do:
//! a delegation runs a carried plugin in-process only when the file it would exec *is* that
//! plugin of this very build. Only a file named as a carried plugin is considered, and it is
//! asked once: run with [`IDENTIFY_ENV`] and no
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
//! anyway, a thread cannot be killed: the caller stops waiting for it and [`give_up`] makes every
//! later delegation exec its binary, which can be.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::files::FileStamp;
use crate::plugin::{self, About, Plugin};

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

static CARRIED: OnceLock<&'static [Builtin]> = OnceLock::new();

/// From now on, run `plugins` in-process whenever a delegation finds one of them, of this build,
/// in `CNI_PATH`. Set once, at start; plugins without a build are never run in-process.
pub fn carry(plugins: &'static [Builtin]) {
    let _ = CARRIED.set(plugins);
}

/// How long a binary has to say what it is.
const PROBE_DEADLINE: Duration = Duration::from_secs(2);

/// What each binary was found to be, while its file is unchanged.
type Seen = HashMap<PathBuf, (FileStamp, Option<&'static Builtin>)>;
static SEEN: Mutex<Option<Seen>> = Mutex::new(None);

fn seen<T>(f: impl FnOnce(&mut Seen) -> T) -> T {
    f(SEEN.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new))
}

/// Set once an in-process run overran its request's deadline: from then on every delegate is
/// exec'd (a process can be killed at its deadline, a thread cannot).
static GIVEN_UP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Stop running delegates in-process, for the rest of this process's life: `why` an in-process
/// run could not be stopped (it overran its deadline). Its thread is left to end by itself.
pub fn give_up(why: &str) {
    if !GIVEN_UP.swap(true, std::sync::atomic::Ordering::SeqCst) {
        tracing::error!("{why}: every delegate is exec'd from now on (a process can be killed at its deadline)");
    }
}

/// Whether in-process runs were given up ([`give_up`]).
pub fn given_up() -> bool {
    GIVEN_UP.load(std::sync::atomic::Ordering::SeqCst)
}

/// The carried plugin `binary` is, when it is one of this build; `None` when nothing is carried,
/// in-process runs were given up, or the binary is anything else.
pub fn lookup(binary: &Path) -> Option<&'static Builtin> {
    if given_up() {
        return None;
    }
    let carried = CARRIED.get().filter(|c| !c.is_empty())?;
    // Only a file named as a carried plugin is asked: any other plugin is exec'd unasked.
    let name = binary.file_name()?.to_str()?;
    if !carried.iter().any(|b| b.about.name == name) {
        return None;
    }
    let id = FileStamp::of_path(binary)?;
    if let Some((known, builtin)) = seen(|s| s.get(binary).copied())
        && known == id
    {
        return builtin;
    }
    let builtin = identify(binary, id, carried);
    // Kept only if the file did not change while it was asked.
    if FileStamp::of_path(binary) == Some(id) {
        seen(|s| s.insert(binary.to_path_buf(), (id, builtin)));
    }
    match builtin {
        Some(b) => tracing::info!(binary = %binary.display(), plugin = b.about.name, "runs in-process: this build"),
        None => tracing::info!(binary = %binary.display(), "exec'd: not a plugin of this build"),
    }
    builtin
}

/// Set (to anything) with no `CNI_COMMAND`: a plexus plugin prints [`identity`] on stdout and
/// exits. Who may set it: whoever execs the binary; it only makes the binary say what it is.
pub const IDENTIFY_ENV: &str = "PLEXUS_IDENTIFY";

/// What a plugin of `about` answers to [`IDENTIFY_ENV`]: `<name> <build> <device> <inode>` of the
/// executable running it; `None` for a plugin without a build or an executable that cannot be
/// read.
pub fn identity(about: &About) -> Option<String> {
    let build = about.build?;
    let exe = std::fs::metadata("/proc/self/exe").ok()?;
    Some(format!("{} {build} {} {}", about.name, exe.dev(), exe.ino()))
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
pub(crate) fn run(builtin: &Builtin, env: &HashMap<String, Option<String>>, stdin: &[u8]) -> std::process::Output {
    use std::os::unix::process::ExitStatusExt;
    let getenv = |k: &str| match env.get(k) {
        Some(v) => v.clone(),
        None => std::env::var(k).ok(),
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    // dispatch answers a panic of the plugin's verbs itself; one in its own preparation must not
    // reach the caller either.
    let exit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        plugin::dispatch(builtin.about, builtin.plugin, getenv, &mut &stdin[..], &mut stdout, &mut stderr)
    }))
    .unwrap_or_else(|_| {
        let e = crate::Error::internal(format!("plugin {} panicked", builtin.about.name));
        stdout.clear();
        let _ = crate::result::write_json(&e.to_json(crate::SpecVersion::LATEST), &mut stdout);
        1
    });
    std::process::Output { status: std::process::ExitStatus::from_raw(i32::from(exit) << 8), stdout, stderr }
}

/// [`run`] on a thread of its own, while the caller goes on; its output arrives on the channel
/// (which the caller may stop waiting on at its deadline).
pub(crate) fn start(
    builtin: &'static Builtin,
    env: HashMap<String, Option<String>>,
    stdin: Vec<u8>,
) -> std::io::Result<std::sync::mpsc::Receiver<std::process::Output>> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new().name(builtin.about.name.into()).spawn(move || {
        let _ = tx.send(run(builtin, &env, &stdin));
    })?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

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
