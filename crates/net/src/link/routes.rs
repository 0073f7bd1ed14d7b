//! Routes and policy rules.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteMetric, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::{LinkSocket, family_of};
use crate::error::Result;

/// The kernel's main routing table.
pub const MAIN_TABLE: u32 = 254;
/// `RT_TABLE_COMPAT`: what the 8-bit header field says when the real table needs RTA_TABLE.
const COMPAT_TABLE: u8 = 252;
/// `rtm_scope` of a route to a directly attached subnet (`scope link`).
pub const SCOPE_LINK: u8 = 253;

/// An IP version, where a verb works on one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    fn to_nl(self) -> AddressFamily {
        match self {
            IpFamily::V4 => AddressFamily::Inet,
            IpFamily::V6 => AddressFamily::Inet6,
        }
    }
}

/// A route to add, or one the kernel reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    pub oif: Option<u32>,
    pub table: u32,
    pub metric: Option<u32>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    /// `rtm_scope`: [`SCOPE_LINK`] for a route to a directly attached subnet, 0 (universe) else.
    pub scope: u8,
    pub prefsrc: Option<IpAddr>,
}

impl RouteSpec {
    /// A route through `oif` in the main table, universe scope (what the reference plugins add).
    pub fn new(dst: IpNetwork, gw: Option<IpAddr>, oif: u32) -> RouteSpec {
        RouteSpec {
            dst,
            gw,
            oif: Some(oif),
            table: MAIN_TABLE,
            metric: None,
            mtu: None,
            advmss: None,
            scope: 0,
            prefsrc: None,
        }
    }
}

/// A policy rule `from <src> lookup <table>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSpec {
    pub src: IpNetwork,
    pub table: u32,
    pub priority: u32,
}

impl LinkSocket {
    pub async fn add_route(&self, r: &RouteSpec) -> Result<()> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family_of(&r.dst.ip());
        msg.header.destination_prefix_length = r.dst.prefix();
        msg.header.protocol = RouteProtocol::Boot;
        msg.header.scope = RouteScope::from(r.scope);
        msg.header.kind = RouteType::Unicast;
        msg.header.table = u8::try_from(r.table).unwrap_or(COMPAT_TABLE);
        msg.attributes.push(RouteAttribute::Table(r.table));
        msg.attributes.push(RouteAttribute::Destination(RouteAddress::from(r.dst.network())));
        if let Some(gw) = r.gw {
            msg.attributes.push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
        if let Some(oif) = r.oif {
            msg.attributes.push(RouteAttribute::Oif(oif));
        }
        if let Some(m) = r.metric {
            msg.attributes.push(RouteAttribute::Priority(m));
        }
        if let Some(src) = r.prefsrc {
            msg.attributes.push(RouteAttribute::PrefSource(RouteAddress::from(src)));
        }
        let mut metrics = Vec::new();
        if let Some(mtu) = r.mtu {
            metrics.push(RouteMetric::Mtu(mtu));
        }
        if let Some(mss) = r.advmss {
            metrics.push(RouteMetric::Advmss(mss));
        }
        if !metrics.is_empty() {
            msg.attributes.push(RouteAttribute::Metrics(metrics));
        }
        let via = r.gw.map(|g| format!(" via {g}")).unwrap_or_default();
        let op = format!("add route {}{via} table {}", r.dst, r.table);
        self.ack(&op, RouteNetlinkMessage::NewRoute(msg), NLM_F_CREATE | NLM_F_EXCL).await
    }

    /// Delete the default routes of the main table that leave through link `index`, of one
    /// family; returns how many went. (Multus's `default-route`: the pod's default route
    /// goes through the attachment that asked for it.)
    pub async fn delete_default_routes(&self, index: u32, family: IpFamily) -> Result<usize> {
        let mut deleted = 0;
        for r in self.routes(family).await? {
            if r.dst.prefix() != 0 || r.table != MAIN_TABLE || r.oif != Some(index) {
                continue;
            }
            let mut msg = RouteMessage::default();
            msg.header.address_family = family.to_nl();
            msg.header.destination_prefix_length = 0;
            msg.header.table = u8::try_from(MAIN_TABLE).unwrap_or(COMPAT_TABLE);
            msg.header.scope = RouteScope::from(r.scope);
            msg.header.kind = RouteType::Unicast;
            msg.attributes.push(RouteAttribute::Table(MAIN_TABLE));
            msg.attributes.push(RouteAttribute::Oif(index));
            if let Some(gw) = r.gw {
                msg.attributes.push(RouteAttribute::Gateway(RouteAddress::from(gw)));
            }
            if let Some(m) = r.metric {
                msg.attributes.push(RouteAttribute::Priority(m));
            }
            let via = r.gw.map(|g| format!(" via {g}")).unwrap_or_default();
            self.ack(&format!("delete default route{via}"), RouteNetlinkMessage::DelRoute(msg), 0).await?;
            deleted += 1;
        }
        Ok(deleted)
    }

    /// Every route, IPv4 and IPv6, all tables.
    pub async fn all_routes(&self) -> Result<Vec<RouteSpec>> {
        let mut routes = self.routes(IpFamily::V4).await?;
        routes.extend(self.routes(IpFamily::V6).await?);
        Ok(routes)
    }

