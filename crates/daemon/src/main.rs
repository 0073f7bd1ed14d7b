//! plexus-daemon: the node daemon of plexus's daemon mode.
//!
//! The `plexus` shim, when its config names `daemonSocket`, sends each request here; the daemon
//! runs it with the meta-plugin's own code, reading NADs and pods from watch caches instead of
//! the API, and PATCHes network-status. Health, readiness and Prometheus metrics on a local
//! port; at SIGTERM the socket goes (shims run thin meanwhile) and the requests taken finish.
//!
//! Every flag is the admin's (the DaemonSet's command line): they say where root listens,
//! connects and runs delegates.

mod claim_status;
mod cluster;
mod dra;
mod events;
mod http;
mod metrics;
mod server;
mod spans;
mod status;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use plexus_plugin::builtin::{Builtin, Runner};

#[derive(Parser, Debug)]
#[command(name = "plexus-daemon", version, about = "The plexus node daemon (daemon mode of the plexus meta-plugin)")]
struct Args {
    /// The unix socket the shim connects to (`daemonSocket` in the meta config); its directory is
    /// made root-only.
    #[arg(long, default_value = "/run/plexus/daemon.sock")]
    socket: PathBuf,
    /// Where /healthz, /readyz and /metrics are served (keep it on loopback or the node's own
    /// address: they are not authenticated).
    #[arg(long, default_value = "127.0.0.1:9134")]
    metrics_address: SocketAddr,
    /// kubeconfig of the daemon's identity; without it the in-cluster service account, and
    /// without that no API (NADs from each request's `nadDir`, as in thin mode).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The sysfs root the daemon reads the node through (its DRA driver's ports), and the one its
    /// requests' delegates read through unless a request names its own.
    #[arg(long, env = "PLEXUS_SYSFS_ROOT", default_value = plexus_node::paths::SYSFS_ROOT)]
    sysfs_root: PathBuf,
    /// This node's name: only its pods are watched.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Requests run at once.
    #[arg(long, default_value_t = 32)]
    max_concurrent: usize,
    /// Requests waiting beyond those; past it a request is not taken (the shim runs it itself).
    #[arg(long, default_value_t = 256)]
    max_queued: usize,
    /// At SIGTERM, how long requests already taken may take to finish, in seconds.
    #[arg(long, default_value_t = 30)]
    shutdown_grace: u64,
    /// Where network-status waits to be written (root-only; one file per pod): each status is
    /// journaled before the runtime gets its answer, PATCHed after it, and a daemon that starts
    /// writes what an earlier one left.
    #[arg(long, default_value = "/run/plexus/network-status")]
    status_journal: PathBuf,
    /// Deadline of each API call (pod and NAD reads the caches miss, network-status), in seconds.
    #[arg(long, default_value_t = 5.0)]
    api_timeout: f64,
    /// The host's root file system as mounted in the daemon's container: the daemon chroots
    /// there before anything else, so that it and its delegates see the node's files as the
    /// kubelet's plugins do (every other path, `--kubeconfig` included, is then the host's).
    #[arg(long)]
    host_root: Option<PathBuf>,
    /// Run plexus's own delegates (plexus-macvlan, plexus-host-device, plexus-ipam) on threads of
    /// the daemon instead of starting their binaries, when the binary found in `CNI_PATH` is that
    /// plugin of this daemon's very build (asked once per binary file; anything else is exec'd).
    /// `false`: every delegate is exec'd.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    in_process_delegates: bool,
    /// An OpenTelemetry collector (OTLP over gRPC, `http://HOST:4317`) to send spans to: one for
    /// each request, the child of the runtime's trace context, and one for each delegate call
    /// under it. Unset: no spans, and delegates get the runtime's trace context as it came.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// The daemon's own log level (requests log where their config says, as in thin mode).
    #[arg(long, default_value = "info")]
    log_level: String,
    #[command(flatten)]
    dra: dra::DraArgs,
}

/// The delegates the daemon carries: plexus's own plugins, run in-process when the binary a
/// delegation finds is the same plugin of this build.
static IN_PROCESS: [Builtin; 3] = [
    Builtin { about: plexus_macvlan::ABOUT, plugin: &plexus_macvlan::Macvlan },
    Builtin { about: plexus_host_device::ABOUT, plugin: &plexus_host_device::HostDevice },
    Builtin { about: plexus_ipam_plugin::ABOUT, plugin: &plexus_ipam_plugin::Ipam },
];

plexus_plugin::binary_role!(Tool);

