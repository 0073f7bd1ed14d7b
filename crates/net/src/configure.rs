//! Applying an IPAM result to an interface inside the pod: the steps every attaching plugin
//! shares (the reference's `ipam.ConfigureIface`, plus multi-rail policy routing).
//!
//! Order, as in the reference: sysctls, addresses, link up, routes, then (only with `dad`) the wait
//! for IPv6 duplicate address detection.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use plexus_cni::CniResult;

use crate::error::{NetError, Result};
use crate::kernel::Kernel;
use crate::link::{Dad, Ipv4Conf, LinkChange, MAIN_TABLE, RouteSpec, RuleSpec};
use crate::netns::{Netns, sysctl};

/// Priority of the multi-rail source rules: ahead of `main` (32766).
pub const MULTI_RAIL_RULE_PRIORITY: u32 = 1000;

/// How long `dad: true` waits for IPv6 addresses to leave the tentative state (the reference's
/// `SettleAddresses` bound).
pub const DAD_TIMEOUT: Duration = Duration::from_secs(5);

/// The routing table of a multi-rail interface when the config names none: stable, derived from
/// the interface name. `netN` (Multus's names) gets `100 + N`; other names a hash in 10000..60000.
pub fn multi_rail_table(ifname: &str) -> u32 {
    let digits = ifname.trim_start_matches(|c: char| !c.is_ascii_digit());
    if !digits.is_empty()
        && digits.len() <= 4
        && ifname.len() > digits.len()
        && let Ok(n) = digits.parse::<u32>()
    {
        return 100 + n;
    }
    // FNV-1a: stable across processes and releases.
    let h = ifname.bytes().fold(0x811c9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x01000193));
    10_000 + h % 50_000
}

/// The interface keys of every attaching plugin's config: `mtu`,
/// `multiRail`, `routeTable`, `dad`. Who may set them: whoever writes the network config (a NAD's
/// author); they shape only the pod's own interface.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IfaceKeys {
    /// The interface's MTU; absent (or 0, as in the reference plugins) leaves the device's own.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Several interfaces in one subnet: per-interface routing table and source rules.
    #[serde(default)]
    pub multi_rail: bool,
    /// The multi-rail table; default [`multi_rail_table`] of the interface name.
    #[serde(default)]
    pub route_table: Option<u32>,
    /// Run IPv6 duplicate address detection and wait for it.
    #[serde(default)]
    pub dad: bool,
}

impl IfaceKeys {
    /// The MTU the config asks for (0 is "not set", as in the reference plugins).
    pub fn mtu(&self) -> Option<u32> {
        self.mtu.filter(|m| *m != 0)
    }

    /// The multi-rail routing table, when multi-rail is on.
    pub fn rail_table(&self, ifname: &str) -> Option<u32> {
        self.multi_rail.then(|| self.route_table.unwrap_or_else(|| multi_rail_table(ifname)))
    }

    /// The IPv4 settings the interface gets with its final name ([`ipv4_conf`]).
    pub fn ipv4_conf(&self) -> Ipv4Conf {
        ipv4_conf(self.multi_rail)
    }
}

/// The error for an interface name the pod already has (the spec: ADD fails then).
pub fn ifname_taken(ifname: &str, pod: &Netns) -> plexus_cni::Error {
    plexus_cni::Error::new(
        plexus_cni::code::IFNAME_TAKEN,
        format!("interface {ifname:?} already exists in the container"),
    )
    .with_details(format!("netns {}", pod.path().display()))
}

/// The error of a link change that gives the link the name `ifname` in the pod: EEXIST is that
/// name being taken ([`ifname_taken`]), anything else is the change failing (`what` it was).
pub fn naming_error(e: NetError, ifname: &str, pod: &Netns, what: impl FnOnce() -> String) -> plexus_cni::Error {
    if e.is_exists() { ifname_taken(ifname, pod) } else { plexus_cni::Error::from(e).context(what()) }
}

/// The middle every attaching plugin shares, once its link is in the pod under its final name:
/// IPAM's `result` (its addresses on interface 0), applied to link `index` called `ifname` (addresses,
/// up, routes, multi-rail rules), with the network's `dns`. `is_up`: the link went up with its
/// rename (L2 only).
pub async fn apply_ipam(
    sock: &impl Kernel,
    keys: &IfaceKeys,
    ifname: &str,
    index: u32,
    is_up: bool,
    mut result: CniResult,
    dns: Option<&plexus_cni::Dns>,
) -> std::result::Result<CniResult, plexus_cni::Error> {
    for ip in &mut result.ips {
        ip.interface = Some(0);
    }
    let setup =
        IfaceSetup { ifname, index, result: &result, dad: keys.dad, multi_rail_table: keys.rail_table(ifname), is_up };
    configure(sock, &setup).await.map_err(|e| plexus_cni::Error::from(e).context(format!("configure {ifname}")))?;
    if let Some(dns) = dns.filter(|d| !d.is_empty()) {
        result.dns = dns.clone();
    }
    Ok(result)
}

