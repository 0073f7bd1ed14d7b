//! The deadline of one request: the moment every plexus binary working on it gives up.
//!
//! A tenant's configuration drives loops (ranges, candidates, retries) and waits (locks shared by
//! the node's requests, delegates, the API). Each of them ends at the request's deadline with
//! code 11, so no request holds a lock, a spool turn or a daemon slot past it. The deadline is
//! set once, where a request enters plexus: the node policy's `limits.requestTimeoutSeconds`
//! from the moment the runtime started the first plexus binary. A plexus binary that runs
//! another hands the deadline on in [`DEADLINE_ENV`] (a wall-clock time: processes do not share
//! a monotonic clock), keeping back time for its own undo ([`Deadline::keeping_for_undo`]); a
//! deadline from the environment is never later than this binary's own limit would be.
//!
//! Who may set [`DEADLINE_ENV`]: whoever execs the binary (the runtime, plexus itself); it can
//! only make a request end sooner. Never a config, an annotation or `CNI_ARGS`.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::Error;

/// The environment variable carrying the deadline: milliseconds since the Unix epoch.
pub const DEADLINE_ENV: &str = "PLEXUS_DEADLINE";

/// The most a request keeps back for undoing its own steps when it hands its deadline on.
const UNDO_RESERVE_MAX: Duration = Duration::from_secs(15);

/// When a request gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(Instant);

fn epoch_ms(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

impl From<Instant> for Deadline {
    fn from(at: Instant) -> Deadline {
        Deadline(at)
    }
}

impl Deadline {
    /// `d` from now.
    pub fn after(d: Duration) -> Deadline {
        Deadline(Instant::now() + d)
    }

    /// The deadline the environment hands this binary ([`DEADLINE_ENV`]), but never later than
    /// `most` from now; `most` from now when there is none (or it does not parse).
    pub fn from_env(getenv: impl Fn(&str) -> Option<String>, most: Duration) -> Deadline {
        let own = Deadline::after(most);
        let Some(ms) = getenv(DEADLINE_ENV).and_then(|v| v.trim().parse::<u128>().ok()) else { return own };
        let now = SystemTime::now();
        let left = ms.saturating_sub(epoch_ms(now));
        let left = Duration::from_millis(u64::try_from(left).unwrap_or(u64::MAX));
        // The answer must reach the caller by its deadline: the work stops a moment before.
        own.min(Deadline::after(left).a_moment_before())
    }

    pub fn instant(&self) -> Instant {
        self.0
    }

    /// What is left (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    pub fn passed(&self) -> bool {
        Instant::now() >= self.0
    }

    /// The earlier of this deadline and `d` from now (an inner bound, such as one API call's).
    pub fn within(&self, d: Duration) -> Deadline {
        (*self).min(Deadline::after(d))
    }

    /// The deadline for work whose undo must still fit before this one: a quarter of what is
    /// left, at most 15 s, is kept back (a delegate that runs out of time is rolled back in it).
    pub fn keeping_for_undo(&self) -> Deadline {
        let left = self.remaining();
        Deadline(self.0 - (left / 4).min(UNDO_RESERVE_MAX))
    }

    /// A moment before this deadline — a twentieth of what is left, from 20 ms to 500 ms. A
    /// delegate is given (and killed at) a moment before its caller's deadline, and works until a
    /// moment before the one it was given: one that runs out of time still answers, and its
    /// caller still has time to say so (and what it was doing) before its own deadline.
    pub fn a_moment_before(&self) -> Deadline {
        let left = self.remaining();
        Deadline(self.0 - (left / 20).clamp(CHILD_MARGIN_MIN, CHILD_MARGIN_MAX).min(left))
    }

    /// As [`DEADLINE_ENV`] carries it.
    pub fn to_env(&self) -> String {
        let at = SystemTime::now() + self.remaining();
        epoch_ms(at).to_string()
    }

    /// Code 11 once the deadline passed: `what` was still to do.
    pub fn check(&self, what: impl std::fmt::Display) -> Result<(), Error> {
        if self.passed() { Err(self.expired(what)) } else { Ok(()) }
    }

    /// The error of a request out of time while `what`.
    pub fn expired(&self, what: impl std::fmt::Display) -> Error {
        Error::try_again_later(format!("{what}: the request's deadline passed"))
            .with_details("the node policy's limits.requestTimeoutSeconds bounds every request")
    }
}

