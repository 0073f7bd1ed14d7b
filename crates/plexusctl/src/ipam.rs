//! `plexusctl ipam list|release`: who holds which address, on which node — through the network's
//! own IPAM section, so the file, etcd and kubernetes stores answer alike.

use anyhow::{Context, Result, bail};
use plexus_cni::NetConf;
use plexus_ipam_core::{IpamConfig, Store};
use serde_json::Value;

/// The plexus-ipam section of network `list` (the first plugin that has one), with the node
/// policy it is read under.
fn ipam_config(list: &plexus_cni::ConfList) -> Result<(IpamConfig, plexus_node::Policy)> {
    for plugin in &list.plugins {
        let ty = plugin.get("ipam").and_then(|i| i.get("type")).and_then(Value::as_str);
        if ty == Some("plexus-ipam") {
            let mut p = plugin.clone();
            p.insert("name".into(), list.name.clone().into());
            p.insert("cniVersion".into(), list.cni_version.clone().into());
            let conf: NetConf = serde_json::from_value(Value::Object(p))?;
            let policy = plexus_node::Policy::load(|k| std::env::var(k).ok()).map_err(|e| anyhow::anyhow!("{e}"))?;
            let cfg = IpamConfig::from_netconf(&conf, &policy).map_err(|e| anyhow::anyhow!("{e}"))?;
            return Ok((cfg, policy));
        }
    }
    bail!("network {:?} has no plexus-ipam section", list.name)
}

/// The network's store as it is (nothing is made to look at it); `None` when there is none yet.
fn store<'a>(cfg: &IpamConfig, policy: &'a plexus_node::Policy) -> Result<Option<Box<dyn Store + 'a>>> {
    let deadline = plexus_cni::Deadline::after(policy.limits.request_timeout());
    let cx = plexus_ipam_core::store::Context { policy, namespace: None, deadline };
    Ok(plexus_ipam_core::store::open_for_release(cfg, &cx)?)
}

pub fn list(list: &plexus_cni::ConfList, json: bool) -> Result<()> {
    let (cfg, policy) = ipam_config(list)?;
    let all = match store(&cfg, &policy)? {
        Some(store) => store.list().context("list allocations")?,
        None => Vec::new(),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    println!("{:<40} {:<20} {:<10} {:<16} {:<24} NETWORK", "ADDRESS", "CONTAINER", "IFNAME", "NODE", "POD");
    // What the store holds comes from other writers (whereabouts' objects, a tenant's interface
    // name): escaped before it reaches a terminal.
    let shown = |s: &str| plexus_plugin::logging::escape_controls(s).into_owned();
    for a in &all {
        let cid: String = a.owner.container_id.chars().take(20).collect();
        println!(
            "{:<40} {:<20} {:<10} {:<16} {:<24} {}",
            a.ip,
            shown(&cid),
            shown(&a.owner.ifname),
            // whereabouts' objects name no node.
            if a.owner.node.is_empty() { "-".into() } else { shown(&a.owner.node) },
            shown(a.owner.pod_ref.as_deref().unwrap_or("-")),
            shown(&a.owner.network)
        );
    }
    eprintln!("{} allocation(s) in domain {:?}", all.len(), cfg.domain);
    Ok(())
}

pub fn release(list: &plexus_cni::ConfList, container_id: &str, ifname: &str) -> Result<()> {
    plexus_cni::env::validate_container_id(container_id).map_err(|e| anyhow::anyhow!("{e}"))?;
    plexus_cni::env::validate_ifname(ifname).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (cfg, policy) = ipam_config(list)?;
    let released = match store(&cfg, &policy)? {
        Some(store) => store.release(container_id, ifname)?,
        None => Vec::new(),
    };
    for a in &released {
        println!("released {} ({container_id}/{})", a.ip, plexus_plugin::logging::escape_controls(ifname));
    }
    if released.is_empty() {
        eprintln!("{container_id}/{ifname} held nothing");
    }
    Ok(())
}