/// What to configure on one interface.
#[derive(Clone, Debug)]
pub struct IfaceSetup<'a> {
    pub ifname: &'a str,
    pub index: u32,
    /// The IPAM result; its `ips` and `routes` are applied.
    pub result: &'a CniResult,
    /// Run kernel IPv6 DAD and wait for it (default: addresses are added without DAD).
    pub dad: bool,
    /// Multi-rail: the interface's own routing table.
    pub multi_rail_table: Option<u32>,
    /// The link is up already (an L2-only attachment goes up with its rename: nothing to wait for).
    pub is_up: bool,
}

/// The IPv4 settings an interface gets. The caller applies them in the same RTM_SETLINK that
/// gives the link its final name, before [`configure`] brings it up.
pub fn ipv4_conf(multi_rail: bool) -> Ipv4Conf {
    // Neighbours learn the (possibly reused) address at once: arp_notify sends a gratuitous ARP
    // when the link goes up (plugins#588), so it must be set before.
    let mut conf = Ipv4Conf { arp_notify: Some(1), ..Default::default() };
    if multi_rail {
        // Several interfaces in one subnet: each answers ARP only for its own addresses, and
        // announces with the address of the interface it sends from; replies arriving on the
        // "wrong" rail are not dropped by reverse-path filtering (loose mode).
        conf.arp_ignore = Some(1);
        conf.arp_announce = Some(2);
        conf.rp_filter = Some(2);
    }
    conf
}

/// The IPv6 sysctls an interface gets (paths under /proc/sys and values): the kernel takes
/// these only through /proc/sys, so they cost a namespace switch — only when IPv6 is in use.
pub fn ipv6_sysctls_for(setup: &IfaceSetup<'_>) -> Vec<(PathBuf, &'static str)> {
    if !setup.result.ips.iter().any(|i| i.address.is_ipv6()) {
        return Vec::new();
    }
    vec![
        (sysctl("ipv6", "lo", "disable_ipv6"), "0"),
        (sysctl("ipv6", setup.ifname, "disable_ipv6"), "0"),
        // The IPv6 twin of arp_notify: an unsolicited NA on link up.
        (sysctl("ipv6", setup.ifname, "ndisc_notify"), "1"),
    ]
}

fn default_gateway(result: &CniResult, v4: bool) -> Option<IpAddr> {
    result.ips.iter().filter(|i| i.address.is_ipv4() == v4).find_map(|i| i.gateway)
}

/// The routes to add: the result's routes (gateway defaulting to the result's gateway of that
/// family, as the reference does), into the multi-rail table when set, plus — for multi-rail —
/// each address's subnet route in that table.
pub fn routes_for(setup: &IfaceSetup<'_>) -> Vec<RouteSpec> {
    let mut routes = Vec::new();
    if let Some(table) = setup.multi_rail_table {
        for ip in &setup.result.ips {
            let subnet = IpNetwork::new(ip.address.network(), ip.address.prefix()).expect("valid prefix");
            let mut r = RouteSpec::new(subnet, None, setup.index);
            r.table = table;
            r.scope = crate::link::SCOPE_LINK;
            r.prefsrc = Some(ip.address.ip());
            routes.push(r);
        }
    }
    for route in &setup.result.routes {
        let gw = route.gw.or_else(|| default_gateway(setup.result, route.dst.is_ipv4()));
        let mut r = RouteSpec::new(route.dst, gw, setup.index);
        r.table = setup.multi_rail_table.or(route.table).unwrap_or(MAIN_TABLE);
        r.metric = route.priority.filter(|p| *p != 0);
        r.mtu = route.mtu.filter(|m| *m != 0);
        r.advmss = route.advmss.filter(|m| *m != 0);
        r.scope = route.scope.unwrap_or(0);
        routes.push(r);
    }
    routes
}

