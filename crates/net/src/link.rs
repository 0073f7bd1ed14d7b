//! `LinkSocket`: one rtnetlink socket bound to one network namespace, with typed verbs for links,
//! addresses, routes and rules. Plugins never see a netlink attribute.

use std::net::IpAddr;
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};

use futures::StreamExt;
use ipnetwork::IpNetwork;
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage};
use netlink_packet_route::link::{
    AfSpecInet, AfSpecUnspec, InetDevConf, InfoData, InfoKind, InfoMacVlan, LinkAttribute, LinkFlags, LinkInfo,
    LinkMessage, MacVlanMode,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteMetric, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{TokioSocket, protocols::NETLINK_ROUTE};
use rtnetlink::{Handle, LinkMacVlan, LinkUnspec};

use crate::error::{NetError, Result};
use crate::netns::{InNetns, Netns};

/// The kernel's main routing table.
pub const MAIN_TABLE: u32 = 254;
/// `RT_TABLE_COMPAT`: what the 8-bit header field says when the real table needs RTA_TABLE.
const COMPAT_TABLE: u8 = 252;

/// macvlan modes (`IFLA_MACVLAN_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MacvlanMode {
    Private,
    Vepa,
    Bridge,
    Passthru,
    Source,
}

impl MacvlanMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MacvlanMode::Private => "private",
            MacvlanMode::Vepa => "vepa",
            MacvlanMode::Bridge => "bridge",
            MacvlanMode::Passthru => "passthru",
            MacvlanMode::Source => "source",
        }
    }

    fn to_nl(self) -> MacVlanMode {
        match self {
            MacvlanMode::Private => MacVlanMode::Private,
            MacvlanMode::Vepa => MacVlanMode::Vepa,
            MacvlanMode::Bridge => MacVlanMode::Bridge,
            MacvlanMode::Passthru => MacVlanMode::Passthrough,
            MacvlanMode::Source => MacVlanMode::Source,
        }
    }

    fn from_nl(m: &MacVlanMode) -> Option<Self> {
        Some(match m {
            MacVlanMode::Private => MacvlanMode::Private,
            MacVlanMode::Vepa => MacvlanMode::Vepa,
            MacVlanMode::Bridge => MacvlanMode::Bridge,
            MacVlanMode::Passthrough => MacvlanMode::Passthru,
            MacVlanMode::Source => MacvlanMode::Source,
            _ => return None,
        })
    }
}

/// A link as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub mac: Option<[u8; 6]>,
    pub up: bool,
    /// `IFLA_LINK`: the parent's index.
    pub parent: Option<u32>,
    pub alias: Option<String>,
    pub kind: Option<String>,
    pub macvlan_mode: Option<MacvlanMode>,
}

