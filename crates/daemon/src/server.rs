//! The unix-socket server: the protocol of `plexus::wire`, peers that are root only, at most
//! `max_concurrent` requests running and `max_queued` more waiting, every request run by the
//! meta-plugin's own entry point on a thread of its own (as the `plexus` binary would run it).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use plexus::wire;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Notify, Semaphore};

use plexus_plugin::builtin::Runner;

use crate::metrics::Metrics;
use crate::spans::Spans;

/// How long a peer has to send its request, and later its go-ahead.
const PEER_DEADLINE: Duration = Duration::from_secs(5);

pub struct Daemon {
    pub meta: plexus::Meta,
    /// How the requests' delegates run: each dies with its request's thread; the plugins the
    /// daemon carries run in-process.
    pub runner: Runner,
    pub metrics: Arc<Metrics>,
    /// Each request's span, when the daemon exports spans.
    pub spans: Option<Arc<Spans>>,
    pub max_concurrent: usize,
    pub max_queued: usize,
    running: Arc<Semaphore>,
    /// Requests taken and not yet answered (running or queued).
    pending: AtomicUsize,
    idle: Notify,
    pub stopping: AtomicBool,
    /// The requests running, for the watchdog ([`watch`]).
    running_slots: std::sync::Mutex<Vec<Arc<Slot>>>,
    /// The daemon's view of the node, which a request gets when its own environment does not
    /// name one (`--sysfs-root`): the sysfs root its delegates read through.
    pub sysfs_root: std::path::PathBuf,
}

impl Daemon {
    pub fn new(
        meta: plexus::Meta,
        runner: Runner,
        metrics: Arc<Metrics>,
        spans: Option<Arc<Spans>>,
        max_concurrent: usize,
        max_queued: usize,
    ) -> Daemon {
        Daemon {
            meta,
            runner,
            metrics,
            spans,
            max_concurrent,
            max_queued,
            running: Arc::new(Semaphore::new(max_concurrent)),
            pending: AtomicUsize::new(0),
            idle: Notify::new(),
            stopping: AtomicBool::new(false),
            running_slots: std::sync::Mutex::new(Vec::new()),
            sysfs_root: plexus_node::paths::SYSFS_ROOT.into(),
        }
    }

    /// Wait until no request is pending, at most `grace`; how many were left.
    pub async fn drain(&self, grace: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let idle = self.idle.notified();
            let left = self.pending.load(Ordering::SeqCst);
            if left == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.pending.load(Ordering::SeqCst);
            }
        }
    }
}

/// One pending request: counted from the moment it is taken until it is answered.
struct Pending(Arc<Daemon>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.metrics.in_flight(-1);
        if self.0.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Bind `path` as the daemon's socket: its directory root-only (0700), a stale socket of an
/// earlier daemon replaced (never a file of another kind, never through a symlink), the
/// socket itself 0600.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    anyhow::ensure!(meta.is_dir(), "{}: not a directory", dir.display());
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => anyhow::bail!("{}: exists and is not a socket: refusing to replace it", path.display()),
        Err(_) => {}
    }
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let listener = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = listener?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serve until `stop` resolves; then the socket goes (new shims run thin at once) and the
/// requests taken are finished, at most `grace`. Returns when `stop` resolved.
pub async fn serve(
    listener: UnixListener,
    path: PathBuf,
    daemon: Arc<Daemon>,
    stop: impl Future<Output = ()>,
    grace: Duration,
) -> tokio::time::Instant {
    tokio::pin!(stop);
    let watchdog = tokio::spawn(watch(daemon.clone()));
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let d = daemon.clone();
                    tokio::spawn(async move { connection(d, stream).await });
                }
                Err(e) => {
                    tracing::error!("accept on {}: {e}", path.display());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    let stopped = tokio::time::Instant::now();
    daemon.stopping.store(true, Ordering::SeqCst);
    drop(listener);
    let _ = std::fs::remove_file(&path);
    tracing::info!(
        pending = daemon.pending.load(Ordering::SeqCst),
        "stopping: socket removed, finishing requests taken"
    );
    match daemon.drain(grace).await {
        0 => tracing::info!("every request answered"),
        left => tracing::error!(left, "grace period over with requests still running"),
    }
    watchdog.abort();
    stopped
}

/// How often the watchdog looks for requests past their deadline.
const WATCH_EVERY: Duration = Duration::from_millis(200);

