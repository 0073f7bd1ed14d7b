//! Attaching a pod's planned networks ([`add_pod`]): Multus's checks of the pod's namespace
//! (it exists; none of the interface names asked for is taken), the delegate cache written before
//! any delegate runs, the attachments' ADDs in groups (the cluster network first, then the others
//! at once, or one after another), each result recorded in the cache, the selection's
//! `default-route`s applied, what the cluster is told recorded — and a failed ADD rolled back,
//! the last group first. Also DEL of every attachment past failures, the groups in reverse. The
//! delegates themselves are behind the [`Delegates`] seam, so all of this but the namespace is
//! tested without root (`tests.rs`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnetwork::IpNetwork;
use plexus_cni::{CniResult, Error, ErrorList, Route, code};
use plexus_net::{IpFamily, LinkSocket, Netns};
use plexus_node::{Policy, files};
use plexus_plugin::Request;
use plexus_plugin::undo::Undo;
use serde_json::Value;

use crate::attachment::{Attachment, DelegateEnv, Delegates};
use crate::cache;
use crate::conf::MetaConf;
use crate::multus;
use crate::pod::Pod;

/// What an ADD attached: the runtime's result (the cluster network's, else all of them
/// combined), and each attachment with its own result, in order.
pub(crate) struct Added {
    pub result: CniResult,
    pub attachments: Vec<Attachment>,
    pub results: Vec<CniResult>,
}

/// What an ADD records beside its cache once every delegate succeeded (network-status): a
/// failure there fails the ADD, and everything is undone.
pub(crate) trait Record {
    fn record(&self, attachments: &[Attachment], results: &[CniResult]) -> Result<(), Error>;
}

/// ADD the planned `attachments` into the pod: its namespace checked, the cache written before any
/// delegate runs (a crash from then on leaves what DEL needs), the delegates run, the
/// `default-route`s applied and `record` told — and on any failure, everything undone.
pub(crate) fn add_pod(
    req: &Request,
    conf: &MetaConf,
    pod: &Pod,
    base: &DelegateEnv,
    attachments: Vec<Attachment>,
    delegates: &dyn Delegates,
    record: &dyn Record,
) -> Result<Added, Error> {
    if attachments.is_empty() {
        return Err(Error::invalid_config("no network to attach: set clusterNetwork, delegates or networks"));
    }
    // Before any delegate runs, as Multus: the pod's namespace exists and has none of the
    // interface names asked for.
    let pod_netns = PodNetns::open(req.env.netns.as_deref().expect("ADD has CNI_NETNS"))?;
    pod_netns.refuse_taken_names(&attachments)?;
    let mut state = cache::Cache {
        version: cache::CACHE_VERSION,
        container_id: req.env.container_id.clone(),
        netns: req.env.netns.clone(),
        pod_ref: pod.who.reference(),
        attachments,
    };
    let cache_path = cache::create(&conf.cni_dir, &state)?;
    let mut undo = Undo::new();
    undo.push(Step::Cache(cache_path.clone()));
    if conf.write_multus_cache
        && let Some(dir) = &conf.multus_cache_dir
    {
        match multus::write(dir, &req.env.container_id, &state.attachments) {
            Ok(path) => undo.push(Step::Cache(path)),
            Err(e) => return Err(roll_back(undo, e, &state.attachments, base, &req.policy, delegates)),
        }
    }
    // The delegates' ADDs end early enough for their DELs (a rollback) to run in what is left.
    let mut add_env = base.clone();
    add_env.cni.deadline = base.cni.deadline.keeping_for_undo();
    let attached = attach_all(&mut state, conf.parallel, pod, &add_env, &cache_path, &mut undo, delegates).and_then(
        |mut results| {
            apply_default_routes(&pod_netns, &cache_path, &mut state.attachments, &mut results)
                .map_err(|e| e.context("default-route"))?;
            record.record(&state.attachments, &results).map_err(|e| e.context("set network-status"))?;
            Ok(results)
        },
    );
    let results = match attached {
        Ok(results) => results,
        Err(e) => return Err(roll_back(undo, e, &state.attachments, base, &req.policy, delegates)),
    };
    undo.commit();
    let result = match state.attachments.iter().position(|a| a.cluster_network) {
        Some(i) => results[i].clone(),
        None => combine(&results),
    };
    Ok(Added { result, attachments: state.attachments, results })
}

