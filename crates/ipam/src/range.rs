//! Address ranges as 128-bit offsets from the network address, for IPv4 and IPv6 alike (no /65
//! limit): parsing of whereabouts' `range` forms, usable bounds and exclusions.
//!
//! As whereabouts (v0.9): `range` is a network (host bits are ignored: `192.168.1.44/28` hands
//! out from .33), never its network address nor its last address (IPv4 broadcast, IPv6 all-ones);
//! `A-B/nn` sets start and end; `range_start`/`range_end` outside the usable span, of the other
//! family or reversed are ignored (with a warning), as whereabouts ignores them; IPv4 addresses
//! with leading zeroes (`00192.00168.1.5`) are read as decimal. Unlike whereabouts: /31, /32,
//! /127 and /128 are point-to-point ranges whose every address is usable (RFC 3021, RFC 6164),
//! where whereabouts fails with "net mask is too short"; and the gateway is never handed out.

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

/// An IPv4 dotted quad with leading zeroes (`00192.00168.01.5`) as whereabouts reads it: each
/// part decimal. Anything else is returned as it is.
fn without_leading_zeroes(s: &str) -> std::borrow::Cow<'_, str> {
    let parts: Vec<&str> = s.split('.').collect();
    let padded = parts.len() == 4
        && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && parts.iter().any(|p| p.len() > 1 && p.starts_with('0'));
    if !padded {
        return s.into();
    }
    let trimmed: Vec<&str> =
        parts.iter().map(|p| p.trim_start_matches('0')).map(|p| if p.is_empty() { "0" } else { p }).collect();
    trimmed.join(".").into()
}

/// An address (IPv4 leading zeroes read as decimal).
pub fn parse_addr(s: &str) -> Option<IpAddr> {
    without_leading_zeroes(s.trim()).parse().ok()
}

/// A CIDR or a bare address (→ /32 or /128); IPv4 leading zeroes read as decimal.
pub fn parse_cidr(s: &str) -> Option<IpNetwork> {
    let s = s.trim();
    match s.split_once('/') {
        Some((a, p)) => format!("{}/{p}", without_leading_zeroes(a)).parse().ok(),
        None => without_leading_zeroes(s).parse().ok(),
    }
}

fn parse_net(key: &str, s: &str) -> Result<IpNetwork, IpamError> {
    parse_cidr(s).ok_or_else(|| bad(key, s, "not an IP address or CIDR"))
}

