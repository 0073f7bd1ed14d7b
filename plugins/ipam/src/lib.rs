//! plexus-ipam: whereabouts-compatible IPAM.
//!
//! ADD: parse the ranges → the requested addresses (runtimeConfig.ips, args.cni.ips, CNI_ARGS IP)
//! matched to their ranges → one address per range from the store (the same again for the same
//! attachment, or for the same pod interface after a sandbox re-creation) → result with gateway,
//! routes and dns. DEL releases by (container ID, ifname). CHECK, STATUS and GC as the spec asks.

use std::net::IpAddr;

use plexus_cni::{CniResult, Error, ErrorList, code};
use plexus_ipam_core::config::PoolsConfig;
use plexus_ipam_core::error::Holder;
use plexus_ipam_core::pools::store::PoolStore;
use plexus_ipam_core::store::{Context, open as open_store, open_for_release as open_existing};
use plexus_ipam_core::{AllocRequest, IpRange, IpamConfig, IpamError, Owner, StoreConfig};
use plexus_plugin::{About, Plugin, Request};
use serde_json::Value;

#[cfg(test)]
mod tests;

/// The plugin (its binary's `main`, and plexus-daemon's in-process delegate).
pub struct Ipam;

/// The plugin's name, version and build.
pub const ABOUT: About =
    About { name: "plexus-ipam", version: env!("CARGO_PKG_VERSION"), build: Some(plexus_build_id::BUILD) };

