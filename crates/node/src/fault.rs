//! Fault injection for the reliability tests. Each step that can fail on a real node — a netlink
//! request, a private file write, a delegate exec, a Kubernetes API or etcd call — passes an
//! injection point first. In debug builds (the tests') the environment can make one of them fail
//! or kill the process there; in release builds [`at`] is an empty inline function and none of
//! this exists.
//!
//! - `PLEXUS_FAULT=<binary>:<n>` — the n-th point (counted from 1, every kind together) that the
//!   process named `<binary>` passes fails with an error naming it;
//! - `PLEXUS_FAULT=<binary>:<n>:kill` — the process kills itself there with `SIGKILL`;
//! - `PLEXUS_FAULT=<binary>:<n>:spin` — the thread there spins forever, heeding no deadline (a
//!   bug that loops: what plexus-daemon must survive in an in-process delegate);
//! - `PLEXUS_FAULT_LOG=<file>` — every point passed appends `<binary> <n> <kind>` to the file, so
//!   a test knows how many points an operation has.
//!
//! Who may set them: the runtime that execs the binary (environment, never a network config, an
//! annotation or `CNI_ARGS`), and only a debug build reads them.

use std::fmt;

/// The kinds of steps that pass an injection point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    Netlink,
    FileWrite,
    Exec,
    Api,
    Etcd,
}

/// An injected failure.
#[derive(Debug)]
pub struct Injected {
    pub point: Point,
    pub n: usize,
}

impl fmt::Display for Injected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fault injected at point {} ({:?})", self.n, self.point)
    }
}

impl std::error::Error for Injected {}

impl From<Injected> for std::io::Error {
    fn from(e: Injected) -> std::io::Error {
        std::io::Error::other(e)
    }
}

/// Pass an injection point of kind `point`.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn at(_point: Point) -> Result<(), Injected> {
    Ok(())
}

/// Pass an injection point of kind `point`.
#[cfg(debug_assertions)]
pub fn at(point: Point) -> Result<(), Injected> {
    use std::io::Write;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Clone, Copy, PartialEq)]
    enum How {
        Fail,
        Kill,
        Spin,
    }
    struct Plan {
        name: String,
        fail_at: Option<(usize, How)>,
        log: Option<std::path::PathBuf>,
    }
    static PLAN: OnceLock<Plan> = OnceLock::new();
    static PASSED: AtomicUsize = AtomicUsize::new(0);

    let plan = PLAN.get_or_init(|| {
        let name = std::env::args_os()
            .next()
            .and_then(|a| std::path::Path::new(&a).file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default();
        let fail_at = std::env::var("PLEXUS_FAULT").ok().and_then(|spec| {
            let mut parts = spec.split(':');
            (parts.next()? == name).then_some(())?;
            let n = parts.next()?.parse().ok()?;
            let how = match parts.next() {
                Some("kill") => How::Kill,
                Some("spin") => How::Spin,
                _ => How::Fail,
            };
            Some((n, how))
        });
        Plan { name, fail_at, log: std::env::var_os("PLEXUS_FAULT_LOG").map(Into::into) }
    });
    if plan.fail_at.is_none() && plan.log.is_none() {
        return Ok(());
    }
    let n = PASSED.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(log) = &plan.log
        && let Ok(mut f) = std::fs::OpenOptions::new().append(true).create(true).open(log)
    {
        let _ = writeln!(f, "{} {n} {point:?}", plan.name);
    }
    match plan.fail_at {
        Some((at, how)) if at == n => {
            match how {
                How::Kill => {
                    let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
                }
                How::Spin => loop {
                    std::hint::spin_loop();
                },
                How::Fail => {}
            }
            Err(Injected { point, n })
        }
        _ => Ok(()),
    }
}

impl From<Injected> for plexus_cni::Error {
    fn from(e: Injected) -> plexus_cni::Error {
        plexus_cni::Error::io(e.to_string())
    }
}
