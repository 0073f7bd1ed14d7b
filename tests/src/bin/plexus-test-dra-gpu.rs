//! A stand-in GPU DRA driver for the real-node DRA tests: it registers `gpu.example.com` with the
//! kubelet (its plugin registration and DRA service, plexus's own kubelet-plugin code) and prepares
//! every claim with no CDI device — the GPUs are only ResourceSlice devices the test publishes,
//! with the PCIe roots the RoCE ports are matched against. Runs until SIGTERM.
//!
//!   plexus-test-dra-gpu KUBELET_DIR

use std::sync::Arc;

use plexus_dra::kubelet::{Claim, Device, Driver, Sockets, serve};

struct Gpus;

impl Driver for Gpus {
    fn prepare(&self, claim: &Claim) -> Result<Vec<Device>, String> {
        eprintln!("prepare {}/{} {}", claim.namespace, claim.name, claim.uid);
        Ok(Vec::new())
    }
    fn unprepare(&self, claim: &Claim) -> Result<(), String> {
        eprintln!("unprepare {}/{} {}", claim.namespace, claim.name, claim.uid);
        Ok(())
    }
}

fn main() {
    let kubelet_dir = std::env::args().nth(1).expect("usage: plexus-test-dra-gpu KUBELET_DIR");
    let sockets = Sockets::under(std::path::Path::new(&kubelet_dir), "gpu.example.com");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
        let stop = async move {
            term.recv().await;
        };
        serve("gpu.example.com".into(), sockets, Arc::new(Gpus), stop).await.expect("serve");
    });
}