/// The multi-rail source rules: one per address.
pub fn rules_for(setup: &IfaceSetup<'_>) -> Vec<RuleSpec> {
    let Some(table) = setup.multi_rail_table else { return Vec::new() };
    setup
        .result
        .ips
        .iter()
        .map(|ip| RuleSpec {
            src: IpNetwork::new(ip.address.ip(), if ip.address.is_ipv4() { 32 } else { 128 }).expect("host prefix"),
            table,
            priority: MULTI_RAIL_RULE_PRIORITY,
        })
        .collect()
}

/// Configure the named interface (its [`ipv4_conf`] already applied): IPv6 settings, addresses,
/// up, routes, rules; then the DAD wait if asked.
pub async fn configure(sock: &impl Kernel, setup: &IfaceSetup<'_>) -> Result<()> {
    sock.write_sysctls(&ipv6_sysctls_for(setup))?;
    for ip in &setup.result.ips {
        sock.add_address(setup.index, ip.address, Dad::run_if(setup.dad)).await?;
    }
    if !setup.is_up {
        sock.set_link(setup.index, &LinkChange { up: Some(true), ..Default::default() }).await?;
    }
    for route in routes_for(setup) {
        sock.add_route(&route).await?;
    }
    for rule in rules_for(setup) {
        sock.add_rule(&rule).await?;
    }
    if setup.dad && setup.result.ips.iter().any(|i| i.address.is_ipv6()) {
        wait_for_dad(sock, setup.index, setup.ifname).await?;
    }
    Ok(())
}

async fn wait_for_dad(sock: &impl Kernel, index: u32, ifname: &str) -> Result<()> {
    let deadline = Instant::now() + DAD_TIMEOUT;
    loop {
        let addrs = sock.addresses(index).await?;
        if !addrs.iter().any(|a| a.net.is_ipv6() && a.tentative) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(NetError::Protocol {
                op: format!("wait for IPv6 DAD on {ifname}"),
                msg: format!("addresses still tentative after {DAD_TIMEOUT:?}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Remove the multi-rail rules that point at `table` (the routes went with the link).
pub async fn remove_rules(sock: &impl Kernel, table: u32) -> Result<()> {
    for rule in sock.rules().await?.into_iter().filter(|r| r.table == table) {
        match sock.delete_rule(&rule).await {
            Err(e) if !e.is_not_found() => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// A current-thread tokio runtime for one plugin invocation (netlink connections run on it).
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| NetError::io("start runtime", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn multi_rail_tables_are_stable_and_distinct_for_multus_names() {
        assert_eq!(multi_rail_table("net1"), 101);
        assert_eq!(multi_rail_table("net16"), 116);
        let other = multi_rail_table("roce-rail");
        assert_eq!(other, multi_rail_table("roce-rail"));
        assert!((10_000..60_000).contains(&other));
        assert!((10_000..60_000).contains(&multi_rail_table("12345")), "all digits is not netN");
    }

    #[test]
    fn routes_default_their_gateway_and_go_to_the_rail_table() {
        let result = CniResult::from_value(json!({"cniVersion": "1.1.0",
            "ips": [{"address": "198.18.1.5/24", "gateway": "198.18.1.1"}],
            "routes": [{"dst": "198.19.0.0/16"}, {"dst": "198.20.0.0/16", "gw": "198.18.1.254", "mtu": 4000}]}))
        .unwrap();
        let setup = IfaceSetup {
            ifname: "net1",
            index: 7,
            result: &result,
            dad: false,
            multi_rail_table: Some(101),
            is_up: false,
        };
        let routes = routes_for(&setup);
        assert_eq!(routes.len(), 3);
        assert_eq!(routes[0].dst.to_string(), "198.18.1.0/24");
        assert_eq!((routes[0].scope, routes[0].table), (crate::link::SCOPE_LINK, 101));
        assert_eq!(routes[1].gw.unwrap().to_string(), "198.18.1.1");
        assert_eq!(routes[2].gw.unwrap().to_string(), "198.18.1.254");
        assert_eq!(routes[2].mtu, Some(4000));
        let rules = rules_for(&setup);
        assert_eq!(rules, vec![RuleSpec { src: "198.18.1.5/32".parse().unwrap(), table: 101, priority: 1000 }]);
        assert_eq!(
            ipv4_conf(setup.multi_rail_table.is_some()),
            Ipv4Conf { arp_notify: Some(1), arp_ignore: Some(1), arp_announce: Some(2), rp_filter: Some(2) }
        );
        assert!(ipv6_sysctls_for(&setup).is_empty(), "no IPv6 address, no namespace switch");
    }
}
