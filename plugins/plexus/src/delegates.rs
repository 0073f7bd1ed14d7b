//! How the meta-plugin runs an attachment's delegate: the seam between the meta-plugin's steps
//! (order, parallel groups, cache, rollback) and the delegates themselves. [`Chains`] runs an
//! attachment's chain of plugins (`plexus_plugin::chain`: each plugin exec'd, or run in-process when
//! plexus-daemon carries it) and tells an [`Observer`] how each call went; the unit tests
//! (`tests.rs`) put a recording fake in its place, so the steps are tested without root.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use plexus_cni::{CniResult, Command, Error};
use serde_json::Value;

use crate::attachment::{Attachment, DelegateEnv};

/// Runs an attachment's delegate.
pub(crate) trait Delegates: Send + Sync {
    /// ADD: the final result, and as the delegate printed it (for the cache).
    fn add(&self, a: &Attachment, env: &DelegateEnv) -> Result<(CniResult, Value), Error>;
    fn del(&self, a: &Attachment, env: &DelegateEnv) -> Result<(), Error>;
    fn check(&self, a: &Attachment, env: &DelegateEnv) -> Result<(), Error>;
}

/// Told of every delegate call (the daemon's metrics and spans).
pub trait Observer: Send + Sync {
    fn delegate(&self, call: &DelegateCall<'_>);
}

/// One delegate call, as an [`Observer`] is told of it when it has ended.
pub struct DelegateCall<'a> {
    pub command: Command,
    /// The network (`namespace/nad`, or the conf's own name).
    pub network: &'a str,
    /// The network's first plugin, or [`UNKNOWN_TYPE`].
    pub delegate_type: &'a str,
    pub started: SystemTime,
    pub took: Duration,
    /// The error when it failed.
    pub error: Option<&'a Error>,
    /// The `TRACEPARENT` the delegate was handed, when it was handed one.
    pub traceparent: Option<&'a str>,
}

/// The delegate type an observer is told for a type that names no installed plugin.
pub const UNKNOWN_TYPE: &str = "(not installed)";

/// The delegates as they are: each attachment's chain of plugins, each call told to the
/// observers.
#[derive(Default)]
pub(crate) struct Chains {
    pub observers: Vec<Arc<dyn Observer>>,
}

impl Chains {
    /// Run one delegate verb, telling the observers how long it took and how it ended.
    fn observed<T>(
        &self,
        command: Command,
        a: &Attachment,
        env: &DelegateEnv,
        call: impl FnOnce() -> Result<T, Error>,
    ) -> Result<T, Error> {
        if self.observers.is_empty() {
            return call();
        }
        let (started, start) = (SystemTime::now(), Instant::now());
        let out = call();
        let took = start.elapsed();
        let delegate_type = observed_type(a, env);
        let traceparent = env.cni.vars.iter().find(|(k, _)| k == "TRACEPARENT").map(|(_, v)| v.as_str());
        let call = DelegateCall {
            command,
            network: &a.network,
            delegate_type: &delegate_type,
            started,
            took,
            error: out.as_ref().err(),
            traceparent,
        };
        for observer in &self.observers {
            observer.delegate(&call);
        }
        out
    }
}

impl Delegates for Chains {
    fn add(&self, a: &Attachment, env: &DelegateEnv) -> Result<(CniResult, Value), Error> {
        self.observed(Command::Add, a, env, || a.add(env))
    }

    fn del(&self, a: &Attachment, env: &DelegateEnv) -> Result<(), Error> {
        self.observed(Command::Del, a, env, || a.del(env))
    }

    fn check(&self, a: &Attachment, env: &DelegateEnv) -> Result<(), Error> {
        self.observed(Command::Check, a, env, || a.check(env))
    }
}

/// The delegate type an observer is told: the attachment's first plugin when it is a plugin
/// installed where delegates are found (the admin's `binDir` and `CNI_PATH`), else
/// [`UNKNOWN_TYPE`] — a NAD's `type` is any string a tenant writes, and a metric label per string
/// would grow without bound.
fn observed_type(a: &Attachment, env: &DelegateEnv) -> String {
    let t = a.delegate_type();
    match plexus_plugin::delegate::find_plugin(&t, &env.cni.path) {
        Ok(_) => t,
        Err(_) => UNKNOWN_TYPE.into(),
    }
}
