//! network-status from the daemon: written after the runtime has its answer, never lost to a
//! restart.
//!
//! A daemon-mode ADD stands whatever its network-status PATCH does (the API down or refusing:
//! retried until it lands; the pod gone: dropped), so the runtime need not wait for that PATCH —
//! with a real API server it is one etcd write on the way of every pod's sandbox. What the wait
//! bought was only this: a daemon killed before the PATCH landed failed the ADD (the shim's code
//! 11) and the runtime's retry wrote it. Instead each status goes into a journal first — one
//! file per pod in a root-only directory, written before the answer, removed once the PATCH
//! landed — and a daemon that starts replays what it finds there.
//!
//! Per pod, the newest status wins: a status submitted while an older one of the same pod is
//! being written replaces it, and the older one is never written after it. A status names its
//! pod's UID, so it never lands on a later pod of the same name (the API refuses that PATCH); a
//! PATCH the API refuses for what it is (not for being down) is given up, not retried.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use plexus_k8s::K8sError;
use plexus_k8s::status::{NetworkStatus, PodRef};
use plexus_node::files;
use plexus_node::format::STATUS_JOURNAL;
use serde::{Deserialize, Serialize};

/// One PATCH of a pod's network-status, as the API client makes it.
pub type Patch = dyn Fn(&PodRef, &[NetworkStatus]) -> Result<(), K8sError> + Send + Sync;

/// A journal entry: the pod and the statuses to write.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    /// The version of its format (`plexus_node::format::STATUS_JOURNAL`; none in entries
    /// written before formats carried one: 1).
    #[serde(default = "plexus_node::format::first")]
    version: u32,
    #[serde(flatten)]
    pod: PodRef,
    statuses: Vec<NetworkStatus>,
}

impl Entry {
    fn new(pod: PodRef, statuses: Vec<NetworkStatus>) -> Entry {
        Entry { version: STATUS_JOURNAL.current, pod, statuses }
    }

    /// The entry in `bytes` (the journal file `file`): `None` when it is not one; code 105 when a
    /// later plexus wrote it, before it is read as this build's.
    fn parse(bytes: &[u8], file: &Path) -> Result<Option<Entry>, plexus_cni::Error> {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else { return Ok(None) };
        STATUS_JOURNAL.check_json(&file.display().to_string(), &value)?;
        Ok(serde_json::from_value(value).ok())
    }
}

/// A pod's writes: the status to write next, and where the pod is.
#[derive(Default)]
struct Slot {
    next: Option<Entry>,
    /// In the queue, or with a writer: a newer status only replaces `next`.
    busy: bool,
    /// Not to be tried before (the API did not take the last try).
    not_before: Option<Instant>,
    /// Tries the API did not take, for the log.
    failed: u32,
}

/// The pods with statuses to write, and the pods waiting for a writer.
#[derive(Default)]
struct State {
    slots: HashMap<String, Slot>,
    queue: VecDeque<String>,
    writers: usize,
}

pub struct StatusWriter {
    patch: Arc<Patch>,
    journal: PathBuf,
    retry: Duration,
    state: Mutex<State>,
    /// A pod is waiting for a writer.
    work: Condvar,
    /// A pod's statuses are all written.
    idle: Condvar,
}

/// Threads that write statuses, started as they are needed. A pod's writes are one thread's at a
/// time; a pod whose status the API did not take waits its retry in the queue, not in a thread.
const WRITERS: usize = 2;

/// The longest wait between two tries of a pod's status: the wait doubles from the writer's
/// `retry` up to this while the API does not take it.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Journal file names longer than this (a long namespace and pod name: the temp file beside it
/// would pass the file system's 255 bytes) name the pod by a digest instead.
const JOURNAL_NAME_MAX: usize = 200;

/// Whether `namespace/name` can name a pod (its network-status is a PATCH to that path): a
/// DNS-1123 label and subdomain, never `/` or `_`, so `<namespace>_<name>` is a file name that
/// splits back.
fn pod_name(namespace: &str, name: &str) -> Result<(), K8sError> {
    plexus_k8s::names::namespace(namespace)?;
    plexus_k8s::names::object("pod", name).map(|_| ())
}

