//! The names of whereabouts' objects: an IPPool's for a range, an OverlappingRangeIPReservation's
//! for an address.

use std::net::IpAddr;

use crate::range::IpRange;

/// An IPPool's name for `range` (whereabouts' `IPPoolName`, default naming).
pub fn pool_name(network_name: Option<&str>, range: &IpRange) -> String {
    let mut r = range.network.to_string();
    if r.ends_with(':') {
        r.push('0');
    }
    let r = r.replace([':', '/'], "-");
    match network_name {
        Some(n) => format!("{n}-{r}"),
        None => r,
    }
}

/// An OverlappingRangeIPReservation's name for `ip` (whereabouts' `NormalizeIP`).
pub fn reservation_name(network_name: Option<&str>, ip: IpAddr) -> String {
    let mut s = ip.to_string();
    if s.ends_with(':') {
        s.push('0');
    }
    let s = s.replace(':', "-");
    match network_name {
        Some(n) => format!("{n}-{s}"),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::range::RangeSpec;

    fn range(r: &str) -> IpRange {
        IpRange::parse(&RangeSpec { range: r, ..Default::default() }).unwrap()
    }

    #[test]
    fn object_names_are_whereabouts_names() {
        assert_eq!(pool_name(None, &range("198.18.0.0/24")), "198.18.0.0-24");
        assert_eq!(pool_name(Some("rail0"), &range("198.18.0.0/24")), "rail0-198.18.0.0-24");
        assert_eq!(pool_name(None, &range("2001:db8::/64")), "2001-db8---64");
        assert_eq!(reservation_name(None, "198.18.0.5".parse().unwrap()), "198.18.0.5");
        assert_eq!(reservation_name(None, "2001:db8::".parse().unwrap()), "2001-db8--0");
        assert_eq!(reservation_name(Some("rail0"), "2001:db8::5".parse().unwrap()), "rail0-2001-db8--5");
    }
}
