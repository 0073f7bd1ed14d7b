//! A minimal plugin on the plexus entry point, for testing `plexus-plugin` as a process: ADD reports
//! an interface named `CNI_IFNAME` in `CNI_NETNS` plus whatever its IPAM delegate returns; every
//! other verb is forwarded to the IPAM delegate. It changes no kernel state.
//!
//! Test-only keys: `gcRecord` (a file GC writes the valid attachments it received into) and
//! `panicOn` (a verb on which it panics, to test that a panic still yields one CNI error).

use std::process::ExitCode;

use plexus_cni::{CniResult, Command, Error, Interface};
use plexus_plugin::{About, Plugin, Request};

struct TestPlugin;

impl TestPlugin {
    fn maybe_panic(&self, req: &Request) {
        if req.config.extra.get("panicOn").and_then(|v| v.as_str()) == Some(req.env.command.as_str()) {
            panic!("asked to panic on {}", req.env.command);
        }
    }

    fn forward(&self, req: &Request) -> Result<Option<CniResult>, Error> {
        match req.config.ipam_type() {
            Some(ipam) => req.runner.exec(ipam, req.env.command, &req.env, &req.config.to_value()),
            None => Ok(None),
        }
    }
}

impl Plugin for TestPlugin {
    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        self.maybe_panic(req);
        tracing::debug!("adding");
        let mut result = self.forward(req)?.unwrap_or_default();
        result.interfaces = vec![Interface {
            name: req.env.ifname.clone(),
            sandbox: req.netns().map(|p| p.display().to_string()),
            ..Default::default()
        }];
        for ip in &mut result.ips {
            ip.interface = Some(0);
        }
        if let Some(dns) = &req.config.dns {
            result.dns = dns.clone();
        }
        Ok(result)
    }

    fn del(&self, req: &Request) -> Result<(), Error> {
        self.maybe_panic(req);
        self.forward(req).map(|_| ())
    }

    fn check(&self, req: &Request) -> Result<(), Error> {
        self.forward(req).map(|_| ())
    }

    fn gc(&self, req: &Request) -> Result<(), Error> {
        if let Some(path) = req.config.extra.get("gcRecord").and_then(|v| v.as_str()) {
            let seen = serde_json::to_vec(&req.valid_attachments()?).unwrap();
            std::fs::write(path, seen).map_err(|e| Error::io(format!("gcRecord {path}: {e}")))?;
        }
        debug_assert_eq!(req.env.command, Command::Gc);
        self.forward(req).map(|_| ())
    }

    fn status(&self, req: &Request) -> Result<(), Error> {
        self.forward(req).map(|_| ())
    }
}

fn main() -> ExitCode {
    plexus_plugin::run(
        About { name: "plexus-test-plugin", version: env!("CARGO_PKG_VERSION"), build: None },
        &TestPlugin,
    )
}
