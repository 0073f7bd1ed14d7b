//! The delegate cache: `<cniDir>/<containerID>`, written losslessly before the first delegate
//! runs, so DEL and CHECK know exactly what was attached even when the API server is gone. Each
//! delegate's result is then appended as one JSON record (`{"attachment": i, "result": ...}`):
//! an append to a fresh file costs the file system far less than replacing it (no rename over an
//! existing file, no truncation), and a record torn by a crash is ignored on load — the delegate
//! is still known from the head and gets its DEL without prevResult. 0600 in a 0700 directory;
//! container IDs are validated by the entry point before they become a file name. The head
//! carries its format's version (`plexus_node::format::META_CACHE`): a cache of a later plexus
//! is refused, never read as something else nor rebuilt over.

use std::io::Write;
use std::path::{Path, PathBuf};

use plexus_cni::Error;
use plexus_node::files;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::attachment::Attachment;

pub const CACHE_VERSION: u32 = plexus_node::format::META_CACHE.current;

#[derive(Debug, Serialize, Deserialize)]
pub struct Cache {
    pub version: u32,
    #[serde(rename = "containerID")]
    pub container_id: String,
    #[serde(default)]
    pub netns: Option<PathBuf>,
    #[serde(default, rename = "podRef")]
    pub pod_ref: Option<String>,
    pub attachments: Vec<Attachment>,
}

pub fn path(cni_dir: &Path, container_id: &str) -> PathBuf {
    cni_dir.join(container_id)
}

/// One delegate's ADD result, appended after the head.
#[derive(Debug, Serialize, Deserialize)]
struct ResultRecord<V> {
    attachment: usize,
    result: V,
}

/// Writes the head: the whole cache, replacing any earlier one atomically.
pub fn save(path: &Path, cache: &Cache) -> Result<(), Error> {
    let bytes = serde_json::to_vec_pretty(cache).expect("json");
    files::replace_private(path, &bytes).map_err(|e| e.context("write delegate cache"))
}

/// The cache of a container's ADD in `cni_dir`, written before any of its delegates runs
/// ([`save`]), and where it is — unless a later plexus's cache of it is there: that one is neither
/// written over nor, by a rollback, removed (code 999).
pub fn create(cni_dir: &Path, cache: &Cache) -> Result<PathBuf, Error> {
    let path = path(cni_dir, &cache.container_id);
    if let Err(too_new @ Unusable::TooNew(_)) = load(&path) {
        return Err(too_new.error(&path, plexus_cni::code::INTERNAL));
    }
    save(&path, cache).map(|()| path)
}

/// Appends attachment `index`'s result to the cache [`save`] wrote.
pub fn record_result(path: &Path, index: usize, result: &Value) -> Result<(), Error> {
    let mut line = b"\n".to_vec();
    serde_json::to_writer(&mut line, &ResultRecord { attachment: index, result }).expect("json");
    line.push(b'\n');
    plexus_node::fault::at(plexus_node::fault::Point::FileWrite)?;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(&line))
        .map_err(|e| Error::io(format!("write delegate cache {}: {e}", path.display())))
}

/// `Ok(None)` when there is no cache; `Err` (with why) when it exists but its head does not
/// parse. Result records are applied in order; the first that does not parse ends the reading.
pub fn load(path: &Path) -> Result<Option<Cache>, Unusable> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Unusable::Unreadable(format!("{}: {e}", path.display()))),
    };
    let (cache, torn) = parse(&bytes).map_err(|e| match e {
        Unusable::Unreadable(why) => Unusable::Unreadable(format!("{}: {why}", path.display())),
        Unusable::TooNew(found) => Unusable::TooNew(found),
    })?;
    if torn {
        tracing::warn!("{}: a torn result record ignored", path.display());
    }
    Ok(Some(cache))
}

/// Why a cache file cannot be used.
#[derive(Debug)]
pub enum Unusable {
    /// It cannot be read or does not parse (a torn head, not a cache): DEL rebuilds the
    /// attachments instead (a cache that does not parse must not make DEL a no-op).
    Unreadable(String),
    /// A later plexus's format (the version found): refused and left as it is.
    TooNew(u32),
}

impl Unusable {
    /// The CNI error of a cache at `path` that cannot be used.
    pub fn error(&self, path: &Path, code: u32) -> Error {
        match self {
            Unusable::Unreadable(why) => Error::new(code, format!("delegate cache unreadable: {why}")),
            Unusable::TooNew(found) => {
                plexus_node::format::META_CACHE.check(&path.display().to_string(), *found).unwrap_err()
            }
        }
    }
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unusable::Unreadable(why) => f.write_str(why),
            Unusable::TooNew(found) => write!(f, "format version {found}, later than this build reads"),
        }
    }
}

