//! The kubelet plugin's sockets answered as the kubelet calls them: a gRPC client on the unix
//! sockets, with the kubelet's method paths and messages.

use std::sync::Mutex;

use super::client::call;
use super::*;

/// Prepares claims named `ok-*` with one device, refuses the others; records every call.
#[derive(Default)]
struct Recording {
    calls: Mutex<Vec<String>>,
}

impl Driver for Recording {
    fn prepare(&self, claim: &Claim) -> Result<Vec<Device>, String> {
        self.calls.lock().unwrap().push(format!("prepare {}", claim.uid));
        match claim.name.starts_with("ok-") {
            true => Ok(vec![Device {
                request_names: vec!["nic".into()],
                pool_name: "node-1".into(),
                device_name: "rail0".into(),
                cdi_device_ids: vec![format!("plexus.dev/rdma={}-rail0", claim.uid)],
            }]),
            false => Err(format!("device rail9 of claim {} is not on this node", claim.name)),
        }
    }
    fn unprepare(&self, claim: &Claim) -> Result<(), String> {
        self.calls.lock().unwrap().push(format!("unprepare {}", claim.uid));
        Ok(())
    }
}

fn claim(name: &str, uid: &str) -> Claim {
    Claim { namespace: "team-a".into(), name: name.into(), uid: uid.into() }
}

#[test]
fn the_kubelet_registers_the_plugin_and_prepares_and_unprepares_claims_on_both_api_versions() {
    let dir = tempfile::tempdir().unwrap();
    let sockets = Sockets::under(dir.path(), "plexus.dev");
    let driver = Arc::new(Recording::default());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve("plexus.dev".into(), sockets.clone(), driver.clone(), async {
            let _ = stopped.await;
        }));
        let reg = sockets.registration("plexus.dev");
        for _ in 0..200 {
            if reg.exists() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&reg).unwrap().permissions().mode() & 0o777, 0o600);

        let info: PluginInfo = call(&reg, GET_INFO, InfoRequest {}).await.unwrap();
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "plexus.dev");
        assert_eq!(info.endpoint, dir.path().join("plugins/plexus.dev/dra.sock").display().to_string());
        assert_eq!(info.supported_versions, ["v1.DRAPlugin", "v1beta1.DRAPlugin"]);
        let _: RegistrationStatusResponse =
            call(&reg, NOTIFY, RegistrationStatus { plugin_registered: true, error: String::new() }).await.unwrap();
        let refused: Result<RegistrationStatusResponse, _> =
            call(&reg, NOTIFY, RegistrationStatus { plugin_registered: false, error: "version".into() }).await;
        assert_eq!(refused.unwrap_err().message(), "version");

        let dra = std::path::PathBuf::from(&info.endpoint);
        let req = NodePrepareResourcesRequest { claims: vec![claim("ok-a", "u-1"), claim("bad-b", "u-2")] };
        for path in [PREPARE_V1, PREPARE_V1BETA1] {
            let answer: NodePrepareResourcesResponse = call(&dra, path, req.clone()).await.unwrap();
            assert_eq!(answer.claims.len(), 2, "every claim has an answer");
            let ok = &answer.claims["u-1"];
            assert!(ok.error.is_empty());
            assert_eq!(ok.devices[0].cdi_device_ids, ["plexus.dev/rdma=u-1-rail0"]);
            assert_eq!(ok.devices[0].pool_name, "node-1");
            assert!(answer.claims["u-2"].error.contains("rail9"), "{:?}", answer.claims["u-2"]);
            assert!(answer.claims["u-2"].devices.is_empty());
        }
        for path in [UNPREPARE_V1, UNPREPARE_V1BETA1] {
            let answer: NodeUnprepareResourcesResponse =
                call(&dra, path, NodeUnprepareResourcesRequest { claims: vec![claim("ok-a", "u-1")] }).await.unwrap();
            assert!(answer.claims["u-1"].error.is_empty());
        }
        let unknown: Result<InfoRequest, _> =
            call(&dra, "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/Other", InfoRequest {}).await;
        assert_eq!(unknown.unwrap_err().code(), tonic::Code::Unimplemented);

        let _ = stop.send(());
        server.await.unwrap().unwrap();
    });
    assert!(!sockets.dra().exists() && !sockets.registration("plexus.dev").exists(), "sockets left behind");
    let calls = driver.calls.lock().unwrap().clone();
    assert_eq!(calls, ["prepare u-1", "prepare u-2", "prepare u-1", "prepare u-2", "unprepare u-1", "unprepare u-1"]);
}

#[test]
fn a_stale_socket_is_replaced_and_anything_else_at_its_path_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        assert!(listen(&path).is_ok(), "a stale socket was not replaced");
        let file = dir.path().join("file");
        std::fs::write(&file, b"keep").unwrap();
        let e = listen(&file).unwrap_err().to_string();
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    });
}