/// The watchdog: every [`WATCH_EVERY`], each request still running [`wire::OVERRUN_GRACE`] past
/// its deadline is answered and gives its slot back ([`Slot::overrun`]). One task for every
/// request: a request only enters a list and leaves it (no task, timer or wake-up of its own on
/// its way).
async fn watch(daemon: Arc<Daemon>) {
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let overrun: Vec<Arc<Slot>> = {
            let mut running = daemon.running_slots.lock().unwrap_or_else(|p| p.into_inner());
            let (due, rest): (Vec<_>, Vec<_>) = running.drain(..).partition(|s| s.due <= now);
            *running = rest;
            due
        };
        for slot in overrun {
            slot.overrun(&daemon);
        }
    }
}

async fn not_taken(stream: &mut UnixStream, why: &str) {
    tracing::warn!("request not taken: {why}");
    let _ = stream.write_all(&[wire::NOT_TAKEN]).await;
    let _ = stream.write_all(why.as_bytes()).await;
    let _ = stream.shutdown().await;
}

async fn connection(daemon: Arc<Daemon>, stream: UnixStream) {
    match stream.peer_cred() {
        Ok(c) if c.uid() == 0 => {}
        Ok(c) => {
            tracing::warn!(uid = c.uid(), pid = ?c.pid(), "refused a connection from a peer that is not root");
            return;
        }
        Err(e) => {
            tracing::warn!("refused a connection without peer credentials: {e}");
            return;
        }
    }
    let mut stream = BufReader::new(stream);
    let mut line = Vec::new();
    let mut limited = (&mut stream).take(wire::REQUEST_MAX_BYTES as u64 + 1);
    let read = tokio::time::timeout(PEER_DEADLINE, limited.read_until(b'\n', &mut line)).await;
    match read {
        Ok(Ok(_)) if line.len() > wire::REQUEST_MAX_BYTES => {
            return not_taken(stream.get_mut(), "request larger than the protocol allows").await;
        }
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return tracing::warn!("reading a request: {e}"),
        Err(_) => return tracing::warn!("a peer sent no request within {PEER_DEADLINE:?}"),
    }
    let request: wire::Request = match serde_json::from_slice(&line) {
        Ok(r) => r,
        Err(e) => return not_taken(stream.get_mut(), &format!("unreadable request: {e}")).await,
    };
    if request.version != wire::VERSION {
        let why = format!("protocol version {} (this daemon speaks {})", request.version, wire::VERSION);
        return not_taken(stream.get_mut(), &why).await;
    }
    if daemon.stopping.load(Ordering::SeqCst) {
        return not_taken(stream.get_mut(), "the daemon is stopping").await;
    }
    let limit = daemon.max_concurrent + daemon.max_queued;
    if daemon.pending.fetch_add(1, Ordering::SeqCst) >= limit {
        daemon.pending.fetch_sub(1, Ordering::SeqCst);
        daemon.metrics.refused();
        let why = format!("busy: {limit} requests running or queued (--max-concurrent + --max-queued)");
        return not_taken(stream.get_mut(), &why).await;
    }
    daemon.metrics.in_flight(1);
    let pending = Pending(daemon.clone());
    // Taken; run only once the shim says it waits for the answer (a shim past its deadline runs
    // the request itself and sends nothing).
    let mut go = [0u8; 1];
    let agreed = async {
        stream.get_mut().write_all(&[wire::TAKEN]).await?;
        stream.read_exact(&mut go).await
    };
    match tokio::time::timeout(PEER_DEADLINE, agreed).await {
        Ok(Ok(_)) if go[0] == wire::GO => {}
        _ => return tracing::warn!("the shim did not confirm the request: not run"),
    }
    let command = request.env.get("CNI_COMMAND").cloned().unwrap_or_default();
    // The request's deadline, fixed now and handed to the request in its environment: whatever
    // it does, its slot is given back and the shim answered by then (and a moment).
    let mut request = request;
    let deadline = wire::deadline(&daemon.runner, |k| request.env.get(k).cloned());
    request.env.insert(plexus_cni::deadline::DEADLINE_ENV.into(), deadline.to_env());
    request
        .env
        .entry(plexus_node::paths::SYSFS_ROOT_ENV.into())
        .or_insert_with(|| daemon.sysfs_root.display().to_string());
    let Ok(permit) = daemon.running.clone().acquire_owned().await else { return };
    let started = Instant::now();
    let slot = Arc::new(Slot {
        held: std::sync::Mutex::new(Some((permit, pending))),
        due: deadline.instant() + wire::OVERRUN_GRACE,
        deadline,
        started,
        command: command.clone(),
        socket: stream.get_ref().as_raw_fd(),
    });
    daemon.running_slots.lock().unwrap_or_else(|p| p.into_inner()).push(slot.clone());
    // On this worker's thread, which hands its other tasks to another thread meanwhile: the
    // request runs where its connection was read, with no hand-over to a thread of the blocking
    // pool and back (each a wake-up on the way of every request). Exec'd delegates die with the
    // thread that started them, and this thread only ends once idle, every delegate it started
    // waited for.
    let span = daemon.spans.as_ref().map(|s| s.request(&mut request.env));
    let response = tokio::task::block_in_place(|| run(&daemon.meta, &daemon.runner, &request));
    if let Some(span) = span {
        span.end(&response);
    }
    daemon.running_slots.lock().unwrap_or_else(|p| p.into_inner()).retain(|s| !Arc::ptr_eq(s, &slot));
    // Answered by the watchdog already (the request overran): nothing more to say.
    let Some((permit, pending)) = slot.take() else { return };
    drop(permit);
    let code = (response.exit != 0).then(|| error_code(&response.stdout));
    daemon.metrics.request(&command, started.elapsed(), code);
    let body = serde_json::to_vec(&response).expect("json");
    let stream = stream.get_mut();
    if let Err(e) = stream.write_all(&body).await {
        tracing::warn!("the shim went away before its answer: {e}");
    }
    let _ = stream.shutdown().await;
    // Pending until answered: a daemon stopping waits for this, not only for the request's end.
    drop(pending);
}