impl StatusWriter {
    /// A writer journaling in `journal` (created root-only) that PATCHes with `patch` and tries
    /// a PATCH the API did not take again every `retry`.
    pub fn new(patch: Arc<Patch>, journal: &Path, retry: Duration) -> Result<Arc<StatusWriter>, plexus_cni::Error> {
        files::ensure_private_dir(journal)?;
        Ok(Arc::new(StatusWriter {
            patch,
            journal: journal.to_path_buf(),
            retry,
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
        }))
    }

    /// Take the pod's status: journaled, then written in the background. When it cannot be
    /// journaled, it is written before this returns (as without a journal), and an API that
    /// does not take it then leaves it to the background; so is it when an older status of the
    /// pod is still to be written (it replaces that one, which must not land after it).
    pub fn submit(self: &Arc<Self>, pod: &PodRef, statuses: &[NetworkStatus]) -> Result<(), K8sError> {
        let (namespace, name) = (&pod.namespace, &pod.name);
        pod_name(namespace, name)?;
        let entry = Entry::new(pod.clone(), statuses.to_vec());
        let key = journal_name(namespace, name);
        let mut state = self.lock();
        let Err(e) = self.journal_write(&entry) else {
            self.enqueue_locked(&mut state, entry);
            return Ok(());
        };
        // An older entry of the pod would be replayed after this status by the next daemon.
        let _ = files::remove_if_present(&self.journal.join(&key));
        if state.slots.contains_key(&key) {
            tracing::warn!("network-status of {namespace}/{name} not journaled ({e}): written in the background");
            self.enqueue_locked(&mut state, entry);
            return Ok(());
        }
        // The pod's writes are this call's until the PATCH is done: a newer status meanwhile
        // waits in the slot, and goes after it.
        state.slots.insert(key.clone(), Slot { busy: true, ..Slot::default() });
        drop(state);
        tracing::warn!("network-status of {namespace}/{name} not journaled ({e}): written before the answer");
        match (self.patch)(&entry.pod, &entry.statuses) {
            Err(K8sError::Unavailable(why)) => {
                tracing::warn!("network-status of {namespace}/{name}: {why}: retried in the background");
                self.retry_later(&key, entry);
                Ok(())
            }
            other => {
                self.written(&key);
                other
            }
        }
    }

