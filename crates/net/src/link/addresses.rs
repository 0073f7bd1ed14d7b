//! Addresses: adding one to a link, listing a link's.

use ipnetwork::IpNetwork;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage};

use super::{LinkSocket, family_of};
use crate::error::Result;

/// An address of a link, as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Address {
    pub net: IpNetwork,
    /// IPv6 duplicate address detection has not finished: the address is not usable yet.
    pub tentative: bool,
}

/// IPv6 duplicate address detection for an address being added (IPv4 has none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dad {
    /// The kernel probes first; the address stays tentative meanwhile.
    Run,
    /// `IFA_F_NODAD`: usable at once.
    Skip,
}

impl Dad {
    /// [`Dad::Run`] when asked for, else [`Dad::Skip`].
    pub fn run_if(asked: bool) -> Dad {
        if asked { Dad::Run } else { Dad::Skip }
    }
}

impl LinkSocket {
    /// Add `addr` (host part kept) to link `index`; [`Dad::Skip`] makes an IPv6 address usable at
    /// once.
    pub async fn add_address(&self, index: u32, addr: IpNetwork, dad: Dad) -> Result<()> {
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
            IpNetwork::V6(_) if dad == Dad::Skip => {
                msg.header.flags = AddressHeaderFlags::Nodad;
                msg.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
            }
            IpNetwork::V6(_) => {}
        }
        let op = format!("add address {addr} to link #{index}");
        self.ack(&op, RouteNetlinkMessage::NewAddress(msg), NLM_F_CREATE | NLM_F_EXCL).await
    }

    /// Addresses of link `index` (both families), with their flags' tentative bit.
    pub async fn addresses(&self, index: u32) -> Result<Vec<Address>> {
        let replies = self.dump("list addresses", RouteNetlinkMessage::GetAddress(AddressMessage::default())).await?;
        Ok(replies
            .into_iter()
            .filter_map(|r| match r {
                RouteNetlinkMessage::NewAddress(a) => address_from_message(&a),
                _ => None,
            })
            .filter(|(i, _)| *i == index)
            .map(|(_, a)| a)
            .collect())
    }
}

/// An address message as (link index, address).
pub(super) fn address_from_message(a: &AddressMessage) -> Option<(u32, Address)> {
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
    Some((a.header.index, Address { net: IpNetwork::new(ip?, a.header.prefix_len).ok()?, tentative }))
}