fn parse_ip(key: &str, s: &str) -> Result<IpAddr, IpamError> {
    parse_addr(s).ok_or_else(|| bad(key, s, "not an IP address"))
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
    /// Parse `range` (`198.18.0.0/24`; host bits are ignored, as whereabouts does; or `A-B/nn`),
    /// with the optional `range_start`, `range_end`, `exclude` and `gateway`.
    pub fn parse(spec: &RangeSpec<'_>) -> Result<IpRange, IpamError> {
        let (mut start, mut end, network) = match spec.range.split_once('-') {
            Some((a, b_nn)) => {
                let b = parse_net("range", b_nn).map_err(|_| bad("range", spec.range, "expected A-B/prefix"))?;
                if !b_nn.contains('/') {
                    return Err(bad("range", spec.range, "expected A-B/prefix"));
                }
                let a = parse_ip("range", a).map_err(|_| bad("range", spec.range, "expected A-B/prefix"))?;
                if a.is_ipv4() != b.is_ipv4() || !b.contains(a) {
                    return Err(bad(
                        "range",
                        spec.range,
                        format!("start {a} is not inside {}/{}", b.network(), b.prefix()),
                    ));
                }
                (Some(a), Some(b.ip()), b)
            }
            None => {
                if !spec.range.contains('/') {
                    return Err(bad("range", spec.range, "expected a CIDR such as 198.18.0.0/24"));
                }
                (None, None, parse_net("range", spec.range)?)
            }
        };
        let network = IpNetwork::new(network.network(), network.prefix()).expect("valid prefix");
        let v4 = network.is_ipv4();
        // whereabouts ignores bounds it cannot use; a config that works there works here, and
        // the log says what was ignored.
        let ignored = |key: &str, value: &str, why: &str| {
            tracing::warn!("{key} {value:?} ignored: {why} (whereabouts ignores it too)");
        };
        if let Some(s) = spec.range_start {
            match parse_addr(s) {
                Some(ip) => start = Some(ip),
                None => ignored("range_start", s, "not an IP address"),
            }
        }
        if let Some(e) = spec.range_end {
            match parse_addr(e) {
                Some(ip) => end = Some(ip),
                None => ignored("range_end", e, "not an IP address"),
            }
        }
        let base = to_u128(network.network());
        let bits: u32 = if v4 { 32 } else { 128 };
        let size_bits = bits - u32::from(network.prefix());
        let span: u128 = if size_bits >= 128 { u128::MAX } else { (1u128 << size_bits) - 1 };
        // Never the network address nor the last address (IPv4 broadcast, IPv6 all-ones), as
        // whereabouts; point-to-point /31, /32, /127 and /128 use every address (an extension).
        let tiny = size_bits <= 1;
        let mut first = if tiny { 0 } else { 1 };
        let mut last = if tiny { span } else { span - 1 };
        let usable = |ip: IpAddr, lo: u128| {
            ip.is_ipv4() == v4 && network.contains(ip) && (lo..=last).contains(&(to_u128(ip) - base))
        };
        if let Some(s) = start {
            if usable(s, first) {
                first = to_u128(s) - base;
            } else {
                ignored("range_start", &s.to_string(), &format!("not a usable address of {network}"));
            }
        }
        if let Some(e) = end {
            if usable(e, first) {
                last = to_u128(e) - base;
            } else {
                ignored("range_end", &e.to_string(), &format!("not a usable address of {network} from the start on"));
            }
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
        let r = IpRange { network, first, last, excluded: merged(excluded), gateway };
        if r.capacity() == 0 {
            return Err(bad("range", spec.range, "every address is excluded: no address to hand out"));
        }
        Ok(r)
    }

    /// The offsets `first..=last` of `network` with the `excluded` spans (any order, overlapping
    /// or not) and the gateway left out: a node's block of a pool ([`crate::pools`]).
    pub fn span(
        network: IpNetwork,
        first: u128,
        last: u128,
        excluded: Vec<(u128, u128)>,
        gateway: Option<IpAddr>,
    ) -> IpRange {
        let network = IpNetwork::new(network.network(), network.prefix()).expect("valid prefix");
        let mut excluded = excluded;
        if let Some(g) = gateway.filter(|g| g.is_ipv4() == network.is_ipv4() && network.contains(*g)) {
            let o = to_u128(g) - to_u128(network.network());
            excluded.push((o, o));
        }
        IpRange { network, first, last, excluded: merged(excluded), gateway }
    }

    /// This range with `ips` excluded besides what it excludes (each one that lies in it).
    pub fn excluding(&self, ips: &[IpAddr]) -> IpRange {
        let mut excluded = self.excluded.clone();
        excluded.extend(ips.iter().filter_map(|ip| self.offset_of(*ip)).map(|o| (o, o)));
        IpRange { excluded: merged(excluded), ..self.clone() }
    }

    pub fn is_ipv4(&self) -> bool {
        self.network.is_ipv4()
    }

    /// The address at `offset`.
    pub fn addr(&self, offset: u128) -> IpAddr {
        from_u128(to_u128(self.network.network()) + offset, self.is_ipv4())
    }

    /// Whether `offset` names an address of the network at all (a stored key may not: a pool is
    /// outside input).
    pub fn in_network(&self, offset: u128) -> bool {
        let bits: u32 = if self.is_ipv4() { 32 } else { 128 };
        let host_bits = bits - u32::from(self.network.prefix());
        host_bits >= 128 || offset < (1u128 << host_bits)
    }

    /// The offset of `ip`, if it is an address this range may hand out.
    pub fn offset_of(&self, ip: IpAddr) -> Option<u128> {
        if ip.is_ipv4() != self.is_ipv4() || !self.network.contains(ip) {
            return None;
        }
        let o = to_u128(ip) - to_u128(self.network.network());
        (o >= self.first && o <= self.last && !self.is_excluded(o)).then_some(o)
    }

    /// The excluded span holding `offset`, if any: found by binary search (the spans are sorted
    /// and merged), so a config with many exclusions costs a search, not a walk, per candidate.
    fn excluded_span(&self, offset: u128) -> Option<(u128, u128)> {
        let i = self.excluded.partition_point(|&(lo, _)| lo <= offset);
        i.checked_sub(1).map(|i| self.excluded[i]).filter(|&(_, hi)| offset <= hi)
    }

    pub fn is_excluded(&self, offset: u128) -> bool {
        self.excluded_span(offset).is_some()
    }

    /// If `offset` is excluded, the first offset after its excluded span.
    pub fn skip_excluded(&self, offset: u128) -> u128 {
        match self.excluded_span(offset) {
            Some((_, hi)) => hi.saturating_add(1),
            None => offset,
        }
    }

    /// This range with no offset above `max` (a store that cannot hold larger offsets): an error
    /// naming the range when nothing usable is left at or below `max`. `why` says whose limit it is.
    pub fn capped(&self, max: u128, why: &str) -> Result<IpRange, IpamError> {
        let shown = |r: &IpRange| format!("{}-{}", r.addr(r.first), r.addr(r.last));
        if self.first > max {
            return Err(IpamError::Config(format!(
                "range {} (usable {}) starts above {}: {why}",
                self.network,
                shown(self),
                self.addr(max)
            )));
        }
        let capped = IpRange { last: self.last.min(max), ..self.clone() };
        if capped.capacity() == 0 {
            return Err(IpamError::Config(format!(
                "range {} (usable {}): every address up to {} is excluded: {why}",
                self.network,
                shown(self),
                self.addr(max)
            )));
        }
        Ok(capped)
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

/// Excluded spans sorted, the overlapping and adjacent ones made one: what binary search walks.
fn merged(mut spans: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    spans.sort_unstable();
    let mut merged: Vec<(u128, u128)> = Vec::new();
    for (lo, hi) in spans {
        match merged.last_mut() {
            Some(prev) if lo <= prev.1.saturating_add(1) => prev.1 = prev.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
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
    fn a_dash_b_form_sets_the_bounds_and_host_bits_are_ignored_as_in_whereabouts() {
        let x = r("198.18.0.10-198.18.0.20/24");
        assert_eq!(
            (x.addr(x.first).to_string(), x.addr(x.last).to_string()),
            ("198.18.0.10".into(), "198.18.0.20".into())
        );
        assert_eq!(x.network.to_string(), "198.18.0.0/24");
        let y = r("198.18.0.44/28");
        assert_eq!(y.network.to_string(), "198.18.0.32/28");
        assert_eq!(y.addr(y.first).to_string(), "198.18.0.33", "the network's first usable address");
        assert_eq!(y.addr(y.last).to_string(), "198.18.0.46");
    }

    #[test]
    fn wide_ipv6_ranges_use_128_bit_offsets_and_never_the_all_ones_address() {
        let x = r("2001:db8::/32");
        assert_eq!(x.capacity(), (1u128 << 96) - 2);
        assert_eq!(x.addr(x.last).to_string(), "2001:db8:ffff:ffff:ffff:ffff:ffff:fffe");
        let whole = r("2001:db8::/64");
        assert!(whole.offset_of("2001:db8::ffff:ffff:ffff:fffe".parse().unwrap()).is_some());
        assert!(whole.offset_of("2001:db8::ffff:ffff:ffff:ffff".parse().unwrap()).is_none());
        let small = r("2001:db8::/126");
        assert_eq!(small.capacity(), 2, "::1 and ::2, as whereabouts");
    }

    #[test]
    fn point_to_point_ranges_use_every_address() {
        for (range, first, last) in [
            ("198.18.0.0/31", "198.18.0.0", "198.18.0.1"),
            ("198.18.0.7/32", "198.18.0.7", "198.18.0.7"),
            ("2001:db8::/127", "2001:db8::", "2001:db8::1"),
            ("2001:db8::9/128", "2001:db8::9", "2001:db8::9"),
        ] {
            let x = r(range);
            assert_eq!(
                (x.addr(x.first).to_string(), x.addr(x.last).to_string()),
                (first.into(), last.into()),
                "{range}"
            );
        }
    }

    #[test]
    fn leading_zeroes_are_decimal_as_whereabouts_reads_them() {
        let x = IpRange::parse(&RangeSpec {
            range: "00192.00168.1.5-000000192.168.1.25/24",
            range_start: None,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (x.addr(x.first).to_string(), x.addr(x.last).to_string()),
            ("192.168.1.5".into(), "192.168.1.25".into())
        );
        let y = IpRange::parse(&RangeSpec {
            range: "00192.00168.1.0/24",
            range_start: Some("00192.00168.1.44"),
            range_end: Some("00192.00168.01.209"),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (y.addr(y.first).to_string(), y.addr(y.last).to_string()),
            ("192.168.1.44".into(), "192.168.1.209".into())
        );
        assert_eq!(parse_addr("010.1.1.1").unwrap().to_string(), "10.1.1.1", "decimal, never octal");
    }

    #[test]
    fn bounds_whereabouts_ignores_are_ignored_not_refused() {
        let bounds = |start: Option<&str>, end: Option<&str>| {
            let x = IpRange::parse(&RangeSpec {
                range: "198.18.0.0/24",
                range_start: start,
                range_end: end,
                ..Default::default()
            })
            .unwrap();
            (x.addr(x.first).to_string(), x.addr(x.last).to_string())
        };
        let all = ("198.18.0.1".to_string(), "198.18.0.254".to_string());
        assert_eq!(bounds(Some("198.19.0.150"), Some("198.20.0.100")), all, "both outside");
        assert_eq!(bounds(Some("198.18.0.0"), Some("198.18.0.255")), all, "network and broadcast");
        assert_eq!(bounds(Some("2001:db8::1"), None), all, "other family");
        assert_eq!(bounds(Some("bogus"), None), all, "not an address");
        assert_eq!(
            bounds(Some("198.18.0.100"), Some("198.18.0.50")),
            ("198.18.0.100".into(), "198.18.0.254".into()),
            "reversed: the end is ignored"
        );
        assert_eq!(bounds(Some("198.18.0.50"), Some("198.18.0.50")), ("198.18.0.50".into(), "198.18.0.50".into()));
        let x = r("198.18.0.25-198.18.0.5/24");
        assert_eq!(
            (x.addr(x.first).to_string(), x.addr(x.last).to_string()),
            ("198.18.0.25".into(), "198.18.0.254".into())
        );
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
    fn thousands_of_exclusions_are_found_by_search_not_by_walk() {
        let base = u32::from(std::net::Ipv4Addr::new(198, 18, 0, 0));
        let exclude: Vec<String> = (0..50_000u32).map(|i| std::net::Ipv4Addr::from(base + i * 2).to_string()).collect();
        let x = IpRange::parse(&RangeSpec { range: "198.18.0.0/15", exclude: &exclude, ..Default::default() }).unwrap();
        assert_eq!(x.excluded.len(), 50_000, "every other address: nothing merges");
        let started = std::time::Instant::now();
        let walked: Vec<u128> = crate::store::Candidates::after(&x, None).take(50_000).collect();
        assert_eq!(walked[..3], [1, 3, 5]);
        assert!(walked.iter().all(|o| !x.is_excluded(*o)));
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
    }

    #[test]
    fn a_range_capped_at_a_store_limit_keeps_what_is_below_or_names_why_nothing_is() {
        let max = (1u128 << 63) - 1;
        let x = r("2001:db8::/64").capped(max, "limit").unwrap();
        assert_eq!(x.last, max);
        let above = IpRange::parse(&RangeSpec {
            range: "2001:db8:1::/64",
            range_start: Some("2001:db8:1::8000:0:0:0"),
            ..Default::default()
        })
        .unwrap();
        let e = above.capped(max, "the store's limit").unwrap_err();
        assert!(e.to_string().starts_with("range 2001:db8:1::/64 (usable 2001:db8:1:0:8000::-"), "{e}");
        assert!(e.to_string().ends_with("starts above 2001:db8:1:0:7fff:ffff:ffff:ffff: the store's limit"), "{e}");
        let lower_half_excluded = IpRange::parse(&RangeSpec {
            range: "2001:db8:1::/64",
            exclude: &["2001:db8:1::/65".into()],
            ..Default::default()
        })
        .unwrap();
        let e = lower_half_excluded.capped(max, "limit").unwrap_err();
        assert!(e.to_string().contains("every address up to 2001:db8:1:0:7fff:ffff:ffff:ffff is excluded"), "{e}");
        assert_eq!(r("198.18.0.0/24").capped(max, "limit").unwrap(), r("198.18.0.0/24"), "nothing to cap");
    }

    #[test]
    fn bad_ranges_name_the_key_and_value() {
        for (range, want) in [
            ("198.18.0.0", "invalid range \"198.18.0.0\""),
            ("nonsense/24", "invalid range \"nonsense/24\""),
            ("198.18.0.5/33", "invalid range \"198.18.0.5/33\""),
            ("198.18.1.5-198.18.2.25/28", "start 198.18.1.5 is not inside 198.18.2.16/28"),
            ("bogus-198.18.1.25/24", "expected A-B/prefix"),
        ] {
            let e = IpRange::parse(&RangeSpec { range, ..Default::default() }).unwrap_err();
            assert!(e.to_string().contains(want), "{range}: {e}");
        }
    }
}