    /// Every status the journal holds (a daemon that stopped before writing them), written in
    /// the background; how many.
    pub fn replay(self: &Arc<Self>) -> usize {
        let Ok(dir) = std::fs::read_dir(&self.journal) else { return 0 };
        let mut replayed = 0;
        for file in dir.flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            if files::is_temp_name(&name) {
                let _ = files::remove_if_present(&file.path());
                continue;
            }
            let parsed = std::fs::read(file.path())
                .map_err(|e| e.to_string())
                .and_then(|b| Entry::parse(&b, &file.path()).map_err(|e| format!("{e}: {}", e.details)));
            let entry = match parsed {
                Ok(entry) => entry,
                Err(why) => {
                    tracing::error!("{why}");
                    continue;
                }
            };
            let entry = entry.filter(|e| {
                let pod = &e.pod;
                journal_name(&pod.namespace, &pod.name) == name && pod_name(&pod.namespace, &pod.name).is_ok()
            });
            match entry {
                Some(e) => {
                    tracing::info!(
                        "network-status of {}/{} from the journal: written now",
                        e.pod.namespace,
                        e.pod.name
                    );
                    self.enqueue(e);
                    replayed += 1;
                }
                None => tracing::warn!("{}: not a network-status journal entry, left alone", file.path().display()),
            }
        }
        replayed
    }

    /// Pods whose statuses are taken and not yet written (or given up).
    pub fn pending(&self) -> usize {
        self.lock().slots.len()
    }

    /// Wait until every status taken is written, at most `within`; how many pods are left (their
    /// statuses stay in the journal for the next daemon).
    pub fn flush(&self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        let mut state = self.lock();
        while !state.slots.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            state = self.idle.wait_timeout(state, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        state.slots.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called with the state locked: journal writes and removals of one pod never cross.
    fn journal_write(&self, entry: &Entry) -> Result<(), plexus_cni::Error> {
        let bytes = serde_json::to_vec(entry).map_err(|e| plexus_cni::Error::internal(e.to_string()))?;
        files::replace_private_via(
            &self.journal,
            &self.journal.join(journal_name(&entry.pod.namespace, &entry.pod.name)),
            &bytes,
        )
    }

    fn enqueue(self: &Arc<Self>, entry: Entry) {
        let mut state = self.lock();
        self.enqueue_locked(&mut state, entry);
    }

    fn enqueue_locked(self: &Arc<Self>, state: &mut State, entry: Entry) {
        let key = journal_name(&entry.pod.namespace, &entry.pod.name);
        let slot = state.slots.entry(key.clone()).or_default();
        slot.next = Some(entry);
        slot.not_before = None;
        if slot.busy {
            return; // queued, or with a writer that queues it again for the newer status
        }
        slot.busy = true;
        state.queue.push_back(key);
        self.wake_writer(state);
    }

    /// A pod was queued: a writer takes it, started if there are fewer than [`WRITERS`]. One that
    /// cannot start (no thread to be had) is tried again at the next queueing; the statuses wait
    /// in the journal meanwhile.
    fn wake_writer(self: &Arc<Self>, state: &mut State) {
        if state.writers < WRITERS {
            let me = self.clone();
            match std::thread::Builder::new().name("network-status".into()).spawn(move || me.writer()) {
                Ok(_) => state.writers += 1,
                Err(e) if state.writers == 0 => tracing::error!("no network-status writer: {e}: tried again later"),
                Err(_) => {}
            }
        }
        self.work.notify_one();
    }

    /// A writer thread, for as long as the daemon runs: the next pod due, its newest status.
    fn writer(self: Arc<Self>) {
        loop {
            let (key, entry, failed) = self.next_due();
            let pod = format!("{}/{}", entry.pod.namespace, entry.pod.name);
            match (self.patch)(&entry.pod, &entry.statuses) {
                Err(K8sError::Unavailable(why)) => {
                    if failed == 0 {
                        tracing::warn!("network-status of {pod}: {why}: retried in the background");
                    }
                    self.retry_later(&key, entry);
                }
                Err(e) => {
                    // Refused for what it is (a later pod of the name, a status too large): the
                    // same PATCH would be refused again.
                    tracing::error!("network-status of {pod} given up: {e}");
                    self.written(&key);
                }
                Ok(()) => {
                    if failed > 0 {
                        tracing::info!("network-status of {pod} written after the API came back");
                    }
                    self.written(&key);
                }
            }
        }
    }

    /// Wait for a queued pod that is due, and take its newest status.
    fn next_due(&self) -> (String, Entry, u32) {
        let mut state = self.lock();
        loop {
            let now = Instant::now();
            let due = state.queue.iter().position(|k| state.slots[k].not_before.is_none_or(|t| t <= now));
            if let Some(i) = due {
                let key = state.queue.remove(i).expect("a position in the queue");
                let slot = state.slots.get_mut(&key).expect("a queued pod has its slot");
                let entry = slot.next.take().expect("a queued pod has a status to write");
                return (key, entry, slot.failed);
            }
            let soonest = state.queue.iter().filter_map(|k| state.slots[k].not_before).min();
            state = match soonest {
                Some(t) => {
                    self.work.wait_timeout(state, t.saturating_duration_since(now)).unwrap_or_else(|p| p.into_inner()).0
                }
                None => self.work.wait(state).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }

    /// The API did not take `entry`: the pod waits in the queue until its retry is due (the wait
    /// doubling with each try, up to [`RETRY_MAX`]) — or goes at once with a newer status that
    /// came meanwhile.
    fn retry_later(self: &Arc<Self>, key: &str, entry: Entry) {
        let mut state = self.lock();
        let slot = state.slots.get_mut(key).expect("a pod being written keeps its slot");
        if slot.next.is_none() {
            let wait = self.retry.saturating_mul(1 << slot.failed.min(8)).min(RETRY_MAX.max(self.retry));
            slot.next = Some(entry);
            slot.not_before = Some(Instant::now() + wait);
            slot.failed += 1;
        }
        state.queue.push_back(key.to_string());
        self.wake_writer(&mut state);
    }

    /// The pod's status went (or was given up): its slot and journal entry go too, unless a newer
    /// status came meanwhile, which is queued.
    fn written(self: &Arc<Self>, key: &str) {
        let mut state = self.lock();
        let slot = state.slots.get_mut(key).expect("a pod being written keeps its slot");
        if slot.next.is_some() {
            slot.failed = 0;
            state.queue.push_back(key.to_string());
            self.wake_writer(&mut state);
            return;
        }
        let _ = files::remove_if_present(&self.journal.join(key));
        state.slots.remove(key);
        self.idle.notify_all();
    }
}

/// `<namespace>_<name>`, or `~<SHA-256 of namespace/name>` past [`JOURNAL_NAME_MAX`] (`~` is in
/// no object name, so the two never meet).
fn journal_name(namespace: &str, name: &str) -> String {
    let plain = format!("{namespace}_{name}");
    if plain.len() <= JOURNAL_NAME_MAX {
        return plain;
    }
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    std::iter::once("~".to_string()).chain(digest.iter().map(|b| format!("{b:02x}"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn status(ip: &str) -> Vec<NetworkStatus> {
        vec![NetworkStatus {
            name: "default/rail0".into(),
            interface: Some("net1".into()),
            ips: vec![ip.into()],
            mac: None,
            mtu: None,
            default: false,
            dns: None,
            gateway: Vec::new(),
            device_info: None,
        }]
    }

    /// A fake API: the PATCHes it took, in order; unavailable while `down`; each PATCH waits
    /// `slow`.
    struct Api {
        written: Mutex<Vec<(String, String)>>,
        down: AtomicBool,
        slow: Duration,
        /// Pods whose PATCHes it does not take (unavailable), whatever else it does.
        refused: Mutex<Vec<String>>,
        /// Pods whose PATCHes it refuses for what they are (a later pod of the name).
        rejected: Mutex<Vec<String>>,
        /// Every PATCH tried: the pod, the UID it named, when.
        tries: Mutex<Vec<(String, String, Instant)>>,
    }

    fn writer(dir: &Path, api: &Arc<Api>) -> Arc<StatusWriter> {
        let a = api.clone();
        let patch: Arc<Patch> = Arc::new(move |pod: &PodRef, s: &[NetworkStatus]| {
            std::thread::sleep(a.slow);
            let (ns, name) = (&pod.namespace, &pod.name);
            a.tries.lock().unwrap().push((format!("{ns}/{name}"), pod.uid.clone(), Instant::now()));
            if a.rejected.lock().unwrap().contains(name) {
                return Err(K8sError::Refused("422 metadata.uid: field is immutable".into()));
            }
            if a.down.load(Ordering::SeqCst) || a.refused.lock().unwrap().contains(name) {
                return Err(K8sError::Unavailable("down".into()));
            }
            a.written.lock().unwrap().push((format!("{ns}/{name}"), s[0].ips[0].clone()));
            Ok(())
        });
        StatusWriter::new(patch, dir, Duration::from_millis(20)).unwrap()
    }

    fn api(down: bool, slow: Duration) -> Arc<Api> {
        Arc::new(Api {
            written: Mutex::default(),
            down: AtomicBool::new(down),
            slow,
            refused: Mutex::default(),
            rejected: Mutex::default(),
            tries: Mutex::default(),
        })
    }

    fn pod(name: &str) -> PodRef {
        PodRef { namespace: "default".into(), name: name.into(), uid: format!("uid-{name}") }
    }

    fn journal(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_status_is_journaled_before_submit_returns_and_leaves_the_journal_once_written() {
        let dir = tempfile::tempdir().unwrap();
        let a = api(false, Duration::from_millis(200));
        let w = writer(dir.path(), &a);
        w.submit(&pod("trainer"), &status("198.18.0.1")).unwrap();
        assert_eq!(journal(dir.path()), ["default_trainer"], "journaled before the answer");
        assert!(a.written.lock().unwrap().is_empty(), "the PATCH is not waited for");
        assert_eq!(w.flush(Duration::from_secs(5)), 0);
        assert_eq!(*a.written.lock().unwrap(), [("default/trainer".to_string(), "198.18.0.1".to_string())]);
        assert!(journal(dir.path()).is_empty());
    }

    #[test]
    fn the_newest_status_of_a_pod_wins_and_an_older_one_is_never_written_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let a = api(false, Duration::from_millis(50));
        let w = writer(dir.path(), &a);
        for i in 1..=5 {
            w.submit(&pod("trainer"), &status(&format!("198.18.0.{i}"))).unwrap();
        }
        w.submit(&pod("other"), &status("198.18.1.1")).unwrap();
        assert_eq!(w.flush(Duration::from_secs(5)), 0);
        let written = a.written.lock().unwrap().clone();
        let trainer: Vec<&str> =
            written.iter().filter(|(p, _)| p == "default/trainer").map(|(_, ip)| ip.as_str()).collect();
        assert_eq!(trainer.last(), Some(&"198.18.0.5"), "{written:?}");
        assert!(trainer.len() < 5, "waiting statuses are replaced, not queued: {written:?}");
        assert!(written.contains(&("default/other".to_string(), "198.18.1.1".to_string())));
        assert!(journal(dir.path()).is_empty());
    }

    #[test]
    fn a_status_the_api_does_not_take_stays_journaled_and_the_next_writer_replays_it() {
        let dir = tempfile::tempdir().unwrap();
        let down = api(true, Duration::ZERO);
        let w = writer(dir.path(), &down);
        w.submit(&pod("trainer"), &status("198.18.0.7")).unwrap();
        assert_eq!(w.flush(Duration::from_millis(100)), 1, "still pending while the API is down");
        assert_eq!(journal(dir.path()), ["default_trainer"]);
        // A leftover temp file of a write that was killed, and something that is not an entry.
        std::fs::write(dir.path().join(files::temp_name("default_x")), b"{").unwrap();
        std::fs::write(dir.path().join("default_y"), b"not json").unwrap();
        // The daemon restarts (a new writer on the same journal) with the API back.
        let up = api(false, Duration::ZERO);
        let next = writer(dir.path(), &up);
        assert_eq!(next.replay(), 1);
        assert_eq!(next.flush(Duration::from_secs(5)), 0);
        assert_eq!(*up.written.lock().unwrap(), [("default/trainer".to_string(), "198.18.0.7".to_string())]);
        assert_eq!(journal(dir.path()), ["default_y"], "only what is not an entry is left");
        down.down.store(false, Ordering::SeqCst);
    }

    #[test]
    fn pods_whose_status_the_api_does_not_take_hold_back_no_other_pod() {
        let dir = tempfile::tempdir().unwrap();
        let a = api(false, Duration::ZERO);
        *a.refused.lock().unwrap() = vec!["stuck-1".into(), "stuck-2".into(), "stuck-3".into()];
        let w = writer(dir.path(), &a);
        for name in ["stuck-1", "stuck-2", "stuck-3", "trainer"] {
            w.submit(&pod(name), &status("198.18.0.9")).unwrap();
        }
        // More refused pods than writers: each waits its retry in the queue, and the one the API
        // takes is written meanwhile.
        assert_eq!(w.flush(Duration::from_millis(500)), 3);
        assert_eq!(*a.written.lock().unwrap(), [("default/trainer".to_string(), "198.18.0.9".to_string())]);
        assert_eq!(journal(dir.path()), ["default_stuck-1", "default_stuck-2", "default_stuck-3"]);
        a.refused.lock().unwrap().clear();
        assert_eq!(w.flush(Duration::from_secs(5)), 0);
        assert!(journal(dir.path()).is_empty());
    }

    #[test]
    fn a_pod_reference_that_is_not_an_object_name_is_refused_before_any_file_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let w = writer(dir.path(), &api(false, Duration::ZERO));
        for (ns, name) in [("default", "../x"), ("a_b", "c"), ("default", ""), ("default", "Trainer"), ("..", "x")] {
            let pod = PodRef { namespace: ns.into(), name: name.into(), uid: String::new() };
            assert!(w.submit(&pod, &status("198.18.0.1")).is_err(), "{ns}/{name}");
        }
        assert!(journal(dir.path()).is_empty());
    }

    #[test]
    fn a_status_the_api_refuses_for_what_it_is_is_given_up_not_retried() {
        let dir = tempfile::tempdir().unwrap();
        let a = api(false, Duration::ZERO);
        *a.rejected.lock().unwrap() = vec!["trainer".into()];
        let w = writer(dir.path(), &a);
        w.submit(&pod("trainer"), &status("198.18.0.3")).unwrap();
        assert_eq!(w.flush(Duration::from_secs(5)), 0, "given up, not pending");
        assert!(journal(dir.path()).is_empty(), "not replayed by the next daemon either");
        std::thread::sleep(Duration::from_millis(200));
        let tries = a.tries.lock().unwrap().clone();
        assert_eq!(tries.len(), 1, "tried once: {tries:?}");
        assert_eq!(tries[0].1, "uid-trainer", "the PATCH names the pod's UID");
        assert!(a.written.lock().unwrap().is_empty());
    }

    #[test]
    fn while_the_api_is_down_the_tries_of_a_pod_come_further_and_further_apart() {
        let dir = tempfile::tempdir().unwrap();
        let a = api(true, Duration::ZERO);
        let w = writer(dir.path(), &a);
        w.submit(&pod("trainer"), &status("198.18.0.4")).unwrap();
        std::thread::sleep(Duration::from_millis(700));
        let tries: Vec<Instant> = a.tries.lock().unwrap().iter().map(|t| t.2).collect();
        // Waits of 20, 40, 80, 160, 320 ms: six tries in 700 ms (35 at a fixed 20 ms).
        assert!((3..=7).contains(&tries.len()), "{} tries", tries.len());
        for (i, pair) in tries.windows(2).enumerate() {
            let wait = Duration::from_millis(20) * (1 << i);
            assert!(
                pair[1] - pair[0] >= wait,
                "try {} came {:?} after the one before, not {wait:?}",
                i + 2,
                pair[1] - pair[0]
            );
        }
        a.down.store(false, Ordering::SeqCst);
        assert_eq!(w.flush(Duration::from_secs(5)), 0);
    }

    #[test]
    fn a_status_that_cannot_be_journaled_replaces_an_older_one_still_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let a = api(true, Duration::ZERO);
        let w = writer(dir.path(), &a);
        w.submit(&pod("trainer"), &status("198.18.0.1")).unwrap();
        assert_eq!(w.flush(Duration::from_millis(100)), 1);
        assert_eq!(journal(dir.path()), ["default_trainer"]);
        // The journal cannot take the next status: its temp file's name is taken.
        let blocker = files::temp_name("default_trainer");
        std::fs::create_dir(dir.path().join(&blocker)).unwrap();
        w.submit(&pod("trainer"), &status("198.18.0.2")).unwrap();
        assert_eq!(journal(dir.path()), [blocker], "the older entry is not left to be replayed");
        a.down.store(false, Ordering::SeqCst);
        assert_eq!(w.flush(Duration::from_secs(5)), 0);
        assert_eq!(*a.written.lock().unwrap(), [("default/trainer".to_string(), "198.18.0.2".to_string())]);
    }

    #[test]
    fn a_status_that_cannot_be_journaled_is_written_before_submit_returns() {
        let dir = tempfile::tempdir().unwrap();
        let a = api(false, Duration::from_millis(50));
        let w = writer(dir.path(), &a);
        std::fs::create_dir(dir.path().join(files::temp_name("default_trainer"))).unwrap();
        w.submit(&pod("trainer"), &status("198.18.0.5")).unwrap();
        assert_eq!(*a.written.lock().unwrap(), [("default/trainer".to_string(), "198.18.0.5".to_string())]);
        assert_eq!(w.pending(), 0);
        // A newer status then goes the journal's way again.
        std::fs::remove_dir(dir.path().join(files::temp_name("default_trainer"))).unwrap();
        w.submit(&pod("trainer"), &status("198.18.0.6")).unwrap();
        assert_eq!(journal(dir.path()), ["default_trainer"]);
        assert_eq!(w.flush(Duration::from_secs(5)), 0);
        assert_eq!(a.written.lock().unwrap().last().unwrap().1, "198.18.0.6");
    }

    #[test]
    fn a_pod_of_a_long_name_is_journaled_under_its_digest_and_replayed_with_its_uid() {
        let dir = tempfile::tempdir().unwrap();
        let long = "a".repeat(253);
        let down = api(true, Duration::ZERO);
        let w = writer(dir.path(), &down);
        w.submit(&pod(&long), &status("198.18.0.8")).unwrap();
        assert_eq!(w.flush(Duration::from_millis(100)), 1);
        let names = journal(dir.path());
        assert_eq!(names.len(), 1);
        assert!(names[0].starts_with('~') && names[0].len() == 65, "{names:?}");
        let up = api(false, Duration::ZERO);
        let next = writer(dir.path(), &up);
        assert_eq!(next.replay(), 1);
        assert_eq!(next.flush(Duration::from_secs(5)), 0);
        assert_eq!(*up.written.lock().unwrap(), [(format!("default/{long}"), "198.18.0.8".to_string())]);
        assert_eq!(up.tries.lock().unwrap()[0].1, format!("uid-{long}"));
        assert!(journal(dir.path()).is_empty());
        down.down.store(false, Ordering::SeqCst);
    }

    #[test]
    fn an_entry_journaled_without_a_uid_is_replayed_naming_none() {
        let dir = tempfile::tempdir().unwrap();
        let entry = serde_json::json!({"namespace": "default", "name": "trainer", "statuses": status("198.18.0.9")});
        std::fs::write(dir.path().join("default_trainer"), entry.to_string()).unwrap();
        let a = api(false, Duration::ZERO);
        let w = writer(dir.path(), &a);
        assert_eq!(w.replay(), 1);
        assert_eq!(w.flush(Duration::from_secs(5)), 0);
        assert_eq!(a.tries.lock().unwrap()[0].1, "");
        assert_eq!(*a.written.lock().unwrap(), [("default/trainer".to_string(), "198.18.0.9".to_string())]);
    }

    /// The journal entries of every format version kept as fixtures (`tests/formats/`).
    const V1: &str = include_str!("../tests/formats/status-journal-v1.json");
    /// What builds wrote before formats carried a version: read as version 1.
    const UNVERSIONED: &str = include_str!("../tests/formats/status-journal-unversioned.json");
    const V2: &str = include_str!("../tests/formats/status-journal-v2.json");

    #[test]
    fn this_build_journals_the_latest_format_as_its_fixture_holds_it_and_replays_every_earlier_one() {
        // A change to what an entry holds shows here: keep the old fixture (it must still be
        // replayed) and add the new one, with a new version if an older build would misread it.
        let dir = tempfile::tempdir().unwrap();
        let down = api(true, Duration::ZERO);
        let w = writer(dir.path(), &down);
        w.submit(&pod("trainer"), &status("198.18.0.7")).unwrap();
        assert_eq!(w.flush(Duration::from_millis(100)), 1);
        assert_eq!(std::fs::read_to_string(dir.path().join("default_trainer")).unwrap(), V1);
        down.down.store(false, Ordering::SeqCst);
        for fixture in [UNVERSIONED, V1] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("default_trainer"), fixture).unwrap();
            let up = api(false, Duration::ZERO);
            let w = writer(dir.path(), &up);
            assert_eq!(w.replay(), 1);
            assert_eq!(w.flush(Duration::from_secs(5)), 0);
            assert_eq!(*up.written.lock().unwrap(), [("default/trainer".to_string(), "198.18.0.7".to_string())]);
        }
    }

    #[test]
    fn a_journal_entry_of_a_later_format_is_not_replayed_and_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("default_trainer");
        std::fs::write(&file, V2).unwrap();
        let e = Entry::parse(V2.as_bytes(), &file).unwrap_err();
        assert_eq!(e.code, plexus_cni::code::FORMAT_TOO_NEW);
        assert!(e.msg.contains("network-status journal entry of format version 2"), "{e}");
        let up = api(false, Duration::ZERO);
        let w = writer(dir.path(), &up);
        assert_eq!(w.replay(), 0);
        assert!(up.tries.lock().unwrap().is_empty(), "nothing written from it");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), V2);
    }
}