    /// Every route of `family`, all tables.
    pub(super) async fn routes(&self, family: IpFamily) -> Result<Vec<RouteSpec>> {
        let mut req = RouteMessage::default();
        req.header.address_family = family.to_nl();
        let replies = self.dump("list routes", RouteNetlinkMessage::GetRoute(req)).await?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewRoute(m) => route_from_message(m),
                _ => None,
            })
            .collect())
    }

    pub async fn add_rule(&self, r: &RuleSpec) -> Result<()> {
        let msg = rule_message(r);
        let op = format!("add rule from {} lookup {}", r.src, r.table);
        self.ack(&op, RouteNetlinkMessage::NewRule(msg), NLM_F_CREATE | NLM_F_EXCL).await
    }

    pub async fn delete_rule(&self, r: &RuleSpec) -> Result<()> {
        let op = format!("delete rule from {} lookup {}", r.src, r.table);
        self.ack(&op, RouteNetlinkMessage::DelRule(rule_message(r)), 0).await
    }

    /// Source rules of both families (`from <prefix> lookup <table>`).
    pub async fn rules(&self) -> Result<Vec<RuleSpec>> {
        let mut out = Vec::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            let mut req = RuleMessage::default();
            req.header.family = family.to_nl();
            for r in self.dump("list rules", RouteNetlinkMessage::GetRule(req)).await? {
                if let RouteNetlinkMessage::NewRule(m) = r {
                    out.extend(rule_from_message(&m));
                }
            }
        }
        Ok(out)
    }
}

fn rule_message(r: &RuleSpec) -> RuleMessage {
    let mut msg = RuleMessage::default();
    msg.header.family = family_of(&r.src.ip());
    msg.header.src_len = r.src.prefix();
    msg.header.table = u8::try_from(r.table).unwrap_or(COMPAT_TABLE);
    // Without an explicit action the kernel stores "unspec" and lookups through the rule fail
    // with EINVAL (rtnetlink's RuleAddRequest default).
    msg.header.action = RuleAction::ToTable;
    msg.attributes.push(RuleAttribute::Source(r.src.ip()));
    msg.attributes.push(RuleAttribute::Table(r.table));
    msg.attributes.push(RuleAttribute::Priority(r.priority));
    msg
}

/// A source rule (rules without a source are not plexus's).
pub(super) fn rule_from_message(m: &RuleMessage) -> Option<RuleSpec> {
    let mut table = u32::from(m.header.table);
    let (mut src, mut priority) = (None, 0);
    for attr in &m.attributes {
        match attr {
            RuleAttribute::Table(t) => table = *t,
            RuleAttribute::Source(ip) => src = Some(*ip),
            RuleAttribute::Priority(p) => priority = *p,
            _ => {}
        }
    }
    Some(RuleSpec { src: IpNetwork::new(src?, m.header.src_len).ok()?, table, priority })
}

pub(super) fn route_from_message(m: RouteMessage) -> Option<RouteSpec> {
    let v4 = m.header.address_family == AddressFamily::Inet;
    let mut spec = RouteSpec {
        dst: IpNetwork::new(if v4 { IpAddr::from([0u8; 4]) } else { IpAddr::from([0u16; 8]) }, 0).ok()?,
        gw: None,
        oif: None,
        table: u32::from(m.header.table),
        metric: None,
        mtu: None,
        advmss: None,
        scope: u8::from(m.header.scope),
        prefsrc: None,
    };
    let to_ip = |a: &RouteAddress| match a {
        RouteAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
        RouteAddress::Inet6(ip) => Some(IpAddr::V6(*ip)),
        _ => None,
    };
    for attr in &m.attributes {
        match attr {
            RouteAttribute::Destination(a) => {
                spec.dst = IpNetwork::new(to_ip(a)?, m.header.destination_prefix_length).ok()?;
            }
            RouteAttribute::Gateway(a) => spec.gw = to_ip(a),
            RouteAttribute::PrefSource(a) => spec.prefsrc = to_ip(a),
            RouteAttribute::Oif(i) => spec.oif = Some(*i),
            RouteAttribute::Table(t) => spec.table = *t,
            RouteAttribute::Priority(p) => spec.metric = Some(*p),
            RouteAttribute::Metrics(ms) => {
                for metric in ms {
                    match metric {
                        RouteMetric::Mtu(v) => spec.mtu = Some(*v),
                        RouteMetric::Advmss(v) => spec.advmss = Some(*v),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_link_is_the_kernels_rt_scope_link() {
        assert_eq!(u8::from(RouteScope::Link), SCOPE_LINK);
    }

    #[test]
    fn rules_always_carry_the_to_table_action() {
        let r = rule_message(&RuleSpec { src: "198.18.0.2/32".parse().unwrap(), table: 1001, priority: 100 });
        assert_eq!(r.header.action, RuleAction::ToTable);
        assert_eq!(r.header.table, COMPAT_TABLE);
        assert!(r.attributes.contains(&RuleAttribute::Table(1001)));
    }
}
