//! The delegate cache: `<cniDir>/<containerID>`, written losslessly before the first delegate
//! runs and after each one succeeds, so DEL and CHECK know exactly what was attached even when
//! the API server is gone. 0600 in a 0700 directory; container IDs are validated by the entry
//! point before they become a file name.

use std::path::{Path, PathBuf};

use plexus_cni::{Error, files};
use serde::{Deserialize, Serialize};

use crate::attachment::Attachment;

pub const CACHE_VERSION: u32 = 1;

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

pub fn save(path: &Path, cache: &Cache) -> Result<(), Error> {
    let bytes = serde_json::to_vec_pretty(cache).expect("json");
    files::replace_private(path, &bytes).map_err(|e| e.context("write delegate cache"))
}

/// `Ok(None)` when there is no cache; `Err` (with why) when it exists but does not parse.
pub fn load(path: &Path) -> Result<Option<Cache>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Every cache in `cni_dir` (GC).
pub fn all(cni_dir: &Path) -> Vec<(PathBuf, Cache)> {
    let Ok(entries) = std::fs::read_dir(cni_dir) else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| Some((e.path(), load(&e.path()).ok()??)))
        .collect()
}