fn owner(req: &Request, cfg: &IpamConfig) -> Owner {
    let args = &req.env.args;
    let pod_ref = match (args.get("K8S_POD_NAMESPACE"), args.get("K8S_POD_NAME")) {
        (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => Some(format!("{ns}/{name}")),
        _ => None,
    };
    Owner {
        container_id: req.env.container_id.clone(),
        ifname: req.env.ifname.clone(),
        pod_ref,
        node: cfg.node.clone(),
        network: cfg.network.clone(),
    }
}

/// Requested addresses: `runtimeConfig.ips` (capability `ips`), `args.cni.ips` and `CNI_ARGS`
/// `IP=` (comma-separated), unioned as host-local does. CIDRs are accepted (the prefix is the range's).
fn requested(req: &Request) -> Result<Vec<IpAddr>, Error> {
    let mut raw: Vec<(String, &str)> = Vec::new();
    for (source, v) in [("runtimeConfig.ips", req.config.runtime("ips")), ("args.cni.ips", req.config.cni_arg("ips"))] {
        if let Some(Value::Array(items)) = v {
            for item in items {
                let s =
                    item.as_str().ok_or_else(|| Error::invalid_config(format!("{source}: {item} is not a string")))?;
                raw.push((s.to_string(), source));
            }
        }
    }
    if let Some(ips) = req.env.args.get("IP") {
        raw.extend(ips.split(',').filter(|s| !s.is_empty()).map(|s| (s.to_string(), "CNI_ARGS IP")));
    }
    let mut out = Vec::new();
    for (s, source) in raw {
        let ip = s
            .split('/')
            .next()
            .and_then(plexus_ipam_core::range::parse_addr)
            .ok_or_else(|| Error::invalid_config(format!("invalid {source} address {s:?}")))?;
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

/// `CNI_ARGS` `GATEWAY=` (comma-separated, whereabouts): gateways for the result's addresses.
fn cni_gateways(req: &Request) -> Result<Vec<IpAddr>, Error> {
    let Some(list) = req.env.args.get("GATEWAY") else { return Ok(Vec::new()) };
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|g| {
            plexus_ipam_core::range::parse_addr(g)
                .ok_or_else(|| Error::invalid_config(format!("invalid CNI_ARGS GATEWAY {g:?}: not an IP address")))
        })
        .collect()
}

/// The node's own addresses are never a pod's: every address of the network namespace
/// plexus-ipam runs in (the node's: on the port a pod's interface is made on, the uplink, any
/// other) is left out of each range, in whatever store, and one asked for is refused (code 111,
/// naming the node's interface); so is a range's gateway, which the ranges already leave out.
/// The ranges to allocate from.
fn without_node_addresses(cfg: &IpamConfig, requested: &[IpAddr]) -> Result<Vec<IpRange>, Error> {
    let node = plexus_net::netns::addresses_here().map_err(|e| Error::from(e).context("the node's own addresses"))?;
    for &ip in requested {
        if let Some((ifname, _)) = node.iter().find(|(_, a)| *a == ip) {
            return Err(IpamError::InUse { ip, holder: Holder::node(ifname) }.into());
        }
        if cfg.ranges.iter().any(|r| r.gateway == Some(ip)) {
            return Err(IpamError::InUse { ip, holder: Holder::gateway() }.into());
        }
    }
    let node: Vec<IpAddr> = node.into_iter().map(|(_, ip)| ip).collect();
    Ok(cfg.ranges.iter().map(|r| r.excluding(&node)).collect())
}

/// Match each requested address to the range that may hand it out.
fn per_range(ranges: &[IpRange], requested: &[IpAddr]) -> Result<Vec<Option<IpAddr>>, IpamError> {
    let mut out = vec![None; ranges.len()];
    for &ip in requested {
        let i = ranges
            .iter()
            .enumerate()
            .position(|(i, r)| out[i].is_none() && r.offset_of(ip).is_some())
            .ok_or(IpamError::Outside { ip })?;
        out[i] = Some(ip);
    }
    Ok(out)
}

/// ADD for a network of pools (`poolName`): one address of each pool, from this node's blocks,
/// then the config's own static `addresses`, routes and DNS. A requested address is matched to
/// the first pool whose subnet holds it; the node's own addresses are never handed out.
fn add_from_pools(req: &Request, cfg: &IpamConfig, pools: &PoolsConfig) -> Result<CniResult, Error> {
    let requested = requested(req)?;
    let node = plexus_net::netns::addresses_here().map_err(|e| Error::from(e).context("the node's own addresses"))?;
    if let Some((ifname, ip)) = node.iter().find(|(_, a)| requested.contains(a)) {
        return Err(IpamError::InUse { ip: *ip, holder: Holder::node(ifname) }.into());
    }
    let store = PoolStore::open(pools, &cfg.node, &cfg.network, Context::of(req));
    let mut given = store.add(&owner(req, cfg), &requested, &node.iter().map(|(_, ip)| *ip).collect::<Vec<_>>())?;
    tracing::debug!(ips = ?given.ips, "allocated from pools");
    given.result.ips.extend(cfg.addresses.iter().cloned());
    given.result.routes.extend(cfg.routes.iter().cloned());
    given.result.dns = cfg.dns.clone();
    let gateways = cni_gateways(req)?;
    for ip in &mut given.result.ips {
        if let Some(gw) = gateways.iter().find(|g| ip.address.contains(**g)) {
            ip.gateway = Some(*gw);
        }
    }
    Ok(given.result)
}

impl Plugin for Ipam {
    fn known_args(&self) -> &'static [&'static str] {
        &["IP", "GATEWAY"]
    }

    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let cfg = IpamConfig::from_netconf(&req.config, &req.policy)?;
        if let StoreConfig::Pools(pools) = &cfg.store {
            return add_from_pools(req, &cfg, pools);
        }
        cfg.check_ranges_allowed(&req.policy, req.pod_namespace())?;
        let requested = requested(req)?;
        let ranges = without_node_addresses(&cfg, &requested)?;
        let wanted = per_range(&ranges, &requested)?;
        let store = open_store(&cfg, &Context::of(req))?;
        let ips = store.allocate(&AllocRequest {
            owner: owner(req, &cfg),
            ranges: &ranges,
            requested: wanted,
            overlapping: cfg.overlapping,
        })?;
        tracing::debug!(?ips, "allocated");
        Ok(cfg.result(&ips, &cni_gateways(req)?))
    }

    fn del(&self, req: &Request) -> Result<(), Error> {
        let cfg = match IpamConfig::from_netconf(&req.config, &req.policy) {
            // ADD refused this store too: nothing is held there, so DEL has nothing to do.
            Err(IpamError::Refused(why)) => {
                tracing::warn!("nothing released: {why}");
                return Ok(());
            }
            other => other?,
        };
        let Some(store) = open_existing(&cfg, &Context::of(req))? else {
            tracing::debug!("no store yet: nothing to release");
            return Ok(());
        };
        match store.release(&req.env.container_id, &req.env.ifname) {
            Ok(released) => tracing::debug!(?released, "released"),
            // Nothing can be held where a store refuses to look (no object of such a name exists).
            Err(IpamError::Refused(why)) => tracing::warn!("nothing released: {why}"),
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    fn check(&self, req: &Request) -> Result<(), Error> {
        let cfg = IpamConfig::from_netconf(&req.config, &req.policy)?;
        let prev = req.config.prev_result_for_check()?;
        // Reading makes nothing: a store that is not there holds nothing.
        let held = match open_existing(&cfg, &Context::of(req))? {
            Some(store) => store.holdings(&req.env.container_id, &req.env.ifname)?,
            None => Vec::new(),
        };
        if held.is_empty() {
            return Err(Error::new(
                code::CHECK_FAILED,
                format!("no allocation for container {} interface {}", req.env.container_id, req.env.ifname),
            ));
        }
        for a in &held {
            if !prev.ips.iter().any(|p| p.address.ip() == a.ip) {
                return Err(Error::new(code::CHECK_FAILED, format!("allocated address {} is not in prevResult", a.ip)));
            }
        }
        Ok(())
    }

    fn status(&self, req: &Request) -> Result<(), Error> {
        let cfg = IpamConfig::from_netconf(&req.config, &req.policy)?;
        let unavailable = |e: IpamError| Error::new(code::PLUGIN_NOT_AVAILABLE, e.to_string());
        let listed = open_existing(&cfg, &Context::of(req)).and_then(|s| s.map_or(Ok(Vec::new()), |s| s.list()));
        let all = listed.map_err(unavailable)?;
        for range in &cfg.ranges {
            let key = range.key();
            let used = all.iter().filter(|a| a.range == key || range.offset_of(a.ip).is_some()).count() as u128;
            if used >= range.capacity() {
                return Err(Error::new(code::PLUGIN_NOT_AVAILABLE, format!("no free address left in range {key}"))
                    .with_details(format!("{used} of {} addresses allocated", range.capacity())));
            }
        }
        Ok(())
    }

    fn gc(&self, req: &Request) -> Result<(), Error> {
        let cfg = IpamConfig::from_netconf(&req.config, &req.policy)?;
        let valid = req.valid_attachments()?;
        let Some(store) = open_existing(&cfg, &Context::of(req))? else { return Ok(()) };
        let mut failures = ErrorList::default();
        let mut stale = Vec::new();
        for a in store.list()? {
            if a.owner.network != cfg.network
                || valid.iter().any(|v| a.owner.same_attachment(&v.container_id, &v.ifname))
            {
                continue;
            }
            match store.node_of(&a)? {
                Some(node) if node != cfg.node => continue,
                _ => stale.push(a),
            }
        }
        let mut done = std::collections::HashSet::new();
        for a in stale {
            if done.insert((a.owner.container_id.clone(), a.owner.ifname.clone()))
                && let Err(e) = store.release(&a.owner.container_id, &a.owner.ifname)
            {
                failures.push(format!("{}/{}", a.owner.container_id, a.owner.ifname), Error::from(e));
            }
        }
        failures.into_result(code::IO_FAILURE, "GC could not release every stale allocation")
    }
}