impl Link {
    fn from_message(msg: LinkMessage) -> Link {
        let mut link = Link {
            index: msg.header.index,
            name: String::new(),
            mtu: 0,
            mac: None,
            up: msg.header.flags.contains(LinkFlags::Up),
            parent: None,
            alias: None,
            kind: None,
            macvlan_mode: None,
        };
        for attr in msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n,
                LinkAttribute::Mtu(m) => link.mtu = m,
                LinkAttribute::Address(a) => link.mac = a.try_into().ok(),
                LinkAttribute::Link(p) => link.parent = Some(p),
                LinkAttribute::IfAlias(a) => link.alias = Some(a),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        match info {
                            LinkInfo::Kind(k) => link.kind = Some(kind_name(&k)),
                            LinkInfo::Data(InfoData::MacVlan(data)) => {
                                link.macvlan_mode = data.iter().find_map(|d| match d {
                                    InfoMacVlan::Mode(m) => MacvlanMode::from_nl(m),
                                    _ => None,
                                })
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        link
    }

    /// The MAC as `aa:bb:cc:dd:ee:ff`.
    pub fn mac_string(&self) -> Option<String> {
        self.mac.map(|m| format_mac(&m))
    }
}

fn kind_name(k: &InfoKind) -> String {
    match k {
        InfoKind::MacVlan => "macvlan".into(),
        InfoKind::Veth => "veth".into(),
        InfoKind::Other(s) => s.clone(),
        other => format!("{other:?}").to_ascii_lowercase(),
    }
}

pub fn format_mac(m: &[u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// Parse `aa:bb:cc:dd:ee:ff` (or with `-`).
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        if p.len() != 2 {
            return None;
        }
        mac[i] = u8::from_str_radix(p, 16).ok()?;
    }
    Some(mac)
}

/// A macvlan to create.
#[derive(Clone, Debug)]
pub struct NewMacvlan<'a> {
    pub name: &'a str,
    pub parent_index: u32,
    pub mode: MacvlanMode,
    pub mtu: Option<u32>,
    pub mac: Option<[u8; 6]>,
    pub bcqueuelen: Option<u32>,
    /// Create it straight inside this namespace (`IFLA_NET_NS_FD`), else in the socket's own.
    pub netns: Option<&'a Netns>,
}

/// Per-interface IPv4 settings (`net.ipv4.conf.<if>.*`), set over netlink (`IFLA_INET_CONF`)
/// instead of /proc/sys: no namespace switch needed. Zero means "leave as is".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ipv4Conf {
    pub arp_notify: i32,
    pub arp_ignore: i32,
    pub arp_announce: i32,
    pub rp_filter: i32,
}

impl Ipv4Conf {
    pub fn is_empty(&self) -> bool {
        *self == Ipv4Conf::default()
    }

    fn to_nl(self) -> InetDevConf {
        let mut c = InetDevConf::default();
        c.arp_notify = self.arp_notify;
        c.arp_ignore = self.arp_ignore;
        c.arp_announce = self.arp_announce;
        c.rp_filter = self.rp_filter;
        c
    }
}

/// Changes to an existing link, applied in one RTM_SETLINK.
#[derive(Clone, Debug, Default)]
pub struct LinkChange<'a> {
    pub name: Option<&'a str>,
    /// IPv4 interface settings (the kernel applies them after name, MTU, MAC and flags).
    pub ipv4_conf: Option<Ipv4Conf>,
    pub mtu: Option<u32>,
    pub mac: Option<[u8; 6]>,
    pub up: Option<bool>,
    pub alias: Option<&'a str>,
    pub netns: Option<&'a Netns>,
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

/// One rtnetlink socket, bound to the namespace it was opened in.
#[derive(Clone, Debug)]
pub struct LinkSocket {
    handle: Handle,
}

/// A socket [`LinkSocket::opening`] is opening in another namespace.
#[derive(Debug)]
pub struct OpeningSocket(InNetns<std::io::Result<OwnedFd>>);

impl OpeningSocket {
    /// Wait for the socket. Call from within a tokio runtime: the connection task is spawned on it.
    pub fn finish(self) -> Result<LinkSocket> {
        let fd = self.0.join()?.map_err(|e| NetError::io("open netlink socket", e))?;
        // SAFETY: fd is a netlink socket this process just created and nothing else owns.
        let socket = unsafe { TokioSocket::from_raw_fd(fd.into_raw_fd()) };
        let (conn, handle, _) = rtnetlink::from_socket(socket);
        tokio::spawn(conn);
        Ok(LinkSocket { handle })
    }
}

/// `rtm_scope` of a route to a directly attached subnet (`scope link`).
pub const SCOPE_LINK: u8 = 253;

/// The address family of IPv4 (`true`) or IPv6 (`false`).
fn family(v4: bool) -> AddressFamily {
    if v4 { AddressFamily::Inet } else { AddressFamily::Inet6 }
}

fn family_of(ip: &IpAddr) -> AddressFamily {
    if ip.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 }
}

impl LinkSocket {
    /// A socket inside `ns`. Call from within a tokio runtime: the connection task is spawned on it.
    pub fn open(ns: &Netns) -> Result<LinkSocket> {
        LinkSocket::opening(ns)?.finish()
    }