/// Take an exclusive `flock` on `file`, waiting at most until `deadline`: `Ok(false)` when it is
/// still held by another then. A lock shared by the node's requests is never waited for past a
/// request's deadline, whatever its holder does.
pub fn lock_until(file: &std::fs::File, deadline: Deadline) -> std::io::Result<bool> {
    wait_for(|| file.try_lock(), deadline)
}

/// [`lock_until`] for a shared `flock`.
pub fn lock_shared_until(file: &std::fs::File, deadline: Deadline) -> std::io::Result<bool> {
    wait_for(|| file.try_lock_shared(), deadline)
}

/// `try_lock` again and again, the pauses doubling up to 10 ms, until it takes or `deadline`.
fn wait_for(try_lock: impl Fn() -> Result<(), std::fs::TryLockError>, deadline: Deadline) -> std::io::Result<bool> {
    let mut pause = Duration::from_micros(200);
    loop {
        match try_lock() {
            Ok(()) => return Ok(true),
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        let left = deadline.remaining();
        if left.is_zero() {
            return Ok(false);
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// The least and most [`Deadline::a_moment_before`] comes before.
const CHILD_MARGIN_MIN: Duration = Duration::from_millis(20);
const CHILD_MARGIN_MAX: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delegate_runs_out_of_time_a_moment_before_its_caller() {
        let d = Deadline::after(Duration::from_secs(11));
        let child = d.a_moment_before();
        let margin = d.instant() - child.instant();
        assert_eq!(margin, Duration::from_millis(500), "a twentieth, at most 500 ms");
        let short = Deadline::after(Duration::from_millis(100));
        assert_eq!(short.instant() - short.a_moment_before().instant(), Duration::from_millis(20));
        let passed = Deadline::after(Duration::ZERO);
        assert!(passed.a_moment_before().passed());
    }

    #[test]
    fn a_deadline_from_the_environment_only_ever_comes_sooner() {
        let most = Duration::from_secs(100);
        let env = |v: String| move |k: &str| (k == DEADLINE_ENV).then(|| v.clone());
        let soon = epoch_ms(SystemTime::now() + Duration::from_secs(5)).to_string();
        let d = Deadline::from_env(env(soon), most);
        assert!(d.remaining() <= Duration::from_secs(5) && d.remaining() > Duration::from_secs(3));
        let late = epoch_ms(SystemTime::now() + Duration::from_secs(10_000)).to_string();
        assert!(Deadline::from_env(env(late), most).remaining() <= most);
        assert!(Deadline::from_env(env("garbage".into()), most).remaining() > Duration::from_secs(99));
        assert!(Deadline::from_env(env("0".into()), most).passed(), "a deadline in the past has passed");
    }

    #[test]
    fn handed_on_a_deadline_keeps_time_back_for_undo_and_survives_the_environment() {
        let d = Deadline::after(Duration::from_secs(100));
        let work = d.keeping_for_undo();
        assert!(d.remaining() - work.remaining() >= Duration::from_secs(14), "at most 15 s kept back");
        let short = Deadline::after(Duration::from_secs(8)).keeping_for_undo();
        assert!(short.remaining() <= Duration::from_secs(6), "a quarter of what is left");
        // Through the environment it arrives whole (to the millisecond), and the receiver works
        // until a moment before it (500 ms of 85 s), so that its answer arrives in time.
        let again = Deadline::from_env(|_| Some(work.to_env()), Duration::from_secs(1000));
        let before = work.instant().saturating_duration_since(again.instant());
        assert!(before > Duration::from_millis(480) && before < Duration::from_millis(520), "{before:?}");
    }

    #[test]
    fn a_lock_held_elsewhere_is_given_up_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let holder = std::fs::File::create(&path).unwrap();
        holder.lock().unwrap();
        let waiter = std::fs::File::open(&path).unwrap();
        let started = Instant::now();
        assert!(!lock_until(&waiter, Deadline::after(Duration::from_millis(150))).unwrap());
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(150) && took < Duration::from_secs(1), "{took:?}");
        drop(holder);
        assert!(lock_until(&waiter, Deadline::after(Duration::from_millis(150))).unwrap());
        let e = Deadline::after(Duration::ZERO).check("waiting for the store's lock").unwrap_err();
        assert_eq!(e.code, crate::code::TRY_AGAIN_LATER);
        assert!(e.msg.starts_with("waiting for the store's lock: "), "{e}");
    }
}
