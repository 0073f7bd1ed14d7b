//! The kubeconfig plexus reads on the node, made from the pod's service account: the API server's
//! address and CA inline, the token as a file beside it (`tokenFile`), which plexus re-reads on
//! every invocation and plexus-daemon's client reloads. Bound service-account tokens expire (an
//! hour by default, Multus #852): [`refresh`] copies a rotated token and CA within one period.

use std::fs;
use std::path::{Path, PathBuf};

use base64::Engine;

use crate::InstallError;
use crate::node::{Layout, ensure_dir, place};

/// The files in the credentials directory.
pub const FILES: &[&str] = &[KUBECONFIG, TOKEN];
pub const KUBECONFIG: &str = "plexus.kubeconfig";
pub const TOKEN: &str = "token";

/// Where the credentials come from.
#[derive(Clone, Debug)]
pub struct Source {
    /// The service account's mount (`/var/run/secrets/kubernetes.io/serviceaccount`).
    pub service_account: PathBuf,
    /// `https://host:port` of the API server.
    pub server: String,
}

impl Source {
    /// The server from `KUBERNETES_SERVICE_HOST`/`_PORT` as the kubelet sets them in a pod (an
    /// IPv6 host in brackets).
    pub fn in_cluster(service_account: PathBuf, host: &str, port: &str) -> Result<Source, InstallError> {
        if host.is_empty() || port.is_empty() {
            return Err(InstallError::Invalid(
                "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: not in a pod?".into(),
            ));
        }
        let host = if host.contains(':') { format!("[{host}]") } else { host.to_string() };
        Ok(Source { service_account, server: format!("https://{host}:{port}") })
    }
}

/// The kubeconfig (JSON, which every YAML reader takes) naming `token_file` as a host path.
pub fn kubeconfig(server: &str, ca_pem: &[u8], token_file: &Path) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(&document(server, ca_pem, serde_json::json!({"tokenFile": token_file})))
        .expect("json");
    bytes.push(b'\n');
    bytes
}

fn document(server: &str, ca_pem: &[u8], user: serde_json::Value) -> serde_json::Value {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "plexus", "user": user}],
        "contexts": [{"name": "plexus", "context": {"cluster": "local", "user": "plexus"}}],
        "current-context": "plexus",
    })
}

impl Source {
    /// A client for this pod's own calls, from the service account as it is now (the kubeconfig
    /// stays in memory: the token is never written beyond the node's token file).
    pub fn client(&self, timeout: std::time::Duration) -> Result<plexus_k8s::api::ApiClient, InstallError> {
        let read = |f: &str| {
            let p = self.service_account.join(f);
            fs::read(&p).map_err(InstallError::io("read", p))
        };
        let token = String::from_utf8_lossy(&read("token")?).trim().to_string();
        let doc = document(&self.server, &read("ca.crt")?, serde_json::json!({"token": token}));
        plexus_k8s::api::ApiClient::from_kubeconfig_text(&doc.to_string(), timeout)
            .map_err(|e| InstallError::Invalid(e.to_string()))
    }
}

/// Write the token and the kubeconfig (0600 in a 0700 directory) where they differ from the
/// service account's. Returns whether anything was written. Never prints the token.
pub fn refresh(layout: &Layout, source: &Source) -> Result<bool, InstallError> {
    let token_src = source.service_account.join("token");
    let ca_src = source.service_account.join("ca.crt");
    let token = fs::read(&token_src).map_err(InstallError::io("read", &token_src))?;
    let ca = fs::read(&ca_src).map_err(InstallError::io("read", &ca_src))?;
    if token.trim_ascii().is_empty() {
        return Err(InstallError::Invalid(format!("{} is empty", token_src.display())));
    }
    let dir = layout.credentials_dir();
    let on_host = layout.on_host(&dir);
    ensure_dir(&on_host, 0o700)?;
    let token_changed = place(&token, &on_host.join(TOKEN), 0o600)?;
    let config = kubeconfig(&source.server, &ca, &dir.join(TOKEN));
    let config_changed = place(&config, &on_host.join(KUBECONFIG), 0o600)?;
    Ok(token_changed || config_changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn setup(t: &Path) -> (Layout, Source) {
        let sa = t.join("sa");
        fs::create_dir_all(&sa).unwrap();
        fs::write(sa.join("token"), "first-token").unwrap();
        fs::write(sa.join("ca.crt"), "-----BEGIN CERTIFICATE-----\n").unwrap();
        let layout = Layout::new(
            t.join("host"),
            "/opt/cni/bin".into(),
            "/etc/cni/net.d".into(),
            "/etc/cni/plexus/policy.json".into(),
        )
        .unwrap();
        (layout, Source::in_cluster(sa, "fd00::1", "6443").unwrap())
    }

    #[test]
    fn the_kubeconfig_names_the_token_file_by_its_host_path_and_is_private() {
        let t = tempfile::tempdir().unwrap();
        let (layout, source) = setup(t.path());
        assert!(refresh(&layout, &source).unwrap());
        let dir = t.path().join("host/etc/cni/net.d/plexus.d");
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        for f in FILES {
            assert_eq!(fs::metadata(dir.join(f)).unwrap().mode() & 0o777, 0o600, "{f}");
        }
        let config: serde_json::Value = serde_json::from_slice(&fs::read(dir.join(KUBECONFIG)).unwrap()).unwrap();
        assert_eq!(config["users"][0]["user"]["tokenFile"], "/etc/cni/net.d/plexus.d/token");
        assert_eq!(config["clusters"][0]["cluster"]["server"], "https://[fd00::1]:6443");
        assert!(!String::from_utf8_lossy(&fs::read(dir.join(KUBECONFIG)).unwrap()).contains("first-token"));
        assert_eq!(fs::read(dir.join(TOKEN)).unwrap(), b"first-token");
    }

    #[test]
    fn a_rotated_token_is_copied_and_an_unchanged_one_writes_nothing() {
        let t = tempfile::tempdir().unwrap();
        let (layout, source) = setup(t.path());
        refresh(&layout, &source).unwrap();
        assert!(!refresh(&layout, &source).unwrap());
        fs::write(t.path().join("sa/token"), "second-token").unwrap();
        assert!(refresh(&layout, &source).unwrap());
        assert_eq!(fs::read(t.path().join("host/etc/cni/net.d/plexus.d/token")).unwrap(), b"second-token");
    }

    #[test]
    fn an_empty_token_or_no_service_host_is_an_error_and_writes_nothing() {
        let t = tempfile::tempdir().unwrap();
        let (layout, source) = setup(t.path());
        fs::write(t.path().join("sa/token"), "\n").unwrap();
        assert!(refresh(&layout, &source).unwrap_err().to_string().contains("is empty"));
        assert!(!t.path().join("host/etc/cni/net.d/plexus.d/token").exists());
        assert!(Source::in_cluster(t.path().into(), "", "443").is_err());
    }
}
