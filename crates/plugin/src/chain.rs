//! What a runtime does with a network configuration list (libcni's `AddNetworkList`,
//! `DelNetworkList`, `CheckNetworkList`, `GCNetworkList`, `GetStatusNetworkList`): each plugin gets
//! its derived config (spec §3); ADD chains `prevResult` through the list, CHECK and DEL give every
//! plugin the cached final result, DEL runs in reverse and keeps going. Used by the meta-plugin for
//! its delegates and by plexusctl; each plugin runs as the caller's [`Runner`] says.

use serde_json::{Map, Value};

use crate::builtin::Runner;
use plexus_cni::config::ConfList;
use plexus_cni::env::{CniEnv, Command};
use plexus_cni::error::{Error, code};
use plexus_cni::result::CniResult;
use plexus_cni::version::SpecVersion;

fn plugin_type(plugin: &Map<String, Value>) -> &str {
    plugin.get("type").and_then(Value::as_str).unwrap_or_default()
}

fn with_command(env: &CniEnv, command: Command) -> CniEnv {
    CniEnv { command, ..env.clone() }
}

/// ADD through the list; the final result, parsed and as printed at the list's version.
pub fn add(
    runner: &Runner,
    list: &ConfList,
    caps: &Map<String, Value>,
    env: &CniEnv,
) -> Result<(CniResult, Value), Error> {
    let version = list.version()?;
    let env = with_command(env, Command::Add);
    let mut prev: Option<Value> = None;
    let mut result = CniResult::default();
    for (i, plugin) in list.plugins.iter().enumerate() {
        let conf = list.invocation_config(i, caps, prev.as_ref())?;
        result = runner.exec(plugin_type(plugin), Command::Add, &env, &conf)?.unwrap_or_default();
        prev = Some(result.to_value(version)?);
    }
    Ok((result, prev.unwrap_or(Value::Null)))
}

/// DEL through the list in reverse, every plugin given `cached` as prevResult; keeps going past
/// failures and reports the first.
pub fn del(
    runner: &Runner,
    list: &ConfList,
    caps: &Map<String, Value>,
    env: &CniEnv,
    cached: Option<&Value>,
) -> Result<(), Error> {
    let env = with_command(env, Command::Del);
    let prev = cached.filter(|_| list.version().is_ok_and(|v| v >= SpecVersion::CHECK_MIN));
    let mut first = None;
    for i in (0..list.plugins.len()).rev() {
        let conf = list.invocation_config(i, caps, prev)?;
        if let Err(e) = runner.exec(plugin_type(&list.plugins[i]), Command::Del, &env, &conf) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// CHECK through the list with the cached result (nothing to do for `disableCheck` lists and
/// below 0.4.0, where CHECK does not exist).
pub fn check(
    runner: &Runner,
    list: &ConfList,
    caps: &Map<String, Value>,
    env: &CniEnv,
    cached: Option<&Value>,
) -> Result<(), Error> {
    if list.disable_check == Some(true) || list.version()? < SpecVersion::CHECK_MIN {
        return Ok(());
    }
    let prev = cached
        .ok_or_else(|| Error::new(code::CHECK_FAILED, format!("network {}: no ADD result recorded", list.name)))?;
    let env = with_command(env, Command::Check);
    for i in 0..list.plugins.len() {
        let conf = list.invocation_config(i, caps, Some(prev))?;
        runner.exec(plugin_type(&list.plugins[i]), Command::Check, &env, &conf)?;
    }
    Ok(())
}

/// STATUS, or GC with the attachments still `valid` (under both key names, cni#1101), on every
/// plugin of a list at 1.1.0 or later; keeps going past failures and reports the first.
pub fn status_or_gc(
    runner: &Runner,
    list: &ConfList,
    env: &CniEnv,
    command: Command,
    valid: Option<&Value>,
) -> Result<(), Error> {
    if list.version()? < SpecVersion::GC_STATUS_MIN || (command == Command::Gc && list.disable_gc == Some(true)) {
        return Ok(());
    }
    let env = with_command(env, command);
    let mut first = None;
    for i in 0..list.plugins.len() {
        let mut conf = list.invocation_config(i, &Map::new(), None)?;
        if let (Some(v), Some(m)) = (valid, conf.as_object_mut()) {
            m.insert("cni.dev/valid-attachments".into(), v.clone());
            m.insert("cni.dev/attachments".into(), v.clone());
        }
        if let Err(e) = runner.exec(plugin_type(&list.plugins[i]), command, &env, &conf) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}
