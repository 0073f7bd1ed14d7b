//! The `plexus` binary's front: in daemon mode, send the invocation to `plexus-daemon` and hand
//! its answer back, or run the request here, in thin mode, when the daemon does not answer
//! (Multus's shim fails instead). Forwarding is the shim's alone: the meta-plugin ([`crate::Meta`])
//! runs whatever reaches it, here or in the daemon, the same way.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use plexus_cni::{CniResult, Command, Error};
use plexus_plugin::builtin::Runner;
use plexus_plugin::{Plugin, Request};

use crate::{Meta, wire};

/// How long the daemon has to take a request (connect, send, its one-byte answer). Past it the
/// shim runs the request itself.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(1);

/// How a forwarded request ended.
#[derive(Clone, Debug)]
pub enum Forwarded {
    /// The daemon ran it: what to print and exit with.
    Answered(wire::Response),
    /// The daemon did not take it (why): run it here.
    RunHere(String),
    /// The daemon took it and went away before answering (why): it may have done part of it.
    Lost(String),
}

/// The `plexus` binary. In daemon mode the request goes to the daemon before anything else is
/// read or checked — the daemon runs the very same entry point on the same environment and stdin,
/// so what it prints is printed as it is. Anything short of an answer (no `daemonSocket`, no
/// daemon, not taken in time, lost mid-request) goes through the entry point here, the meta-plugin
/// wrapped in `NotAnswered` when the daemon was tried, so that why is logged in the request's
/// log and a lost ADD fails; the request is never sent twice.
pub fn run() -> std::process::ExitCode {
    use std::process::ExitCode;
    let mut stdin = Vec::new();
    let read = std::io::stdin()
        .lock()
        .take(plexus_plugin::STDIN_MAX_BYTES as u64 + 1)
        .read_to_end(&mut stdin)
        .map_err(|e| e.to_string());
    let thin = Meta::thin();
    let not_answered;
    let plugin: &dyn Plugin = match read.as_ref().ok().and_then(|_| daemon_socket_of(&stdin)) {
        Some(socket) => match forward(&socket, &stdin) {
            Forwarded::Answered(r) => {
                let mut out = std::io::stdout().lock();
                return match out.write_all(r.stdout.as_bytes()).and_then(|()| out.flush()) {
                    Ok(()) => ExitCode::from(r.exit),
                    Err(_) => ExitCode::from(1),
                };
            }
            Forwarded::RunHere(why) => {
                not_answered = NotAnswered { meta: Meta::thin(), why, lost: false };
                &not_answered
            }
            Forwarded::Lost(why) => {
                not_answered = NotAnswered { meta: Meta::thin(), why, lost: true };
                &not_answered
            }
        },
        None => &thin,
    };
    // An unreadable stdin is reported by the entry point, as when it reads stdin itself.
    let mut input: Box<dyn Read + '_> = match read {
        Ok(_) => Box::new(stdin.as_slice()),
        Err(e) => Box::new(FailingRead(e)),
    };
    ExitCode::from(plexus_plugin::dispatch(
        crate::ABOUT,
        plugin,
        &Runner::default(),
        |k: &str| std::env::var(k).ok(),
        &mut input,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    ))
}

/// The meta-plugin run here after the daemon was tried and did not answer (`why`): each verb logs
/// why in the request's log (the entry point has set it up) and runs here; but an ADD the daemon
/// took and lost (`lost`) fails with code 11, since the daemon may have done part of it, which
/// the runtime's DEL undoes before it tries again. Every other verb is safe to repeat.
struct NotAnswered {
    meta: Meta,
    why: String,
    lost: bool,
}

impl NotAnswered {
    fn here(&self, req: &Request) -> Result<(), Error> {
        if self.lost && req.env.command == Command::Add {
            return Err(
                Error::try_again_later(self.why.clone()).with_details("the runtime's DEL undoes what the daemon did")
            );
        }
        tracing::warn!("plexus-daemon: {}: running the {} here (thin mode)", self.why, req.env.command);
        Ok(())
    }
}

impl Plugin for NotAnswered {
    fn known_args(&self) -> &'static [&'static str] {
        self.meta.known_args()
    }

    fn admin_config(&self, req: &Request) -> bool {
        self.meta.admin_config(req)
    }

    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        self.here(req)?;
        self.meta.add(req)
    }

    fn del(&self, req: &Request) -> Result<(), Error> {
        self.here(req)?;
        self.meta.del(req)
    }

    fn check(&self, req: &Request) -> Result<(), Error> {
        self.here(req)?;
        self.meta.check(req)
    }

    fn status(&self, req: &Request) -> Result<(), Error> {
        self.here(req)?;
        self.meta.status(req)
    }

    fn gc(&self, req: &Request) -> Result<(), Error> {
        self.here(req)?;
        self.meta.gc(req)
    }
}

/// The daemon socket this invocation is to go to first: a CNI verb other than VERSION and a
/// config that names `daemonSocket` (a request a delegation made is forwarded as it is, its mark
/// with it, and refused there as here).
fn daemon_socket_of(stdin: &[u8]) -> Option<std::path::PathBuf> {
    #[derive(serde::Deserialize)]
    struct Keys {
        #[serde(rename = "daemonSocket")]
        daemon_socket: Option<std::path::PathBuf>,
    }
    let command = std::env::var("CNI_COMMAND").ok().filter(|c| !c.is_empty())?;
    if command.eq_ignore_ascii_case("VERSION") {
        return None;
    }
    if stdin.len() > plexus_plugin::STDIN_MAX_BYTES {
        return None;
    }
    serde_json::from_slice::<Keys>(stdin).ok()?.daemon_socket.filter(|s| !s.as_os_str().is_empty())
}

