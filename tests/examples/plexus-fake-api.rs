//! The tests' fake Kubernetes API server as a process, for benchmarks:
//!
//!   plexus-fake-api NETNS_PATH KUBECONFIG_OUT [--pod ns/name/uid/networks-annotation]... [--nad ns/name=config.json]...
//!
//! Serves on the loopback of the namespace, writes a kubeconfig for it, prints "ready", and runs
//! until its standard input closes.

use std::io::Read;
use std::path::Path;

use plexus_tests::fake_api::FakeApi;
use serde_json::json;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    assert!(args.len() >= 2, "usage: plexus-fake-api NETNS_PATH KUBECONFIG_OUT [--pod ...] [--nad ...]");
    let api = FakeApi::start_at(Path::new(&args[0]));
    api.write_kubeconfig(Path::new(&args[1]), false);
    let mut rest = args[2..].iter();
    while let Some(flag) = rest.next() {
        let value = rest.next().expect("flag value");
        match flag.as_str() {
            "--pod" => {
                let parts: Vec<&str> = value.splitn(4, '/').collect();
                api.add_pod(parts[0], parts[1], parts[2], json!({"k8s.v1.cni.cncf.io/networks": parts[3]}));
            }
            "--nad" => {
                let (ns_name, file) = value.split_once('=').expect("ns/name=file");
                let (ns, name) = ns_name.split_once('/').expect("ns/name");
                let conf: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(file).expect("read nad config")).expect("json");
                api.add_nad(ns, name, &conf, json!({}));
            }
            other => panic!("unknown flag {other}"),
        }
    }
    println!("ready");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}
