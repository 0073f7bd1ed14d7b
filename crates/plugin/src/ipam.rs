//! An attaching plugin's IPAM delegation (plexus-macvlan, plexus-host-device): the IPAM ADD started
//! beside link creation and collected when the link is ready, its rollback, and the other verbs
//! forwarded as the spec wants. Each runs as the request's [`crate::builtin::Runner`] says.

use plexus_cni::env::{CniEnv, Command};
use plexus_cni::error::Error;
use plexus_cni::result::CniResult;

use crate::delegate::Running;

/// Forward `command` to the config's IPAM plugin, if it names one (the spec: CHECK, DEL, GC and
/// STATUS go to the delegates too).
pub fn forward_to_ipam(req: &crate::Request, command: Command) -> Result<(), Error> {
    match req.config.ipam_type() {
        Some(ipam) => req.runner.exec(ipam, command, &req.env, &req.config.to_value()).map(|_| ()),
        None => Ok(()),
    }
}

/// DEL of an attaching plugin: the IPAM DEL always runs, alongside `teardown` (the interface's
/// removal); an IPAM plugin that talks on the interface (`dhcp` releases its lease through it)
/// runs to completion before it instead. `teardown`'s error is reported first, the IPAM's after.
pub fn del_with_ipam(req: &crate::Request, teardown: impl FnOnce() -> Result<(), Error>) -> Result<(), Error> {
    let config = req.config.to_value();
    let ipam = match req.config.ipam_type() {
        None => Ok(None),
        Some(t) if IPAM_NEEDING_THE_INTERFACE.contains(&t) => {
            req.runner.exec(t, Command::Del, &req.env, &config).map(|_| None)
        }
        Some(t) => req.runner.spawn(t, Command::Del, &req.env, &config).map(Some),
    };
    let torn_down = teardown();
    let ipam = ipam.and_then(|running| running.map_or(Ok(()), |r| r.wait().map(|_| ())));
    torn_down.and(ipam)
}

/// The IPAM step of an attaching plugin. IPAM plugins that do not touch the interface run
/// concurrently with link creation (started early, collected when the link is ready); `dhcp`
/// talks on the interface, so it starts only when the link has its final name.
#[derive(Debug)]
pub enum IpamStep {
    /// No `ipam` section (L2 only).
    None,
    /// Not started yet (`dhcp`, or not yet begun).
    Pending(String),
    /// Started, outcome not collected.
    Running(Running),
    /// ADD was run (successfully or not): a rollback must DEL.
    Ran,
}

/// `env` with a deadline that leaves time for undoing what is run with it.
fn keeping_for_undo(env: &CniEnv) -> CniEnv {
    CniEnv { deadline: env.deadline.keeping_for_undo(), ..env.clone() }
}

/// IPAM types that need the interface to exist under `CNI_IFNAME` when they run.
const IPAM_NEEDING_THE_INTERFACE: &[&str] = &["dhcp"];

impl IpamStep {
    /// Start the IPAM ADD now when it can run ahead of the interface. It is given the
    /// request's deadline less the time its undo (an IPAM DEL) keeps back.
    pub fn start_early(req: &crate::Request) -> Result<IpamStep, Error> {
        let config = &req.config;
        match config.ipam_type() {
            None => Ok(IpamStep::None),
            Some(t) if IPAM_NEEDING_THE_INTERFACE.contains(&t) => Ok(IpamStep::Pending(t.to_string())),
            Some(t) => Ok(IpamStep::Running(req.runner.spawn(
                t,
                Command::Add,
                &keeping_for_undo(&req.env),
                &config.to_value(),
            )?)),
        }
    }

    /// The IPAM result (empty for L2 only), running the ADD now if it has not started.
    pub fn result(&mut self, req: &crate::Request) -> Result<CniResult, Error> {
        let outcome = match std::mem::replace(self, IpamStep::Ran) {
            IpamStep::None => {
                *self = IpamStep::None;
                return Ok(CniResult::default());
            }
            IpamStep::Pending(t) => {
                req.runner.exec(&t, Command::Add, &keeping_for_undo(&req.env), &req.config.to_value())
            }
            IpamStep::Running(r) => r.wait(),
            IpamStep::Ran => return Err(Error::internal("IPAM result collected twice")),
        };
        outcome.map(Option::unwrap_or_default)
    }

    /// Undo: wait for an ADD still running, then DEL if an ADD ran.
    pub fn roll_back(self, req: &crate::Request) -> Result<(), Error> {
        let ran = match self {
            IpamStep::None | IpamStep::Pending(_) => false,
            IpamStep::Running(r) => {
                // Its outcome does not matter: whatever it took is released below.
                let _ = r.wait();
                true
            }
            IpamStep::Ran => true,
        };
        match req.config.ipam_type() {
            Some(t) if ran => {
                let del_env = CniEnv { command: Command::Del, ..req.env.clone() };
                req.runner
                    .exec(t, Command::Del, &del_env, &req.config.to_value())
                    .map(|_| ())
                    .map_err(|e| e.context("IPAM DEL"))
            }
            _ => Ok(()),
        }
    }
}
