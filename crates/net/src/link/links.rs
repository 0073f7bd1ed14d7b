//! Links: what the kernel reports of one, macvlans to create, changes to an existing link.

use netlink_packet_core::{DefaultNla, Emitable, NLA_F_NESTED, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    AfSpecInet, AfSpecUnspec, InfoData, InfoKind, InfoMacVlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
    MacVlanMode, Prop,
};
use rtnetlink::{LinkMacVlan, LinkUnspec};

pub use plexus_node::hw::{format_mac, parse_mac};

use super::{IpFamily, LinkSocket, MAIN_TABLE};
use crate::error::Result;
use crate::netns::Netns;

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
    /// Its alternative names (`IFLA_PROP_LIST`): names it is also found by, moving with it.
    pub alt_names: Vec<String>,
    pub kind: Option<String>,
    pub macvlan_mode: Option<MacvlanMode>,
    /// `IFLA_MASTER`: the index of the device this one is enslaved to (a bridge, a bond).
    pub master: Option<u32>,
}

impl Link {
    pub(super) fn from_message(msg: LinkMessage) -> Link {
        let mut link = Link {
            index: msg.header.index,
            name: String::new(),
            mtu: 0,
            mac: None,
            up: msg.header.flags.contains(LinkFlags::Up),
            parent: None,
            alias: None,
            alt_names: Vec::new(),
            kind: None,
            macvlan_mode: None,
            master: None,
        };
        for attr in msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n,
                LinkAttribute::Mtu(m) => link.mtu = m,
                LinkAttribute::Address(a) => link.mac = a.try_into().ok(),
                LinkAttribute::Link(p) => link.parent = Some(p),
                LinkAttribute::Controller(m) => link.master = Some(m),
                LinkAttribute::IfAlias(a) => link.alias = Some(a),
                LinkAttribute::PropList(props) => {
                    link.alt_names = props
                        .into_iter()
                        .filter_map(|p| match p {
                            Prop::AltIfName(n) => Some(n),
                            _ => None,
                        })
                        .collect()
                }
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
/// instead of /proc/sys: no namespace switch needed. `None` leaves a setting as it is; any value,
/// zero included, is set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ipv4Conf {
    pub arp_notify: Option<i32>,
    pub arp_ignore: Option<i32>,
    pub arp_announce: Option<i32>,
    pub rp_filter: Option<i32>,
}

/// `IFLA_INET_CONF` in `IFLA_AF_SPEC`'s `AF_INET` part (linux/if_link.h).
const IFLA_INET_CONF: u16 = 1;
/// `IPV4_DEVCONF_*` (linux/ip.h): the ids of the settings plexus writes.
const IPV4_DEVCONF_RP_FILTER: u16 = 8;
const IPV4_DEVCONF_ARP_ANNOUNCE: u16 = 18;
const IPV4_DEVCONF_ARP_IGNORE: u16 = 19;
const IPV4_DEVCONF_ARP_NOTIFY: u16 = 22;

impl Ipv4Conf {
    pub fn is_empty(&self) -> bool {
        *self == Ipv4Conf::default()
    }

    /// The nested `(id, u32)` attributes of the settings given. Written here rather than through
    /// netlink-packet-route's `InetDevConf`, which leaves out every zero (so a setting could never
    /// be set to 0).
    fn to_nl(self) -> AfSpecInet {
        let entries: Vec<DefaultNla> = [
            (IPV4_DEVCONF_RP_FILTER, self.rp_filter),
            (IPV4_DEVCONF_ARP_ANNOUNCE, self.arp_announce),
            (IPV4_DEVCONF_ARP_IGNORE, self.arp_ignore),
            (IPV4_DEVCONF_ARP_NOTIFY, self.arp_notify),
        ]
        .into_iter()
        .filter_map(|(id, value)| Some(DefaultNla::new(id, (value? as u32).to_ne_bytes().to_vec())))
        .collect();
        let mut nested = vec![0; entries.as_slice().buffer_len()];
        entries.as_slice().emit(&mut nested);
        AfSpecInet::Other(DefaultNla::new(IFLA_INET_CONF | NLA_F_NESTED, nested))
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

impl LinkSocket {
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

    /// Every link.
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
        for family in [IpFamily::V4, IpFamily::V6] {
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
            b = b.append_extra_attribute(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![conf.to_nl()])]));
        }
        self.ack(&format!("set link #{index}"), RouteNetlinkMessage::SetLink(b.build()), 0).await
    }

    /// Give link `index` the alternative name `name` (`present`), or take it away (RTM_NEWLINKPROP,
    /// RTM_DELLINKPROP).
    pub async fn set_alt_name(&self, index: u32, name: &str, present: bool) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index)
            .append_extra_attribute(LinkAttribute::PropList(vec![Prop::AltIfName(name.to_string())]))
            .build();
        if present {
            let op = format!("add alternative name {name:?} to link #{index}");
            self.ack(&op, RouteNetlinkMessage::NewLinkProp(msg), NLM_F_CREATE | NLM_F_EXCL).await
        } else {
            let op = format!("remove alternative name {name:?} of link #{index}");
            self.ack(&op, RouteNetlinkMessage::DelLinkProp(msg), 0).await
        }
    }

    pub async fn delete_link(&self, index: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).build();
        self.ack(&format!("delete link #{index}"), RouteNetlinkMessage::DelLink(msg), 0).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_route::link::InetDevConf;

    fn bytes(a: &AfSpecInet) -> Vec<u8> {
        let mut out = vec![0; a.buffer_len()];
        a.emit(&mut out);
        out
    }

    #[test]
    fn ipv4_settings_are_the_bytes_netlink_packet_route_sends_and_zero_is_sent_too() {
        let conf = Ipv4Conf { arp_notify: Some(1), arp_ignore: Some(1), arp_announce: Some(2), rp_filter: Some(2) };
        let mut theirs = InetDevConf::default();
        (theirs.arp_notify, theirs.arp_ignore, theirs.arp_announce, theirs.rp_filter) = (1, 1, 2, 2);
        assert_eq!(bytes(&conf.to_nl()), bytes(&AfSpecInet::DevConfRequest(theirs)));
        // rp_filter 0: one attribute more than netlink-packet-route would send (it drops zeros).
        let off = Ipv4Conf { rp_filter: Some(0), ..Default::default() };
        let sent = bytes(&off.to_nl());
        assert_eq!(sent.len(), 4 + 8, "the nest header and one (id, u32) attribute");
        assert_eq!(&sent[4..], [8, 0, 8, 0, 0, 0, 0, 0], "IPV4_DEVCONF_RP_FILTER = 0");
        assert!(Ipv4Conf::default().is_empty());
    }
}