/// A cache file's bytes: the head, then result records up to the first torn one (and whether
/// there was one). The head's version is checked before anything else is read from it.
pub fn parse(bytes: &[u8]) -> Result<(Cache, bool), Unusable> {
    let unreadable = |e: &dyn std::fmt::Display| Unusable::Unreadable(e.to_string());
    let mut values = serde_json::Deserializer::from_slice(bytes).into_iter::<Value>();
    let head = match values.next() {
        Some(Ok(v)) => v,
        Some(Err(e)) => return Err(unreadable(&e)),
        None => return Err(unreadable(&"empty")),
    };
    let version = plexus_node::format::version_of(&head);
    if !plexus_node::format::META_CACHE.reads(version) {
        return Err(Unusable::TooNew(version));
    }
    let mut cache: Cache = serde_json::from_value(head).map_err(|e| unreadable(&e))?;
    for value in values {
        let Some(record) = value.ok().and_then(|v| serde_json::from_value::<ResultRecord<Value>>(v).ok()) else {
            return Ok((cache, true));
        };
        if let Some(a) = cache.attachments.get_mut(record.attachment) {
            a.result = Some(record.result);
        }
    }
    Ok((cache, false))
}

/// Temp files a killed plexus left for container `container_id` (`.<containerID>.tmp<tid>`,
/// the atomic write of its cache): DEL removes them with the cache.
pub fn remove_leftovers(cni_dir: &Path, container_id: &str) {
    let Ok(entries) = std::fs::read_dir(cni_dir) else { return };
    let prefix = format!(".{container_id}.tmp");
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let tid = name.strip_prefix(&prefix).unwrap_or_default();
        if !tid.is_empty() && tid.bytes().all(|b| b.is_ascii_digit()) {
            let _ = files::remove_if_present(&e.path());
        }
    }
}

/// GC: temp files of any container older than `age` (no write takes that long).
pub fn remove_stale_leftovers(cni_dir: &Path, age: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(cni_dir) else { return };
    for e in entries.flatten() {
        let old =
            e.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok()).is_some_and(|a| a > age);
        if old && files::is_temp_name(&e.file_name().to_string_lossy()) {
            let _ = files::remove_if_present(&e.path());
        }
    }
}