fn main() -> std::process::ExitCode {
    // Exec'd as a CNI plugin (a network naming it as its "type"): never bind the node daemon's
    // socket or port on a request's behalf.
    if let Some(refused) = plexus_plugin::refuse_as_delegate("plexus-daemon") {
        return refused;
    }
    match daemon() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:?}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn daemon() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_max_level(plexus_plugin::logging::level(&args.log_level))
        .with_ansi(false)
        .with_writer(|| plexus_plugin::logging::Escaping(std::io::stderr()))
        .init();
    if let Some(root) = &args.host_root {
        nix::unistd::chroot(root).with_context(|| format!("--host-root {}: chroot", root.display()))?;
        nix::unistd::chdir("/").context("chdir / in the host root")?;
        tracing::info!(root = %root.display(), "running in the host's root file system");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the runtime")?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    // The node policy's bound on NADs holds in the cache too (each request is still checked
    // against its own policy).
    let nad_config_cap = match plexus_node::Policy::load(|k| std::env::var(k).ok()) {
        Ok(policy) => policy.limits.nad_config_bytes,
        Err(e) => {
            tracing::warn!("node policy: {e}: the NAD cache keeps configs of the default size");
            plexus_node::policy::Limits::default().nad_config_bytes
        }
    };
    let metrics = Arc::new(metrics::Metrics::new());
    let timeout = Duration::from_secs_f64(args.api_timeout.max(0.1));
    let (dra_stop, dra_stopped) = tokio::sync::watch::channel(false);
    let mut dra_plugin = None;
    // Whether the kubelet can use the DRA driver yet (its readiness waits for it): with --dra only.
    let dra_ready = args.dra.dra.then(|| Arc::new(plexus_dra::ready::Readiness::default()));
    let caches = match plexus_k8s::api::kube_config(args.kubeconfig.as_deref(), timeout).await? {
        Some(config) => {
            let node = args
                .node_name
                .clone()
                .filter(|n| !n.is_empty())
                .context("--node-name (or NODE_NAME) is needed with an API: only this node's pods are watched")?;
            let api = kube::Client::try_from(config.clone()).context("Kubernetes client")?;
            // Watches are long requests: no per-call read deadline (the server ends each watch).
            let mut watch_config = config;
            watch_config.read_timeout = None;
            let watch = kube::Client::try_from(watch_config).context("Kubernetes client")?;
            if let Some(ready) = &dra_ready {
                let this = dra::ThisNode {
                    name: node.clone(),
                    sysfs: plexus_net::sysfs::Sysfs::new(&args.sysfs_root),
                    policy: dra::NodePolicy::new(std::env::var(plexus_node::paths::POLICY_ENV).ok()),
                };
                dra_plugin =
                    Some(dra::start(&args.dra, api.clone(), watch.clone(), this, timeout, dra_stopped, ready.clone()));
            }
            let api = plexus_k8s::api::ApiClient::on_runtime(api, tokio::runtime::Handle::current(), timeout);
            let caches =
                cluster::Caches::start(watch, api, &node, metrics.clone(), &args.status_journal, nad_config_cap)?;
            let started = tokio::time::Instant::now();
            while !caches.synced() && started.elapsed() < cluster::SYNC_WAIT {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if !caches.synced() {
                tracing::warn!(
                    "watch caches not synced after {:?}: serving, reading the API on misses",
                    cluster::SYNC_WAIT
                );
            }
            let replayed = caches.status.replay();
            if replayed > 0 {
                tracing::info!(replayed, "network-status an earlier daemon left in the journal: writing");
            }
            Some(caches)
        }
        None => {
            tracing::info!("no Kubernetes API configured: NADs from each request's nadDir, as in thin mode");
            anyhow::ensure!(
                !args.dra.dra,
                "--dra needs the Kubernetes API (--kubeconfig or the in-cluster service account)"
            );
            None
        }
    };
    let view = caches.clone().map(|c| c as Arc<dyn plexus::ClusterView>);
    let status = caches.as_ref().map(|c| c.status.clone());
    // Its delegates die with their request's thread; the plugins it links run in-process.
    let runner = Runner::parent(if args.in_process_delegates { &IN_PROCESS } else { &[] });
    let spans = match args.otlp_endpoint.as_deref().filter(|e| !e.is_empty()) {
        Some(endpoint) => {
            tracing::info!(endpoint, "spans to an OpenTelemetry collector");
            Some(Arc::new(spans::Spans::start(endpoint, args.node_name.as_deref())?))
        }
        None => None,
    };
    let mut observers: Vec<Arc<dyn plexus::Observer>> = vec![Arc::new(metrics::DelegateMetrics::new(metrics.clone()))];
    observers.extend(spans.clone().map(|s| s as Arc<dyn plexus::Observer>));
    let mut daemon = server::Daemon::new(
        plexus::Meta::with_view(view).observed_by(observers),
        runner,
        metrics,
        spans.clone(),
        args.max_concurrent.max(1),
        args.max_queued,
    );
    daemon.sysfs_root = args.sysfs_root.clone();
    let daemon = Arc::new(daemon);
    http::serve(args.metrics_address, http::Endpoints { daemon: daemon.clone(), caches, dra: dra_ready }).await?;
    let listener = server::bind(&args.socket).with_context(|| format!("socket {}", args.socket.display()))?;
    tracing::info!(socket = %args.socket.display(), "serving");
    let stop = async {
        use tokio::signal::unix::{SignalKind, signal};
        let (mut term, mut int) = (signal(SignalKind::terminate()).ok(), signal(SignalKind::interrupt()).ok());
        tokio::select! {
            _ = async { match term.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
            _ = async { match int.as_mut() { Some(s) => { s.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    // On a worker thread, not the main one: a connection accepted there runs on the same thread
    // at once instead of being handed to a worker (a wake-up on the way of every request).
    let grace = Duration::from_secs(args.shutdown_grace);
    let stopped =
        tokio::spawn(server::serve(listener, args.socket, daemon, stop, grace)).await.context("the socket server")?;
    // The statuses of the requests answered, written within what is left of the grace period; any
    // left stay journaled for the next daemon.
    if let Some(status) = status {
        let within = (stopped + grace).saturating_duration_since(tokio::time::Instant::now());
        match tokio::task::spawn_blocking(move || status.flush(within)).await {
            Ok(0) => {}
            Ok(left) => tracing::warn!(left, "network-status not yet written: left in the journal"),
            Err(e) => tracing::error!("flushing network-status: {e}"),
        }
    }
    if let Some(spans) = spans {
        let _ = tokio::task::spawn_blocking(move || spans.shutdown()).await;
    }
    // The kubelet plugin's sockets go: the kubelet deregisters the driver.
    let _ = dra_stop.send(true);
    if let Some(plugin) = dra_plugin {
        let _ = plugin.await;
    }
    Ok(())
}