    /// Start opening a socket inside `ns` and go on (the thread that joins `ns` costs about as much
    /// as a netlink round trip): [`OpeningSocket::finish`] takes it, within a tokio runtime.
    pub fn opening(ns: &Netns) -> Result<OpeningSocket> {
        let socket = ns.spawn("open netlink socket", || {
            // SAFETY: the descriptor was just released by the socket that owned it.
            netlink_sys::Socket::new(NETLINK_ROUTE).map(|s| unsafe { OwnedFd::from_raw_fd(s.into_raw_fd()) })
        })?;
        Ok(OpeningSocket(socket))
    }

    /// A socket in the calling thread's namespace.
    pub fn current() -> Result<LinkSocket> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| NetError::io("open netlink socket", e))?;
        tokio::spawn(conn);
        Ok(LinkSocket { handle })
    }

    async fn request(&self, op: &str, msg: RouteNetlinkMessage, flags: u16) -> Result<Vec<RouteNetlinkMessage>> {
        plexus_cni::fault::at(plexus_cni::fault::Point::Netlink)
            .map_err(|e| NetError::Protocol { op: op.into(), msg: e.to_string() })?;
        let mut req = NetlinkMessage::from(msg);
        req.header.flags = flags;
        let mut handle = self.handle.clone();
        let mut replies = handle.request(req).map_err(|e| NetError::Protocol { op: op.into(), msg: e.to_string() })?;
        let mut out = Vec::new();
        while let Some(reply) = replies.next().await {
            match reply.payload {
                NetlinkPayload::InnerMessage(inner) => out.push(inner),
                NetlinkPayload::Error(e) if e.code.is_some() => return Err(NetError::netlink(op, e.to_io())),
                _ => {}
            }
        }
        Ok(out)
    }

    async fn ack(&self, op: &str, msg: RouteNetlinkMessage, extra: u16) -> Result<()> {
        self.request(op, msg, NLM_F_REQUEST | NLM_F_ACK | extra).await.map(|_| ())
    }

    async fn dump(&self, op: &str, msg: RouteNetlinkMessage) -> Result<Vec<RouteNetlinkMessage>> {
        self.request(op, msg, NLM_F_REQUEST | NLM_F_DUMP).await
    }

    // ---- links ----

    /// The link called `name`, or `None`.
    pub async fn link(&self, name: &str) -> Result<Option<Link>> {
        let msg = LinkUnspec::new_with_name(name).build();
        self.get_link(&format!("get link {name:?}"), msg).await
    }

    pub async fn link_by_index(&self, index: u32) -> Result<Option<Link>> {
        let msg = LinkUnspec::new_with_index(index).build();
        self.get_link(&format!("get link #{index}"), msg).await
    }

    async fn get_link(&self, op: &str, msg: LinkMessage) -> Result<Option<Link>> {
        match self.request(op, RouteNetlinkMessage::GetLink(msg), NLM_F_REQUEST).await {
            Ok(replies) => Ok(replies.into_iter().find_map(|r| match r {
                RouteNetlinkMessage::NewLink(l) => Some(Link::from_message(l)),
                _ => None,
            })),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn links(&self) -> Result<Vec<Link>> {
        let replies = self.dump("list links", RouteNetlinkMessage::GetLink(LinkMessage::default())).await?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewLink(l) => Some(Link::from_message(l)),
                _ => None,
            })
            .collect())
    }

    /// The link of the first default route (IPv4, then IPv6), as the reference macvlan picks
    /// its master.
    pub async fn default_route_link(&self) -> Result<Option<Link>> {
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let default = self
                .routes(family)
                .await?
                .into_iter()
                .find(|r| r.dst.prefix() == 0 && r.table == MAIN_TABLE && r.oif.is_some());
            if let Some(oif) = default.and_then(|r| r.oif) {
                return self.link_by_index(oif).await;
            }
        }
        Ok(None)
    }

    pub async fn add_macvlan(&self, m: &NewMacvlan<'_>) -> Result<()> {
        let mut b = LinkMacVlan::new(m.name, m.parent_index, m.mode.to_nl());
        if let Some(mtu) = m.mtu {
            b = b.mtu(mtu);
        }
        if let Some(mac) = m.mac {
            b = b.address(mac.to_vec());
        }
        if let Some(q) = m.bcqueuelen {
            b = b.append_info_data(InfoMacVlan::BcQueueLen(q));
        }
        if let Some(ns) = m.netns {
            b = b.setns_by_fd(ns.raw_fd());
        }
        let op = format!("create macvlan {:?} on link #{}", m.name, m.parent_index);
        self.ack(&op, RouteNetlinkMessage::NewLink(b.build()), NLM_F_CREATE | NLM_F_EXCL).await
    }

    pub async fn set_link(&self, index: u32, c: &LinkChange<'_>) -> Result<()> {
        let mut b = LinkUnspec::new_with_index(index);
        if let Some(name) = c.name {
            b = b.name(name);
        }
        if let Some(mtu) = c.mtu {
            b = b.mtu(mtu);
        }
        if let Some(mac) = c.mac {
            b = b.address(mac.to_vec());
        }
        match c.up {
            Some(true) => b = b.up(),
            Some(false) => b = b.down(),
            None => {}
        }
        if let Some(alias) = c.alias {
            b = b.alias(alias);
        }
        if let Some(ns) = c.netns {
            b = b.setns_by_fd(ns.raw_fd());
        }
        if let Some(conf) = c.ipv4_conf.filter(|c| !c.is_empty()) {
            b = b.append_extra_attribute(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![
                AfSpecInet::DevConfRequest(conf.to_nl()),
            ])]));
        }
        self.ack(&format!("set link #{index}"), RouteNetlinkMessage::SetLink(b.build()), 0).await
    }

    pub async fn delete_link(&self, index: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).build();
        self.ack(&format!("delete link #{index}"), RouteNetlinkMessage::DelLink(msg), 0).await
    }

    // ---- addresses ----

    /// Add `addr` (host part kept) to link `index`. `nodad` skips IPv6 duplicate address
    /// detection: the address is usable at once.
    pub async fn add_address(&self, index: u32, addr: IpNetwork, nodad: bool) -> Result<()> {
        let mut msg = AddressMessage::default();
        let ip = addr.ip();
        msg.header.family = family_of(&ip);
        msg.header.prefix_len = addr.prefix();
        msg.header.index = index;
        msg.attributes.push(AddressAttribute::Address(ip));
        match addr {
            IpNetwork::V4(v4) => {
                msg.attributes.push(AddressAttribute::Local(ip));
                if v4.prefix() < 31 {
                    msg.attributes.push(AddressAttribute::Broadcast(v4.broadcast()));
                }
            }
            IpNetwork::V6(_) if nodad => {
                msg.header.flags = AddressHeaderFlags::Nodad;
                msg.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
            }
            IpNetwork::V6(_) => {}
        }
        let op = format!("add address {addr} to link #{index}");
        self.ack(&op, RouteNetlinkMessage::NewAddress(msg), NLM_F_CREATE | NLM_F_EXCL).await
    }

    /// Addresses of link `index` (both families), with their flags' tentative bit.
    pub async fn addresses(&self, index: u32) -> Result<Vec<(IpNetwork, bool)>> {
        let replies = self.dump("list addresses", RouteNetlinkMessage::GetAddress(AddressMessage::default())).await?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewAddress(a) => address_from_message(&a),
                _ => None,
            })
            .filter(|(i, _, _)| *i == index)
            .map(|(_, net, tentative)| (net, tentative))
            .collect())
    }

    // ---- routes ----

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
    /// family (`v4`); returns how many went. (Multus's `default-route`: the pod's default route
    /// goes through the attachment that asked for it.)
    pub async fn delete_default_routes(&self, index: u32, v4: bool) -> Result<usize> {
        let mut deleted = 0;
        for r in self.routes(family(v4)).await? {
            if r.dst.prefix() != 0 || r.table != MAIN_TABLE || r.oif != Some(index) {
                continue;
            }
            let mut msg = RouteMessage::default();
            msg.header.address_family = family(v4);
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
        let mut routes = self.routes(AddressFamily::Inet).await?;
        routes.extend(self.routes(AddressFamily::Inet6).await?);
        Ok(routes)
    }

    /// Every route of `family`, all tables.
    async fn routes(&self, family: AddressFamily) -> Result<Vec<RouteSpec>> {
        let mut req = RouteMessage::default();
        req.header.address_family = family;
        let replies = self.dump("list routes", RouteNetlinkMessage::GetRoute(req)).await?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewRoute(m) => route_from_message(m),
                _ => None,
            })
            .collect())
    }

    // ---- rules ----

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
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let mut req = RuleMessage::default();
            req.header.family = family;
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

