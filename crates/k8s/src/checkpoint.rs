//! The kubelet device-plugin checkpoint (`/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint`):
//! which device IDs the kubelet gave a pod, per resource. `DeviceIDs` is a list in old kubelets
//! and a map NUMA node → list since Kubernetes 1.20/1.21 (Multus #665/#778): both are read.

use std::path::Path;

use serde_json::Value;

use crate::error::K8sError;

/// The kubelet's default checkpoint path.
pub const DEFAULT_CHECKPOINT: &str = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";

/// The device IDs allocated to pod `pod_uid` for `resource`, sorted (Multus #367: one order,
/// so attachment N always gets the Nth device).
pub fn device_ids(path: &Path, pod_uid: &str, resource: &str) -> Result<Vec<String>, K8sError> {
    let text = std::fs::read(path).map_err(|e| K8sError::Io(format!("kubelet checkpoint {}: {e}", path.display())))?;
    parse_device_ids(&text, pod_uid, resource)
        .map_err(|e| K8sError::Io(format!("kubelet checkpoint {}: {e}", path.display())))
}

/// [`device_ids`] of a checkpoint's bytes.
pub fn parse_device_ids(bytes: &[u8], pod_uid: &str, resource: &str) -> Result<Vec<String>, serde_json::Error> {
    let doc: Value = serde_json::from_slice(bytes)?;
    let entries = doc.pointer("/Data/PodDeviceEntries").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut ids: Vec<String> = Vec::new();
    for e in entries {
        if e.get("PodUID").and_then(Value::as_str) != Some(pod_uid)
            || e.get("ResourceName").and_then(Value::as_str) != Some(resource)
        {
            continue;
        }
        match e.get("DeviceIDs") {
            Some(Value::Array(list)) => ids.extend(list.iter().filter_map(Value::as_str).map(String::from)),
            Some(Value::Object(by_numa)) => {
                for list in by_numa.values().filter_map(Value::as_array) {
                    ids.extend(list.iter().filter_map(Value::as_str).map(String::from));
                }
            }
            _ => {}
        }
    }
    ids.sort();
    ids.dedup();
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_checkpoint_shapes_yield_sorted_ids_of_the_pod_and_resource() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cp");
        std::fs::write(
            &p,
            r#"{"Data":{"PodDeviceEntries":[
              {"PodUID":"u1","ContainerName":"c","ResourceName":"nvidia.com/hostdev","DeviceIDs":{"1":["0000:d8:00.2"],"0":["0000:3b:00.3","0000:3b:00.2"]},"AllocResp":""},
              {"PodUID":"u1","ContainerName":"d","ResourceName":"nvidia.com/other","DeviceIDs":["x"],"AllocResp":""},
              {"PodUID":"u2","ContainerName":"c","ResourceName":"nvidia.com/hostdev","DeviceIDs":["0000:5e:00.2"],"AllocResp":""}],
              "RegisteredDevices":{}},"Checksum":1}"#,
        )
        .unwrap();
        assert_eq!(
            device_ids(&p, "u1", "nvidia.com/hostdev").unwrap(),
            ["0000:3b:00.2", "0000:3b:00.3", "0000:d8:00.2"]
        );
        assert_eq!(device_ids(&p, "u2", "nvidia.com/hostdev").unwrap(), ["0000:5e:00.2"]);
        assert!(device_ids(&p, "u3", "nvidia.com/hostdev").unwrap().is_empty());
    }
}