/// The results of several attachments as one (no cluster network): interfaces concatenated,
/// addresses re-pointed at them, routes concatenated, the first DNS.
fn combine(results: &[CniResult]) -> CniResult {
    let mut all = CniResult::default();
    for r in results {
        let offset = all.interfaces.len();
        all.interfaces.extend(r.interfaces.iter().cloned());
        for ip in &r.ips {
            let mut ip = ip.clone();
            ip.interface = ip.interface.map(|i| i + offset);
            all.ips.push(ip);
        }
        all.routes.extend(r.routes.iter().cloned());
        if all.dns.is_empty() {
            all.dns = r.dns.clone();
        }
    }
    all
}

/// The selection's `default-route`s applied in the pod; the results that changed are recorded
/// again in the cache (a later record replaces an earlier one), so CHECK and DEL see them.
fn apply_default_routes(
    pod: &PodNetns,
    cache_path: &Path,
    attachments: &mut [Attachment],
    results: &mut [CniResult],
) -> Result<(), Error> {
    for i in pod.apply_default_routes(attachments, results)? {
        let raw = attachments[i].render(&results[i])?;
        cache::record_result(cache_path, i, &raw)?;
        attachments[i].result = Some(raw);
    }
    Ok(())
}

/// The device plugin's device-info file of `device` of `resource` (device-info spec §5), if it
/// wrote one; the name is one path component (the resource name is a NAD's, the device the
/// kubelet's).
fn device_plugin_info(resource: &str, device: &str) -> PathBuf {
    let name = format!("{}-{}-device.json", resource.replace('/', "-"), device.replace('/', "-"));
    PathBuf::from(plexus_node::paths::DEVICE_INFO_DP_DIR).join(name)
}

/// The device plugin's device-info, copied where the delegate will look (spec §5); a delegate
/// that finds none may write its own.
fn copy_device_info(a: &Attachment) -> Result<(), Error> {
    if let (Some(r), Some(d), Some(f)) = (&a.resource_name, &a.device_id, &a.device_info_file)
        && let Ok(doc) = std::fs::read(device_plugin_info(r, d))
    {
        files::write_private_atomic(f, &doc)?;
    }
    Ok(())
}

/// The order a pod's attachments run in: groups one after another, the attachments of a group
/// concurrently. With `parallel`, the cluster network is a group of its own ahead of the others
/// (the pod's primary interface exists before any secondary one, as with Multus), then every
/// other attachment at once; without, one group per attachment in annotation order. DEL walks
/// the groups in reverse.
fn groups(attachments: &[Attachment], parallel: bool) -> Vec<Vec<usize>> {
    if !parallel {
        return (0..attachments.len()).map(|i| vec![i]).collect();
    }
    let (cluster, rest): (Vec<usize>, Vec<usize>) =
        (0..attachments.len()).partition(|&i| attachments[i].cluster_network);
    [cluster, rest].into_iter().filter(|g| !g.is_empty()).collect()
}