/// An address message as (link index, address, tentative).
fn address_from_message(a: &AddressMessage) -> Option<(u32, IpNetwork, bool)> {
    let mut ip = None;
    let mut tentative = a.header.flags.contains(AddressHeaderFlags::Tentative);
    for attr in &a.attributes {
        match attr {
            AddressAttribute::Local(l) => ip = Some(*l),
            AddressAttribute::Address(l) if ip.is_none() => ip = Some(*l),
            AddressAttribute::Flags(f) => tentative |= f.contains(AddressFlags::Tentative),
            _ => {}
        }
    }
    Some((a.header.index, IpNetwork::new(ip?, a.header.prefix_len).ok()?, tentative))
}

/// A source rule (rules without a source are not plexus's).
fn rule_from_message(m: &RuleMessage) -> Option<RuleSpec> {
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

fn route_from_message(m: RouteMessage) -> Option<RouteSpec> {
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

/// Entry points for the fuzz targets (`fuzz/`): the decoding of kernel replies, as the verbs above
/// read them. Built only with the `fuzzing` feature.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    use super::*;

    /// Decode a datagram of rtnetlink messages as netlink-proto does (header, then payload by
    /// message type) and turn each into plexus's types; returns how many were understood.
    pub fn decode_replies(mut buf: &[u8]) -> usize {
        let mut understood = 0;
        while buf.len() >= 16 {
            let len = u32::from_ne_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
            if len < 16 || len > buf.len() {
                break;
            }
            if let Ok(m) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[..len])
                && let NetlinkPayload::InnerMessage(inner) = m.payload
            {
                understood += usize::from(convert(inner));
            }
            buf = &buf[((len + 3) & !3).min(buf.len())..];
        }
        understood
    }

    fn convert(msg: RouteNetlinkMessage) -> bool {
        match msg {
            RouteNetlinkMessage::NewLink(l) => {
                let link = Link::from_message(l);
                let _ = link.mac_string();
                true
            }
            RouteNetlinkMessage::NewAddress(a) => address_from_message(&a).is_some(),
            RouteNetlinkMessage::NewRoute(r) => route_from_message(r).is_some(),
            RouteNetlinkMessage::NewRule(r) => rule_from_message(&r).is_some(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_link_is_the_kernels_rt_scope_link() {
        assert_eq!(u8::from(RouteScope::Link), SCOPE_LINK);
    }

    #[test]
    fn macs_parse_and_print() {
        assert_eq!(parse_mac("02:AB:cd:00:00:09"), Some([2, 0xab, 0xcd, 0, 0, 9]));
        assert_eq!(parse_mac("02-ab-cd-00-00-09"), Some([2, 0xab, 0xcd, 0, 0, 9]));
        for bad in ["", "02:ab:cd:00:00", "02:ab:cd:00:00:0g", "002:ab:cd:00:00:09"] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
        assert_eq!(format_mac(&[2, 0xab, 0xcd, 0, 0, 9]), "02:ab:cd:00:00:09");
    }

    #[test]
    fn rules_always_carry_the_to_table_action() {
        let r = rule_message(&RuleSpec { src: "198.18.0.2/32".parse().unwrap(), table: 1001, priority: 100 });
        assert_eq!(r.header.action, RuleAction::ToTable);
        assert_eq!(r.header.table, COMPAT_TABLE);
        assert!(r.attributes.contains(&RuleAttribute::Table(1001)));
    }
}
