//! Address ranges as 128-bit offsets from the network address, for IPv4 and IPv6 alike (no /65
//! limit): parsing of whereabouts' `range` forms, usable bounds and exclusions.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::error::IpamError;

/// An address range of one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpRange {
    /// The network (host bits cleared); the prefix is what results carry.
    pub network: IpNetwork,
    /// First and last offsets that may be handed out (inclusive).
    pub first: u128,
    pub last: u128,
    /// Excluded offset spans (inclusive), sorted and merged.
    pub excluded: Vec<(u128, u128)>,
    pub gateway: Option<IpAddr>,
}

pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_u128(v: u128, v4: bool) -> IpAddr {
    if v4 { IpAddr::V4((v as u32).into()) } else { IpAddr::V6(v.into()) }
}

fn bad(key: &str, value: &str, why: impl std::fmt::Display) -> IpamError {
    IpamError::Config(format!("invalid {key} {value:?}: {why}"))
}

/// Parse a CIDR or a bare address (→ /32 or /128).
fn parse_net(key: &str, s: &str) -> Result<IpNetwork, IpamError> {
    s.trim().parse::<IpNetwork>().map_err(|e| bad(key, s, e))
}

fn parse_ip(key: &str, s: &str) -> Result<IpAddr, IpamError> {
    s.trim().parse::<IpAddr>().map_err(|e| bad(key, s, e))
}

/// The whereabouts keys of one range.
#[derive(Clone, Debug, Default)]
pub struct RangeSpec<'a> {
    pub range: &'a str,
    pub range_start: Option<&'a str>,
    pub range_end: Option<&'a str>,
    pub exclude: &'a [String],
    pub gateway: Option<&'a str>,
}