/// `f` for every index of `group`, concurrently (each on its own thread, in this invocation's log
/// span; one runs on the calling thread); the answers in the group's order.
pub(crate) fn run_group<T: Send>(group: &[usize], f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    if let [i] = group {
        return vec![f(*i)];
    }
    // The request's log (its subscriber is this thread's, not the process's) and its span go
    // with each thread: what a delegation logs there lands in the request's logFile too.
    let span = tracing::Span::current();
    let log = tracing::dispatcher::get_default(|d| d.clone());
    std::thread::scope(|s| {
        let threads: Vec<_> = group
            .iter()
            .map(|&i| {
                let (f, span, log) = (&f, span.clone(), log.clone());
                s.spawn(move || tracing::dispatcher::with_default(&log, || span.in_scope(|| f(i))))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

/// ADD every attachment, a group after another (concurrently within one), each group pushed on
/// `undo` before it runs and each result recorded in the cache as it comes; the results in
/// annotation order. The first failure in annotation order is the ADD's error (the others are
/// logged), and the attachments that succeeded keep their results, so the rollback DELs them
/// with their results, as a DEL from the cache would.
pub(crate) fn attach_all(
    state: &mut cache::Cache,
    parallel: bool,
    pod: &Pod,
    env: &DelegateEnv,
    cache_path: &Path,
    undo: &mut Undo<Step>,
    delegates: &dyn Delegates,
) -> Result<Vec<CniResult>, Error> {
    // One result record at a time in the cache file.
    let recording = std::sync::Mutex::new(());
    let mut added = Vec::new();
    for group in groups(&state.attachments, parallel) {
        let names = group.iter().map(|&i| state.attachments[i].describe()).collect();
        undo.push(Step::Attachments { group: group.clone(), names });
        let attachments = &state.attachments;
        let add = |i: usize| attach(&attachments[i], i, env, cache_path, &recording, pod, delegates);
        let answers = run_moves_in_turn(&group, |i| moves_a_device(&attachments[i]), cache_path, env, add);
        let mut failed = None;
        for (i, answer) in group.into_iter().zip(answers) {
            match answer {
                Ok(done) => added.push((i, done)),
                Err(e) if failed.is_none() => failed = Some(e),
                Err(e) => tracing::error!("{e}"),
            }
        }
        if let Some(e) = failed {
            for (i, (_, raw)) in added {
                state.attachments[i].result = Some(raw);
            }
            return Err(e);
        }
    }
    added.sort_by_key(|(i, _)| *i);
    Ok(added
        .into_iter()
        .map(|(i, (result, raw))| {
            state.attachments[i].result = Some(raw);
            result
        })
        .collect())
}

/// `add` for every index of `group`, concurrently, as [`run_group`]; those that move a device
/// (`moves`) together in the node's device-move turn ([`device_move_turn`]), held from before the
/// first of them starts until the last of them ends, and only for them: the group's other
/// delegates run beside them without waiting for it or holding it. The answers in the group's
/// order.
fn run_moves_in_turn<T: Send>(
    group: &[usize],
    moves: impl Fn(usize) -> bool,
    cache_path: &Path,
    env: &DelegateEnv,
    add: impl Fn(usize) -> T + Sync,
) -> Vec<T> {
    let (movers, others): (Vec<usize>, Vec<usize>) = group.iter().partition(|&&i| moves(i));
    if movers.is_empty() {
        return run_group(group, add);
    }
    let run = |ids: &[usize]| -> Vec<(usize, T)> { ids.iter().copied().zip(run_group(ids, &add)).collect() };
    let parts: &[usize] = if others.is_empty() { &[0] } else { &[0, 1] };
    let mut answers: Vec<(usize, T)> = run_group(parts, |part| match part {
        0 => {
            let _turn = device_move_turn(cache_path, env);
            run(&movers)
        }
        _ => run(&others),
    })
    .into_iter()
    .flatten()
    .collect();
    answers.sort_by_key(|(i, _)| group.iter().position(|g| g == i));
    answers.into_iter().map(|(_, t)| t).collect()
}

/// Whether attachment `a` moves a whole netdev into the pod (a host-device delegate).
fn moves_a_device(a: &Attachment) -> bool {
    let first = a.conf.get("plugins").and_then(|p| p.get(0)).unwrap_or(&a.conf);
    matches!(first.get("type").and_then(Value::as_str), Some("plexus-host-device" | "host-device"))
}

/// The node's pods move their devices in turn. The kernel moves one netdev into a namespace at a
/// time (under RTNL, each waiting out an RCU grace period: ~20 ms here), so pods moving devices at
/// once all finish when the last one does; in turn, the first pod's are in place first and the
/// last finishes no later. The turn is an exclusive `flock` on the meta-plugin's cache directory
/// (nothing is written; each request opens it, so threads of plexus-daemon take turns too), held
/// while a group's device moves run — never for its other delegates ([`run_moves_in_turn`]). It
/// is waited for at most half of what the request has left; then the moves run without it (the
/// turn is for speed, not correctness).
fn device_move_turn(cache_path: &Path, env: &DelegateEnv) -> Option<std::fs::File> {
    let dir = std::fs::File::open(cache_path.parent()?).ok()?;
    let within = plexus_cni::Deadline::after(env.cni.deadline.remaining() / 2);
    match plexus_cni::deadline::lock_until(&dir, within) {
        Ok(true) => Some(dir),
        _ => {
            tracing::info!("the node's device moves: no turn in time, moving without one");
            None
        }
    }
}

/// ADD attachment `i`: its device-info file placed, its delegate run, its result recorded in the
/// cache. A device-info file that cannot be placed or a result the cache cannot record is a
/// failed ADD too.
fn attach(
    a: &Attachment,
    i: usize,
    env: &DelegateEnv,
    cache_path: &Path,
    recording: &std::sync::Mutex<()>,
    pod: &Pod,
    delegates: &dyn Delegates,
) -> Result<(CniResult, Value), Error> {
    tracing::debug!(network = %a.network, ifname = %a.ifname, "attaching");
    copy_device_info(a)
        .and_then(|()| delegates.add(a, env))
        .and_then(|(result, raw)| {
            let _one = recording.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            cache::record_result(cache_path, i, &raw).map(|()| (result, raw))
        })
        .map_err(|e| e.context(format!("[{}] adding {}", pod.who.reference().unwrap_or_default(), a.describe())))
}

/// DEL every attachment, the groups in reverse (concurrently within one), keeping going past
/// failures; the failures in reverse annotation order.
pub(crate) fn delete_all(
    attachments: &[Attachment],
    base: &DelegateEnv,
    policy: &Policy,
    parallel: bool,
    delegates: &dyn Delegates,
) -> ErrorList {
    groups(attachments, parallel)
        .iter()
        .rev()
        .flat_map(|g| teardown_group(attachments, g, base, policy, delegates))
        .collect()
}

/// DEL one group's attachments at once; the failures, each with its attachment, in reverse
/// annotation order.
fn teardown_group(
    attachments: &[Attachment],
    group: &[usize],
    base: &DelegateEnv,
    policy: &Policy,
    delegates: &dyn Delegates,
) -> ErrorList {
    let answers = run_group(group, |i| teardown(&attachments[i], base, policy, delegates));
    group
        .iter()
        .zip(answers)
        .rev()
        .filter_map(|(&i, answer)| answer.err().map(|e| (attachments[i].describe(), e)))
        .collect()
}

/// DEL one attachment; its device-info file goes too (only in the policy's device-info
/// directory), whatever the delegate answered.
fn teardown(a: &Attachment, base: &DelegateEnv, policy: &Policy, delegates: &dyn Delegates) -> Result<(), Error> {
    let deleted = delegates.del(a, base);
    if let Some(f) = a.device_info_file.as_ref().filter(|f| policy.device_info_file_allowed(f)) {
        let _ = files::remove_if_present(f);
    }
    deleted
}

/// A failed ADD undone: every step `undo` holds, the last first (the attachments' groups DEL'd,
/// failed ones too, then the cache file); `e`, with what could not be undone.
pub(crate) fn roll_back(
    undo: Undo<Step>,
    e: Error,
    attachments: &[Attachment],
    base: &DelegateEnv,
    policy: &Policy,
    delegates: &dyn Delegates,
) -> Error {
    undo.unwind(e, |step| match step {
        Step::Cache(path) => files::remove_if_present(&path),
        Step::Attachments { group, .. } => {
            let failed = teardown_group(attachments, &group, base, policy, delegates);
            let n = failed.len();
            failed.into_result(code::DELEGATE_FAILED, format!("DEL failed for {n} attachment(s)"))
        }
    })
}

/// A completed step of the meta-plugin's ADD, and what undoing it takes.
#[derive(Debug)]
pub(crate) enum Step {
    /// The cache file was written: remove it.
    Cache(PathBuf),
    /// A group of attachments was sent their ADDs (failed ones too, as the spec wants): DEL them,
    /// concurrently as they were added. `names` says which, for the report.
    Attachments { group: Vec<usize>, names: Vec<String> },
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Cache(p) => write!(f, "remove cache file {}", p.display()),
            Step::Attachments { names, .. } => write!(f, "DEL {}", names.join(", ")),
        }
    }
}

/// The pod's namespace.
struct PodNetns {
    ns: Netns,
}

impl PodNetns {
    /// Open `CNI_NETNS`; a namespace that does not exist fails the ADD before any delegate runs
    /// (code 8, as the reference plugins answer).
    fn open(path: &Path) -> Result<PodNetns, Error> {
        let ns = Netns::open(path).map_err(|e| {
            Error::new(code::INVALID_NETNS, format!("CNI_NETNS {:?}: {e}", path.display().to_string()))
                .with_details("the pod's network namespace must exist before ADD")
        })?;
        Ok(PodNetns { ns })
    }

    /// Refuse, before any delegate runs, an attachment whose interface name the pod already has
    /// (the spec: ADD must fail then; Multus checks it before each delegate).
    fn refuse_taken_names(&self, attachments: &[Attachment]) -> Result<(), Error> {
        let names: Vec<&str> = attachments.iter().map(|a| a.ifname.as_str()).collect();
        let taken = self.ns.existing_links(&names)?;
        match attachments.iter().find(|a| taken.contains(&a.ifname)) {
            Some(a) => Err(Error::new(
                code::IFNAME_TAKEN,
                format!("network {}: interface {:?} already exists in the container", a.network, a.ifname),
            )),
            None => Ok(()),
        }
    }

    /// Multus's `default-route`: when any attachment's selection has the key (even empty), every
    /// attachment's default routes (in the pod and in its result) go, and an attachment that
    /// names gateways gets one default route per gateway (one per family, checked by the plan).
    /// Returns the indices of the results that changed.
    fn apply_default_routes(&self, attachments: &[Attachment], results: &mut [CniResult]) -> Result<Vec<usize>, Error> {
        if attachments.iter().all(|a| a.default_route.is_none()) {
            return Ok(Vec::new());
        }
        // Only now a netlink socket in the pod (most pods have no default-route).
        let rt = plexus_net::configure::runtime()?;
        let sock = {
            let _in_runtime = rt.enter();
            LinkSocket::open(&self.ns)?
        };
        rt.block_on(async {
            let mut changed = Vec::new();
            for (i, (a, result)) in attachments.iter().zip(results.iter_mut()).enumerate() {
                let Some(link) = sock.link(&a.ifname).await? else { continue };
                let gateways: &[IpAddr] = a.default_route.as_deref().unwrap_or_default();
                let before = result.routes.len();
                result.routes.retain(|r| r.dst.prefix() != 0);
                let mut touched = result.routes.len() != before;
                for family in [IpFamily::V4, IpFamily::V6] {
                    touched |= sock.delete_default_routes(link.index, family).await? > 0;
                }
                for gw in gateways {
                    let any = if gw.is_ipv4() { IpAddr::from([0u8; 4]) } else { IpAddr::from([0u16; 8]) };
                    let dst = IpNetwork::new(any, 0).expect("prefix 0");
                    let spec = plexus_net::link::RouteSpec::new(dst, Some(*gw), link.index);
                    sock.add_route(&spec).await.map_err(|e| {
                        Error::from(e).context(format!("network {}: default route via {gw} on {}", a.network, a.ifname))
                    })?;
                    result.routes.push(Route::new(dst, Some(*gw)));
                    touched = true;
                }
                if touched {
                    changed.push(i);
                }
            }
            Ok(changed)
        })
    }
}