/// A running request's slot (its permit to run and its place among the pending): given back by
/// whichever comes first, the request's end or the watchdog.
struct Slot {
    held: std::sync::Mutex<Option<(tokio::sync::OwnedSemaphorePermit, Pending)>>,
    /// When the watchdog answers for it.
    due: Instant,
    deadline: plexus_cni::Deadline,
    started: Instant,
    command: String,
    /// The connection's socket: open while the slot is held (the request's end takes the slot
    /// before it lets the connection go).
    socket: std::os::fd::RawFd,
}

impl Slot {
    fn take(&self) -> Option<(tokio::sync::OwnedSemaphorePermit, Pending)> {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The request is past its deadline and still running: the shim gets code 11 on a copy of
    /// the connection, the slot goes back, and no delegate runs in-process any more — the
    /// request's thread cannot be stopped, a delegate process can.
    fn overrun(&self, daemon: &Daemon) {
        use std::io::Write;
        use std::os::fd::BorrowedFd;
        let mut guard = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let Some(held) = guard.take() else { return };
        // SAFETY: the socket is open while the slot is held, and the slot is held (this lock
        // keeps the request's end, which closes it, waiting).
        let answer = unsafe { BorrowedFd::borrow_raw(self.socket) }.try_clone_to_owned();
        drop(guard);
        daemon.metrics.overrun();
        let e = self.deadline.expired(format!("plexus-daemon: the {} still runs", self.command));
        tracing::error!(took = ?self.started.elapsed(), "{e}: answered, its slot given back");
        daemon.runner.give_up("a request of plexus-daemon overran its deadline");
        daemon.metrics.request(&self.command, self.started.elapsed(), Some(e.code));
        if let Ok(fd) = answer {
            let mut answer = std::os::unix::net::UnixStream::from(fd);
            let response = wire::Response {
                exit: 1,
                stdout: serde_json::to_string(&e.to_json(plexus_cni::SpecVersion::LATEST)).expect("json"),
            };
            let _ = answer.set_nonblocking(false);
            let _ = answer.set_write_timeout(Some(PEER_DEADLINE));
            let _ = answer.write_all(&serde_json::to_vec(&response).expect("json"));
            let _ = answer.shutdown(std::net::Shutdown::Both);
        }
        drop(held);
    }
}

/// One request, through the meta-plugin's entry point with the shim's environment and stdin, its
/// delegates run by `runner`.
pub fn run(meta: &plexus::Meta, runner: &Runner, request: &wire::Request) -> wire::Response {
    let getenv = |k: &str| request.env.get(k).cloned();
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let exit = plexus_plugin::dispatch(
        plexus::ABOUT,
        meta,
        runner,
        getenv,
        &mut request.stdin.as_bytes(),
        &mut stdout,
        &mut stderr,
    );
    wire::Response { exit, stdout: String::from_utf8_lossy(&stdout).into_owned() }
}

/// The CNI code of an error document (999 when it has none).
fn error_code(stdout: &str) -> u32 {
    serde_json::from_str::<serde_json::Value>(stdout)
        .ok()
        .and_then(|v| v.get("code").and_then(|c| c.as_u64()))
        .map(|c| c as u32)
        .unwrap_or(plexus_cni::code::INTERNAL)
}