/// Every cache in `cni_dir` (GC): those this build reads, and the container IDs (file names) of
/// those it cannot, which are logged and left alone.
pub fn all(cni_dir: &Path) -> (Vec<(PathBuf, Cache)>, Vec<String>) {
    let (mut read, mut unread) = (Vec::new(), Vec::new());
    let Ok(entries) = std::fs::read_dir(cni_dir) else { return (read, unread) };
    for e in entries.flatten().filter(|e| !e.file_name().to_string_lossy().starts_with('.')) {
        match load(&e.path()) {
            Ok(Some(c)) => read.push((e.path(), c)),
            Ok(None) => {}
            Err(why) => {
                tracing::warn!("GC leaves {} alone: {why}", e.path().display());
                unread.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    (read, unread)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attachment(network: &str) -> Attachment {
        serde_json::from_value(json!({"network": network, "ifname": "net1", "conf": {"type": "x"}})).unwrap()
    }

    fn saved(dir: &Path) -> PathBuf {
        let path = dir.join("c1");
        let cache = Cache {
            version: CACHE_VERSION,
            container_id: "c1".into(),
            netns: None,
            pod_ref: None,
            attachments: vec![attachment("a"), attachment("b")],
        };
        save(&path, &cache).unwrap();
        path
    }

    #[test]
    fn appended_results_are_read_back_onto_their_attachments() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved(dir.path());
        record_result(&path, 1, &json!({"cniVersion": "1.0.0", "ips": []})).unwrap();
        record_result(&path, 0, &json!({"cniVersion": "1.0.0"})).unwrap();
        let cache = load(&path).unwrap().unwrap();
        assert_eq!(cache.attachments[0].result, Some(json!({"cniVersion": "1.0.0"})));
        assert_eq!(cache.attachments[1].result, Some(json!({"cniVersion": "1.0.0", "ips": []})));
    }

    #[test]
    fn a_torn_last_record_is_ignored_and_the_attachments_are_still_known() {
        let dir = tempfile::tempdir().unwrap();
        let path = saved(dir.path());
        record_result(&path, 0, &json!({"cniVersion": "1.0.0"})).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(br#"{"attachment": 1, "resu"#).unwrap();
        let cache = load(&path).unwrap().unwrap();
        assert_eq!(cache.attachments.len(), 2);
        assert_eq!(cache.attachments[0].result, Some(json!({"cniVersion": "1.0.0"})));
        assert_eq!(cache.attachments[1].result, None);
    }

    #[test]
    fn a_corrupt_head_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c1");
        std::fs::write(&path, b"{\"version\": 1, \"contain").unwrap();
        assert!(load(&path).unwrap_err().to_string().contains("c1"));
        assert!(load(&dir.path().join("none")).unwrap().is_none());
    }

    #[test]
    fn leftovers_of_one_container_go_and_no_other_file() {
        let dir = tempfile::tempdir().unwrap();
        for name in [".c1.tmp42", ".c1.tmp7", "c1", ".c1.tmp5.tmp9", ".c2.tmp42", ".c1.tmpx"] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        remove_leftovers(dir.path(), "c1");
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".c1.tmp5.tmp9", ".c1.tmpx", ".c2.tmp42", "c1"]);
        remove_stale_leftovers(dir.path(), std::time::Duration::ZERO);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".c1.tmpx", "c1"], "every temp name, no cache");
    }

    /// The caches of every format version kept as fixtures (`tests/formats/`).
    const V1: &[u8] = include_bytes!("../tests/formats/meta-cache-v1.json");
    const V2: &[u8] = include_bytes!("../tests/formats/meta-cache-v2.json");

    #[test]
    fn a_cache_of_every_version_this_build_knows_is_read_as_written() {
        let (c, torn) = parse(V1).unwrap();
        assert!(!torn);
        assert_eq!((c.version, c.container_id.as_str(), c.pod_ref.as_deref()), (1, "c1", Some("default/trainer")));
        let names: Vec<(&str, &str, bool)> =
            c.attachments.iter().map(|a| (a.network.as_str(), a.ifname.as_str(), a.cluster_network)).collect();
        assert_eq!(names, [("bootstrap", "eth0", true), ("default/rail0", "net1", false)]);
        let rail = &c.attachments[1];
        assert_eq!(rail.result.as_ref().unwrap()["ips"][0]["address"], "198.18.0.2/24");
        assert_eq!((rail.device_id.as_deref(), rail.cni_args.len()), (Some("0000:3b:00.0"), 1));
    }

    #[test]
    fn this_build_writes_the_latest_format_as_its_fixture_holds_it() {
        // A change to what a cache holds shows here: keep the old fixture (it must still be read)
        // and add the new one, with a new version if an older build would misread it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c1");
        let (c, _) = parse(V1).unwrap();
        let results: Vec<Value> = c.attachments.iter().map(|a| a.result.clone().unwrap()).collect();
        let head =
            Cache { attachments: c.attachments.into_iter().map(|a| Attachment { result: None, ..a }).collect(), ..c };
        save(&path, &head).unwrap();
        for (i, r) in results.iter().enumerate() {
            record_result(&path, i, r).unwrap();
        }
        assert_eq!(String::from_utf8(std::fs::read(&path).unwrap()).unwrap(), String::from_utf8(V1.to_vec()).unwrap());
    }

    #[test]
    fn a_cache_of_a_later_format_is_refused_naming_the_file_and_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c1");
        std::fs::write(&path, V2).unwrap();
        let why = load(&path).unwrap_err();
        assert!(matches!(why, Unusable::TooNew(2)), "{why}");
        let e = why.error(&path, plexus_cni::code::CHECK_FAILED);
        assert_eq!(e.code, plexus_cni::code::FORMAT_TOO_NEW);
        assert!(
            e.msg.starts_with(&format!("{}: the meta-plugin's delegate cache of format version 2", path.display())),
            "{e}"
        );
        let (read, unread) = all(dir.path());
        assert!(read.is_empty(), "GC reads no cache it cannot");
        assert_eq!(unread, ["c1"], "and says which");
        assert!(path.exists());
        // A version that is not a number no plexus wrote: refused too, not taken for the first.
        let odd = String::from_utf8(V1.to_vec()).unwrap().replacen("\"version\": 1,", "\"version\": \"1\",", 1);
        assert!(matches!(parse(odd.as_bytes()), Err(Unusable::TooNew(u32::MAX))));
    }
}