/// A stdin whose reading failed, for the entry point to report.
struct FailingRead(String);

impl Read for FailingRead {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        Err(std::io::Error::other(self.0.clone()))
    }
}

/// Send this invocation (`stdin` and the process's CNI environment) to the daemon at `socket`.
pub fn forward(socket: &Path, stdin: &[u8]) -> Forwarded {
    let request = wire::Request {
        version: wire::VERSION,
        env: std::env::vars().filter(|(k, _)| wire::forwarded(k)).collect(),
        stdin: String::from_utf8_lossy(stdin).into_owned(),
    };
    let at = socket.display();
    let mut stream = match connect(socket) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            return Forwarded::RunHere(format!("{at} is not accepting connections (its backlog is full)"));
        }
        Err(e) => return Forwarded::RunHere(format!("cannot connect to {at}: {e}")),
    };
    let sent = (|| {
        stream.set_write_timeout(Some(ANSWER_DEADLINE))?;
        stream.set_read_timeout(Some(ANSWER_DEADLINE))?;
        let mut line = serde_json::to_vec(&request).map_err(std::io::Error::other)?;
        line.push(b'\n');
        stream.write_all(&line)?;
        let mut answer = [0u8; 1];
        stream.read_exact(&mut answer)?;
        Ok::<u8, std::io::Error>(answer[0])
    })();
    match sent {
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            Forwarded::RunHere(format!("{at} did not take the request within {ANSWER_DEADLINE:?}"))
        }
        Err(e) => Forwarded::RunHere(format!("{at}: {e}")),
        Ok(wire::NOT_TAKEN) => {
            let mut why = String::new();
            let _ = stream.read_to_string(&mut why);
            Forwarded::RunHere(format!("{at} did not take the request: {why}"))
        }
        Ok(wire::TAKEN) => {
            if let Err(e) = stream.write_all(&[wire::GO]) {
                // Not confirmed: the daemon does not run it.
                return Forwarded::RunHere(format!("{at} took the request, then: {e}"));
            }
            // The daemon answers by the request's deadline (and a moment): a daemon that does not
            // (stopped, wedged) is given up a moment later.
            let deadline = wire::deadline(&plexus_plugin::builtin::Runner::default(), |k| std::env::var(k).ok());
            let wait = deadline.remaining() + 2 * wire::OVERRUN_GRACE;
            let mut answer = Vec::new();
            let read = stream.set_read_timeout(Some(wait)).and_then(|()| stream.read_to_end(&mut answer));
            match read.map_err(|e| e.to_string()).and_then(|_| {
                serde_json::from_slice::<wire::Response>(&answer).map_err(|e| format!("unreadable answer: {e}"))
            }) {
                Ok(response) => Forwarded::Answered(response),
                Err(why) => Forwarded::Lost(format!("{at} took the request and went away: {why}")),
            }
        }
        Ok(other) => Forwarded::RunHere(format!("{at} answered {other:#04x}, not the plexus-daemon protocol")),
    }
}

/// Connect without waiting: a daemon that has stopped accepting (its listen backlog full) makes a
/// blocking connect wait for as long as it hangs; this one fails at once with `WouldBlock`.
fn connect(socket: &Path) -> std::io::Result<UnixStream> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let fd = nix::sys::socket::socket(AddressFamily::Unix, SockType::Stream, flags, None)?;
    nix::sys::socket::connect(fd.as_raw_fd(), &UnixAddr::new(socket)?)?;
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An invocation with a daemon socket in its config and nothing else to attach.
    fn request(command: &str, dir: &Path) -> Request {
        plexus_plugin::testing::request(
            &[
                ("CNI_COMMAND", command),
                ("CNI_CONTAINERID", "c1"),
                ("CNI_NETNS", "/run/netns/plexus-none"),
                ("CNI_IFNAME", "net1"),
                ("CNI_PATH", "/nonexistent"),
            ],
            &json!({"cniVersion": "1.0.0", "name": "plexus", "type": "plexus",
                    "daemonSocket": dir.join("daemon.sock"), "cniDir": dir}),
            plexus_node::Policy::default(),
        )
    }

    fn not_answered(lost: bool) -> NotAnswered {
        NotAnswered { meta: Meta::thin(), why: "daemon.sock took the request and went away".into(), lost }
    }

    #[test]
    fn an_add_the_daemon_took_and_lost_fails_with_code_11_and_nothing_runs_here() {
        let dir = tempfile::tempdir().unwrap();
        let e = not_answered(true).add(&request("ADD", dir.path())).unwrap_err();
        assert_eq!(e.code, plexus_cni::code::TRY_AGAIN_LATER, "{e}");
        assert!(e.msg.contains("went away"), "{e}");
        assert!(e.details.contains("DEL undoes"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the meta-plugin wrote nothing");
    }

    #[test]
    fn an_add_the_daemon_did_not_take_runs_here_as_in_thin_mode() {
        let dir = tempfile::tempdir().unwrap();
        // The meta-plugin's own answer: this config selects no network.
        let e = not_answered(false).add(&request("ADD", dir.path())).unwrap_err();
        assert_eq!(e.code, plexus_cni::code::INVALID_NETWORK_CONFIG, "{e}");
        assert!(e.msg.contains("no network to attach"), "{e}");
    }

    #[test]
    fn every_other_verb_of_a_lost_request_runs_here_since_repeating_it_is_safe() {
        let dir = tempfile::tempdir().unwrap();
        not_answered(true).del(&request("DEL", dir.path())).unwrap();
        // The meta-plugin's own answer: nothing was added for this container.
        let e = not_answered(true).check(&request("CHECK", dir.path())).unwrap_err();
        assert!(e.msg.contains("no attachments recorded for container c1"), "{e}");
    }
}
