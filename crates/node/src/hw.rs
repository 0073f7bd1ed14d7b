//! The written forms of hardware addresses, said once: MAC addresses (`aa:bb:cc:dd:ee:ff`) and
//! PCI addresses (`dddd:bb:dd.f`), as configs, annotations and sysfs spell them.

/// Parse a MAC address, `aa:bb:cc:dd:ee:ff` (or with `-`, as Go's `net.ParseMAC` also takes).
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

/// A MAC address as `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(m: &[u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// A PCI address with its domain, `dddd:bb:dd.f` in hex (as sysfs names PCI devices).
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars().enumerate().all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn pci_addresses_have_a_domain_and_hex_digits_only() {
        assert!(is_pci_address("0000:3b:00.2"));
        assert!(is_pci_address("0000:AF:1f.7"));
        for bad in ["3b:00.2", "0000:3b:00:2", "zzzz:3b:00.2", "0000:3b:00.2 ", "0000-3b-00.2"] {
            assert!(!is_pci_address(bad), "{bad}");
        }
    }
}