impl IpRange {
    /// Parse `range` (`198.18.0.0/24`, `198.18.0.10/24` = start at .10, or `A-B/nn`), with the
    /// optional `range_start`, `range_end`, `exclude` and `gateway`.
    pub fn parse(spec: &RangeSpec<'_>) -> Result<IpRange, IpamError> {
        let (mut start, mut end, network) = match spec.range.split_once('-') {
            Some((a, b_nn)) => {
                let b = parse_net("range", b_nn).map_err(|_| bad("range", spec.range, "expected A-B/prefix"))?;
                if !b_nn.contains('/') {
                    return Err(bad("range", spec.range, "expected A-B/prefix"));
                }
                let a = parse_ip("range", a).map_err(|_| bad("range", spec.range, "expected A-B/prefix"))?;
                (Some(a), Some(b.ip()), b)
            }
            None => {
                if !spec.range.contains('/') {
                    return Err(bad("range", spec.range, "expected a CIDR such as 198.18.0.0/24"));
                }
                let n = parse_net("range", spec.range)?;
                let start = (n.ip() != n.network()).then_some(n.ip());
                (start, None, n)
            }
        };
        let network = IpNetwork::new(network.network(), network.prefix()).expect("valid prefix");
        let v4 = network.is_ipv4();
        if let Some(s) = spec.range_start {
            start = Some(parse_ip("range_start", s)?);
        }
        if let Some(e) = spec.range_end {
            end = Some(parse_ip("range_end", e)?);
        }
        let base = to_u128(network.network());
        let bits: u32 = if v4 { 32 } else { 128 };
        let size_bits = bits - u32::from(network.prefix());
        let span: u128 = if size_bits >= 128 { u128::MAX } else { (1u128 << size_bits) - 1 };
        // Never the network address; never the IPv4 broadcast (point-to-point /31, /32 and
        // IPv6 /127, /128 use every address).
        let tiny = size_bits <= 1;
        let mut first = if tiny { 0 } else { 1 };
        let mut last = if tiny || !v4 { span } else { span - 1 };
        let offset_in = |key: &str, ip: IpAddr| -> Result<u128, IpamError> {
            if ip.is_ipv4() != v4 || !network.contains(ip) {
                return Err(bad(key, &ip.to_string(), format!("not inside range {network}")));
            }
            Ok(to_u128(ip) - base)
        };
        if let Some(s) = start {
            first = first.max(offset_in("range_start", s)?);
        }
        if let Some(e) = end {
            last = last.min(offset_in("range_end", e)?);
        }
        if first > last {
            return Err(bad("range", spec.range, "range_start is after range_end: no address to hand out"));
        }
        let gateway = spec.gateway.map(|g| parse_ip("gateway", g)).transpose()?;
        let mut excluded = Vec::new();
        for x in spec.exclude {
            let n = parse_net("exclude", x)?;
            if n.is_ipv4() != v4 {
                return Err(bad("exclude", x, format!("not the family of range {network}")));
            }
            let lo = to_u128(n.network()).max(base);
            let hi = to_u128(n.broadcast_or_last()).min(base + span);
            if lo <= hi {
                excluded.push((lo - base, hi - base));
            }
        }
        if let Some(g) = gateway
            && g.is_ipv4() == v4
            && network.contains(g)
        {
            let o = to_u128(g) - base;
            excluded.push((o, o));
        }
        excluded.sort_unstable();
        let mut merged: Vec<(u128, u128)> = Vec::new();
        for (lo, hi) in excluded {
            match merged.last_mut() {
                Some(prev) if lo <= prev.1.saturating_add(1) => prev.1 = prev.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        let r = IpRange { network, first, last, excluded: merged, gateway };
        if r.capacity() == 0 {
            return Err(bad("range", spec.range, "every address is excluded: no address to hand out"));
        }
        Ok(r)
    }

    pub fn is_ipv4(&self) -> bool {
        self.network.is_ipv4()
    }

    /// The address at `offset`.
    pub fn addr(&self, offset: u128) -> IpAddr {
        from_u128(to_u128(self.network.network()) + offset, self.is_ipv4())
    }

    /// The offset of `ip`, if it is an address this range may hand out.
    pub fn offset_of(&self, ip: IpAddr) -> Option<u128> {
        if ip.is_ipv4() != self.is_ipv4() || !self.network.contains(ip) {
            return None;
        }
        let o = to_u128(ip) - to_u128(self.network.network());
        (o >= self.first && o <= self.last && !self.is_excluded(o)).then_some(o)
    }

    pub fn is_excluded(&self, offset: u128) -> bool {
        self.excluded.iter().any(|&(lo, hi)| offset >= lo && offset <= hi)
    }

    /// If `offset` is excluded, the first offset after its excluded span.
    pub fn skip_excluded(&self, offset: u128) -> u128 {
        match self.excluded.iter().find(|&&(lo, hi)| offset >= lo && offset <= hi) {
            Some(&(_, hi)) => hi.saturating_add(1),
            None => offset,
        }
    }

    /// How many addresses this range can hand out.
    pub fn capacity(&self) -> u128 {
        let total = self.last - self.first + 1;
        let excluded: u128 = self
            .excluded
            .iter()
            .map(|&(lo, hi)| {
                let (lo, hi) = (lo.max(self.first), hi.min(self.last));
                if lo <= hi { hi - lo + 1 } else { 0 }
            })
            .sum();
        total - excluded
    }

    /// The address as a result carries it: `ip/prefix`.
    pub fn with_prefix(&self, ip: IpAddr) -> IpNetwork {
        IpNetwork::new(ip, self.network.prefix()).expect("prefix of this range")
    }

    /// A stable name for the range (store keys, messages).
    pub fn key(&self) -> String {
        format!("{}-{}-{}", self.network, self.addr(self.first), self.addr(self.last))
    }
}

trait LastAddr {
    fn broadcast_or_last(&self) -> IpAddr;
}

impl LastAddr for IpNetwork {
    fn broadcast_or_last(&self) -> IpAddr {
        match self {
            IpNetwork::V4(n) => IpAddr::V4(n.broadcast()),
            IpNetwork::V6(n) => {
                let bits = 128 - u32::from(n.prefix());
                let mask = if bits >= 128 { u128::MAX } else { (1u128 << bits) - 1 };
                IpAddr::V6((u128::from(n.network()) | mask).into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(range: &str) -> IpRange {
        IpRange::parse(&RangeSpec { range, ..Default::default() }).unwrap()
    }

    #[test]
    fn ipv4_ranges_skip_network_and_broadcast() {
        let x = r("198.18.0.0/24");
        assert_eq!((x.first, x.last, x.capacity()), (1, 254, 254));
        assert_eq!(x.addr(1).to_string(), "198.18.0.1");
        let p2p = r("198.18.0.0/31");
        assert_eq!(p2p.capacity(), 2);
    }

    #[test]
    fn a_dash_b_form_and_host_bits_set_the_bounds() {
        let x = r("198.18.0.10-198.18.0.20/24");
        assert_eq!(
            (x.addr(x.first).to_string(), x.addr(x.last).to_string()),
            ("198.18.0.10".into(), "198.18.0.20".into())
        );
        assert_eq!(x.network.to_string(), "198.18.0.0/24");
        let y = r("198.18.0.225/28");
        assert_eq!(y.addr(y.first).to_string(), "198.18.0.225");
        assert_eq!(y.addr(y.last).to_string(), "198.18.0.238");
    }

    #[test]
    fn wide_ipv6_ranges_use_128_bit_offsets() {
        let x = r("2001:db8::/32");
        assert_eq!(x.capacity(), (1u128 << 96) - 1);
        assert_eq!(x.addr(x.last).to_string(), "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff");
        let whole = r("2001:db8::/64");
        assert!(whole.offset_of("2001:db8::ffff:ffff:ffff:ffff".parse().unwrap()).is_some());
    }

    #[test]
    fn exclusions_and_gateway_are_never_handed_out() {
        let x = IpRange::parse(&RangeSpec {
            range: "198.18.0.0/24",
            exclude: &["198.18.0.0/28".into(), "198.18.0.100".into()],
            gateway: Some("198.18.0.254"),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(x.excluded, vec![(0, 15), (100, 100), (254, 254)]);
        assert_eq!(x.capacity(), 254 - 15 - 1 - 1);
        assert_eq!(x.offset_of("198.18.0.5".parse().unwrap()), None);
        assert_eq!(x.offset_of("198.18.0.16".parse().unwrap()), Some(16));
        assert_eq!(x.skip_excluded(3), 16);
    }

    #[test]
    fn bad_ranges_name_the_key_and_value() {
        for (range, start, want) in [
            ("198.18.0.0", None, "invalid range \"198.18.0.0\""),
            ("nonsense/24", None, "invalid range \"nonsense/24\""),
            ("198.18.0.9-198.18.0.2/24", None, "range_start is after range_end"),
            ("198.18.0.0/24", Some("198.19.0.1"), "invalid range_start \"198.19.0.1\": not inside range 198.18.0.0/24"),
        ] {
            let e = IpRange::parse(&RangeSpec { range, range_start: start, ..Default::default() }).unwrap_err();
            assert!(e.to_string().contains(want), "{range}: {e}");
        }
    }
}
