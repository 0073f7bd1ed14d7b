//! `plexusctl ipam list|release`: who holds which address, on which node — through the network's
//! own IPAM section, so the file, etcd and kubernetes stores answer alike.

use anyhow::{Context, Result, bail};
use plexus_cni::NetConf;
use plexus_ipam::{IpamConfig, Store};
use serde_json::Value;

/// The plexus-ipam section of network `list` (the first plugin that has one).
fn ipam_config(list: &plexus_cni::ConfList) -> Result<IpamConfig> {
    for plugin in &list.plugins {
        let ty = plugin.get("ipam").and_then(|i| i.get("type")).and_then(Value::as_str);
        if ty == Some("plexus-ipam") {
            let mut p = plugin.clone();
            p.insert("name".into(), list.name.clone().into());
            p.insert("cniVersion".into(), list.cni_version.clone().into());
            let conf: NetConf = serde_json::from_value(Value::Object(p))?;
            let policy = plexus_cni::Policy::load(|k| std::env::var(k).ok()).map_err(|e| anyhow::anyhow!("{e}"))?;
            return IpamConfig::from_netconf(&conf, &policy).map_err(|e| anyhow::anyhow!("{e}"));
        }
    }
    bail!("network {:?} has no plexus-ipam section", list.name)
}

fn store(cfg: &IpamConfig) -> Result<Box<dyn Store>> {
    Ok(plexus_ipam::store::open(cfg)?)
}

pub fn list(list: &plexus_cni::ConfList, json: bool) -> Result<()> {
    let cfg = ipam_config(list)?;
    let all = store(&cfg)?.list().context("list allocations")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    println!("{:<40} {:<20} {:<10} {:<16} {:<24} NETWORK", "ADDRESS", "CONTAINER", "IFNAME", "NODE", "POD");
    for a in &all {
        let cid: String = a.owner.container_id.chars().take(20).collect();
        println!(
            "{:<40} {:<20} {:<10} {:<16} {:<24} {}",
            a.ip,
            cid,
            a.owner.ifname,
            // whereabouts' objects name no node.
            if a.owner.node.is_empty() { "-" } else { &a.owner.node },
            a.owner.pod_ref.as_deref().unwrap_or("-"),
            a.owner.network
        );
    }
    eprintln!("{} allocation(s) in domain {:?}", all.len(), cfg.domain);
    Ok(())
}

pub fn release(list: &plexus_cni::ConfList, container_id: &str, ifname: &str) -> Result<()> {
    plexus_cni::env::validate_container_id(container_id).map_err(|e| anyhow::anyhow!("{e}"))?;
    plexus_cni::env::validate_ifname(ifname).map_err(|e| anyhow::anyhow!("{e}"))?;
    let cfg = ipam_config(list)?;
    let released = store(&cfg)?.release(container_id, ifname)?;
    for a in &released {
        println!("released {} ({container_id}/{ifname})", a.ip);
    }
    if released.is_empty() {
        eprintln!("{container_id}/{ifname} held nothing");
    }
    Ok(())
}
