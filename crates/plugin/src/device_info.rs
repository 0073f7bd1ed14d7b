//! The device-info file a request names (`runtimeConfig.CNIDeviceInfoFile`, the device-info
//! spec): where an attaching plugin writes its device's document, and what DEL removes. The path
//! is the runtime's to give, but a NAD can carry its own `runtimeConfig`: only a file directly in
//! the node policy's device-info directory is ever written or removed.

use std::path::{Path, PathBuf};

use plexus_cni::Error;
use plexus_node::files;

use crate::Request;

impl Request {
    /// `runtimeConfig.CNIDeviceInfoFile` of this request: only a file directly in the node policy's
    /// device-info directory (`/var/run/k8s.cni.cncf.io/devinfo/cni/`, also spelled through `/run`).
    /// A NAD can carry its own `runtimeConfig`, so anything else would let a tenant choose a file
    /// root overwrites (ADD) or deletes (rollback, DEL).
    pub fn device_info_file(&self) -> Result<Option<PathBuf>, Error> {
        match self.config.runtime("CNIDeviceInfoFile").and_then(|v| v.as_str()) {
            Some(p) if !p.is_empty() => {
                let path = Path::new(p);
                if self.policy.device_info_file_allowed(path) {
                    return Ok(Some(path.to_path_buf()));
                }
                Err(Error::invalid_config(format!("runtimeConfig.CNIDeviceInfoFile {p:?} is refused")).with_details(
                    format!(
                        "only a file directly in the device-info directory {} (policy: {})",
                        self.policy.device_info_dir.display(),
                        self.policy.source
                    ),
                ))
            }
            _ => Ok(None),
        }
    }

    /// DEL: remove the request's device-info file, if it names one and it is there. A path the
    /// policy refuses is left alone (logged): DEL still succeeds.
    pub fn remove_device_info(&self) -> Result<(), Error> {
        match self.device_info_file() {
            Ok(Some(path)) => files::remove_if_present(&path),
            Ok(None) => Ok(()),
            Err(e) => {
                tracing::warn!("device-info file not removed: {e}");
                Ok(())
            }
        }
    }
}
