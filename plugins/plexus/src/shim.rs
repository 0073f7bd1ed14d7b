//! The shim's side of daemon mode: send the invocation to `plexus-daemon` and hand its answer
//! back, or say why the request is to be run here, in thin mode (Multus's shim fails instead).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::wire;

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
/// daemon, not taken in time, lost mid-request) goes the normal way, with the forwarding's outcome
/// handed on so that it is logged and acted on there and the request is never sent twice.
pub fn run() -> std::process::ExitCode {
    use std::process::ExitCode;
    let mut stdin = Vec::new();
    let read = std::io::stdin()
        .lock()
        .take(plexus_cni::plugin::STDIN_MAX_BYTES as u64 + 1)
        .read_to_end(&mut stdin)
        .map_err(|e| e.to_string());
    let meta = match read.as_ref().ok().and_then(|_| daemon_socket_of(&stdin)) {
        Some(socket) => match forward(&socket, &stdin) {
            Forwarded::Answered(r) => {
                let mut out = std::io::stdout().lock();
                return match out.write_all(r.stdout.as_bytes()).and_then(|()| out.flush()) {
                    Ok(()) => ExitCode::from(r.exit),
                    Err(_) => ExitCode::from(1),
                };
            }
            other => crate::Meta::thin_after(other),
        },
        None => crate::Meta::thin(),
    };
    // An unreadable stdin is reported by the entry point, as when it reads stdin itself.
    let mut input: Box<dyn Read + '_> = match read {
        Ok(_) => Box::new(stdin.as_slice()),
        Err(e) => Box::new(FailingRead(e)),
    };
    ExitCode::from(plexus_cni::plugin::dispatch(
        crate::ABOUT,
        &meta,
        |k: &str| std::env::var(k).ok(),
        &mut input,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    ))
}

/// The daemon socket this invocation is to go to first: a CNI verb other than VERSION, a
/// config that names `daemonSocket`, and not plexus run as a delegate of plexus (the normal path
/// refuses that without forwarding).
fn daemon_socket_of(stdin: &[u8]) -> Option<std::path::PathBuf> {
    #[derive(serde::Deserialize)]
    struct Keys {
        #[serde(rename = "daemonSocket")]
        daemon_socket: Option<std::path::PathBuf>,
    }
    let command = std::env::var("CNI_COMMAND").ok().filter(|c| !c.is_empty())?;
    if command.eq_ignore_ascii_case("VERSION") || crate::conf::running_as_delegate() {
        return None;
    }
    if stdin.len() > plexus_cni::plugin::STDIN_MAX_BYTES {
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
            let deadline = wire::deadline(|k| std::env::var(k).ok());
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
