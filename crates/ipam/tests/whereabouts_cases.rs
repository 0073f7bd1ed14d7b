//! whereabouts' own test cases (v0.9.4: pkg/allocate, pkg/config, pkg/iphelpers and cmd tests),
//! restated as tables and run against plexus-ipam: the same configuration hands out the same
//! address, or plexus differs on purpose and the row says why (README, "Where plexus differs").
//!
//! "reserved" addresses are held by other attachments first (requested explicitly), then a new
//! attachment asks for one: on a fresh store plexus's next-fit and whereabouts' lowest-free agree.

use std::net::IpAddr;

use plexus_cni::NetConf;
use plexus_ipam_core::store::{AllocRequest, Context, Owner};
use plexus_ipam_core::{IpamConfig, IpamError};
use plexus_node::Policy;
use serde_json::{Value, json};
use std::time::Duration;

fn policy(dir: &std::path::Path) -> Policy {
    Policy::parse(json!({"dataRoots": [dir]}).to_string().as_bytes()).unwrap()
}

fn config(ipam: Value, dir: &std::path::Path) -> Result<IpamConfig, IpamError> {
    let mut ipam = ipam;
    ipam["type"] = json!("plexus-ipam");
    ipam["dataDir"] = json!(dir.join("ipam"));
    let nc: NetConf = serde_json::from_value(json!({"cniVersion": "1.0.0", "name": "n", "ipam": ipam})).unwrap();
    IpamConfig::from_netconf(&nc, &policy(dir))
}

fn owner(cid: &str) -> Owner {
    Owner { container_id: cid.into(), ifname: "eth0".into(), pod_ref: None, node: "node-a".into(), network: "n".into() }
}

/// The address a new attachment gets in range 0 after `reserved` are held; the error text else.
fn first_free(ipam: Value, reserved: &[&str]) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(ipam, dir.path()).map_err(|e| e.to_string())?;
    let policy = policy(dir.path());
    let cx =
        Context { policy: &policy, namespace: None, deadline: plexus_cni::Deadline::after(Duration::from_secs(30)) };
    let store = plexus_ipam_core::store::open(&cfg, &cx).map_err(|e| e.to_string())?;
    let ask = |cid: &str, want: Option<IpAddr>| {
        let mut requested = vec![None; cfg.ranges.len()];
        requested[0] = want;
        store.allocate(&AllocRequest {
            owner: owner(cid),
            ranges: &cfg.ranges,
            requested,
            overlapping: cfg.overlapping,
        })
    };
    for (i, r) in reserved.iter().enumerate() {
        ask(&format!("held{i}"), Some(r.parse().unwrap())).unwrap();
    }
    ask("new", None).map(|ips| ips[0].to_string()).map_err(|e| e.to_string())
}

/// Usable bounds of a range, as (first, last).
fn bounds(ipam: Value) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let r = &config(ipam, dir.path()).unwrap().ranges[0];
    (r.addr(r.first).to_string(), r.addr(r.last).to_string())
}

/// (case, IPAM config, addresses held first, the new attachment's address or an error excerpt)
type AllocCase = (&'static str, Value, &'static [&'static str], Result<&'static str, &'static str>);

#[test]
fn allocate_test_cases_hand_out_the_same_first_address() {
    // pkg/allocate/allocate_test.go: 22 cases (the reserve-list cases are the "hole" rows).
    let cases: &[AllocCase] = &[
        ("v4 basic, host bits", json!({"range": "192.168.1.1/24"}), &[], Ok("192.168.1.1")),
        ("v6 no leading zero", json!({"range": "caa5::0/112"}), &[], Ok("caa5::1")),
        ("v6 all-zero first hextet", json!({"range": "::1/126"}), &[], Ok("::1")),
        ("v6 two leading zeroes", json!({"range": "fd::1/116"}), &[], Ok("fd::1")),
        ("v6 leading zeroes", json!({"range": "100::2:1/126"}), &[], Ok("100::2:1")),
        ("v4 exclude CIDR", json!({"range": "192.168.0.0/29", "exclude": ["192.168.0.0/30"]}), &[], Ok("192.168.0.4")),
        ("v4 exclude one IP", json!({"range": "192.168.0.0/29", "exclude": ["192.168.0.1"]}), &[], Ok("192.168.0.2")),
        (
            "v4 bad exclude",
            json!({"range": "192.168.0.0/29", "exclude": ["192.168.0.1/123"]}),
            &[],
            Err("invalid exclude \"192.168.0.1/123\""),
        ),
        (
            "v6 exclude CIDR, host bits",
            json!({"range": "100::2:1/125", "exclude": ["100::2:1/126"]}),
            &[],
            Ok("100::2:4"),
        ),
        ("v6 exclude one IP", json!({"range": "100::2:1/125", "exclude": ["100::2:1"]}), &[], Ok("100::2:2")),
        (
            "v6 bad exclude",
            json!({"range": "100::2:1/125", "exclude": ["100::2::1"]}),
            &[],
            Err("invalid exclude \"100::2::1\""),
        ),
        ("v6 huge exclude", json!({"range": "2001:db8::/30", "exclude": ["2001:db8::0/32"]}), &[], Ok("2001:db9::")),
        (
            "v4 unsorted excludes a",
            json!({"range": "192.168.0.0/28", "exclude": ["192.168.0.0/30", "192.168.0.6/31", "192.168.0.8/31", "192.168.0.4/30"]}),
            &[],
            Ok("192.168.0.10"),
        ),
        (
            "v4 unsorted excludes b",
            json!({"range": "192.168.0.0/28", "exclude": ["192.168.0.0/30", "192.168.0.14/31", "192.168.0.4/30", "192.168.0.6/31", "192.168.0.8/31"]}),
            &[],
            Ok("192.168.0.10"),
        ),
        (
            "v4 exhausted, excluded and held",
            json!({"range": "192.168.0.0/29", "range_start": "192.168.0.0", "exclude": ["192.168.0.0/30"]}),
            &["192.168.0.4", "192.168.0.5", "192.168.0.6"],
            Err("no free address left"),
        ),
        (
            "v4 exhausted, last block excluded",
            json!({"range": "192.168.0.0/29", "exclude": ["192.168.0.4/30"]}),
            &["192.168.0.1", "192.168.0.2", "192.168.0.3"],
            Err("no free address left"),
        ),
        (
            "v6 exhausted, all-ones never usable",
            json!({"range": "100::2:1/125", "range_start": "100::2:1", "exclude": ["100::2:4/126"]}),
            &["100::2:1", "100::2:2", "100::2:3"],
            Err("no free address left"),
        ),
        (
            "start at the network address",
            json!({"range": "192.168.0.0/29", "range_start": "192.168.0.0"}),
            &[],
            Ok("192.168.0.1"),
        ),
        (
            "start and end outside",
            json!({"range": "192.168.0.0/29", "range_start": "192.168.0.0", "range_end": "192.168.0.8"}),
            &[],
            Ok("192.168.0.1"),
        ),
        (
            "end respected though excluded",
            json!({"range": "192.168.0.0/28", "range_start": "192.168.0.1", "range_end": "192.168.0.6", "exclude": ["192.168.0.4/30"]}),
            &["192.168.0.1", "192.168.0.2", "192.168.0.3"],
            Err("no free address left"),
        ),
        (
            "reserve list empty",
            json!({"range": "192.168.0.0/28", "range_start": "192.168.0.1", "range_end": "192.168.0.6"}),
            &[],
            Ok("192.168.0.1"),
        ),
        (
            "reserve list .1 .2 .3",
            json!({"range": "192.168.0.0/28", "range_start": "192.168.0.1", "range_end": "192.168.0.6"}),
            &["192.168.0.1", "192.168.0.2", "192.168.0.3"],
            Ok("192.168.0.4"),
        ),
        (
            "reserve list with a hole",
            json!({"range": "192.168.0.0/28", "range_start": "192.168.0.1", "range_end": "192.168.0.6"}),
            &["192.168.0.1", "192.168.0.2", "192.168.0.5"],
            Ok("192.168.0.3"),
        ),
    ];
    for (name, ipam, reserved, want) in cases {
        let got = first_free(ipam.clone(), reserved);
        match (want, &got) {
            (Ok(w), Ok(g)) => assert_eq!(g, w, "{name}"),
            (Err(w), Err(g)) => assert!(g.contains(w), "{name}: {g}"),
            _ => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn config_test_cases_parse_to_the_same_range() {
    // pkg/config/config_test.go (the cases about ranges; the flat file, kubeconfig and
    // whereabouts' own type check have no plexus counterpart).
    let cases: &[(&str, Value, (&str, &str))] = &[
        ("A-B/nn", json!({"range": "192.168.1.5-192.168.1.25/24"}), ("192.168.1.5", "192.168.1.25")),
        (
            "leading zeroes A-B",
            json!({"range": "00192.00168.1.5-000000192.168.1.25/24"}),
            ("192.168.1.5", "192.168.1.25"),
        ),
        ("leading zeroes CIDR", json!({"range": "00192.00168.1.0/24"}), ("192.168.1.1", "192.168.1.254")),
        (
            "leading zeroes start",
            json!({"range": "00192.00168.1.0/24", "range_start": "00192.00168.1.44"}),
            ("192.168.1.44", "192.168.1.254"),
        ),
        (
            "leading zeroes start and end",
            json!({"range": "00192.00168.1.0/24", "range_start": "00192.00168.1.44", "range_end": "00192.00168.01.209"}),
            ("192.168.1.44", "192.168.1.209"),
        ),
        (
            "host bits with a start",
            json!({"range": "192.168.2.230/24", "range_start": "192.168.2.223"}),
            ("192.168.2.223", "192.168.2.254"),
        ),
    ];
    for (name, ipam, (first, last)) in cases {
        assert_eq!(bounds(ipam.clone()), (first.to_string(), last.to_string()), "{name}");
    }
    let dir = tempfile::tempdir().unwrap();
    let e = config(json!({"range": "192.168.1.5-192.168.2.25/28"}), dir.path()).unwrap_err();
    assert!(e.to_string().contains("start 192.168.1.5 is not inside 192.168.2.16/28"), "A outside B/nn: {e}");
    let nc: NetConf = serde_json::from_value(json!({"cniVersion": "1.0.0", "name": "n", "type": "bridge"})).unwrap();
    let e = IpamConfig::from_netconf(&nc, &Policy::default()).unwrap_err();
    assert!(e.to_string().contains("missing \"ipam\" section"), "{e}");
    let overlap = |v: Option<bool>| {
        let mut ipam = json!({"range": "192.168.1.0/24"});
        if let Some(v) = v {
            ipam["enable_overlapping_ranges"] = json!(v);
        }
        config(ipam, dir.path()).unwrap().overlapping
    };
    assert_eq!((overlap(None), overlap(Some(true)), overlap(Some(false))), (true, true, false));
}

#[test]
fn iphelpers_usable_ranges_match_and_point_to_point_ranges_are_an_extension() {
    // pkg/iphelpers: GetIPRange, FirstUsableIP, LastUsableIP.
    let cases: &[(&str, Value, (&str, &str))] = &[
        ("v4 /30", json!({"range": "192.168.21.100/30"}), ("192.168.21.101", "192.168.21.102")),
        (
            "v4 start",
            json!({"range": "192.168.2.200/24", "range_start": "192.168.2.23"}),
            ("192.168.2.23", "192.168.2.254"),
        ),
        ("v4 /27", json!({"range": "192.168.2.200/27"}), ("192.168.2.193", "192.168.2.222")),
        ("v4 /24", json!({"range": "192.168.2.200/24"}), ("192.168.2.1", "192.168.2.254")),
        (
            "v4 end",
            json!({"range": "192.168.2.200/24", "range_end": "192.168.2.100"}),
            ("192.168.2.1", "192.168.2.100"),
        ),
        (
            "v4 start and end",
            json!({"range": "192.168.2.200/24", "range_start": "192.168.2.50", "range_end": "192.168.2.100"}),
            ("192.168.2.50", "192.168.2.100"),
        ),
        (
            "v4 both outside",
            json!({"range": "192.168.2.200/24", "range_start": "192.168.1.150", "range_end": "192.168.3.100"}),
            ("192.168.2.1", "192.168.2.254"),
        ),
        (
            "v4 reversed: end ignored",
            json!({"range": "192.168.2.200/24", "range_start": "192.168.2.100", "range_end": "192.168.2.50"}),
            ("192.168.2.100", "192.168.2.254"),
        ),
        (
            "v4 single",
            json!({"range": "192.168.2.200/24", "range_start": "192.168.2.50", "range_end": "192.168.2.50"}),
            ("192.168.2.50", "192.168.2.50"),
        ),
        ("v4 /23", json!({"range": "192.168.0.0/23"}), ("192.168.0.1", "192.168.1.254")),
        ("v6 /116", json!({"range": "2001::0/116"}), ("2001::1", "2001::ffe")),
        ("v6 /96 fd", json!({"range": "fd:db8:abcd:0012::0/96"}), ("fd:db8:abcd:12::1", "fd:db8:abcd:12::ffff:fffe")),
        (
            "v6 /96",
            json!({"range": "2001:db8:abcd:0012::0/96"}),
            ("2001:db8:abcd:12::1", "2001:db8:abcd:12::ffff:fffe"),
        ),
        (
            "v6 /64",
            json!({"range": "2001:db8:abcd:0012::/64"}),
            ("2001:db8:abcd:12::1", "2001:db8:abcd:12:ffff:ffff:ffff:fffe"),
        ),
        (
            "v6 end",
            json!({"range": "2001:db8:abcd:0012::/64", "range_end": "2001:db8:abcd:12::100"}),
            ("2001:db8:abcd:12::1", "2001:db8:abcd:12::100"),
        ),
        (
            "v6 start and end",
            json!({"range": "2001:db8:abcd:0012::/64", "range_start": "2001:db8:abcd:12::50", "range_end": "2001:db8:abcd:12::100"}),
            ("2001:db8:abcd:12::50", "2001:db8:abcd:12::100"),
        ),
        (
            "v6 both outside",
            json!({"range": "2001:db8:abcd:0012::/64", "range_start": "2000:db8:abcd:12::50", "range_end": "2003:db8:abcd:12::100"}),
            ("2001:db8:abcd:12::1", "2001:db8:abcd:12:ffff:ffff:ffff:fffe"),
        ),
        (
            "v6 reversed",
            json!({"range": "2001:db8:abcd:0012::/64", "range_start": "2001:db8:abcd:12::100", "range_end": "2001:db8:abcd:12::50"}),
            ("2001:db8:abcd:12::100", "2001:db8:abcd:12:ffff:ffff:ffff:fffe"),
        ),
        (
            "v6 single",
            json!({"range": "2001:db8:abcd:0012::/64", "range_start": "2001:db8:abcd:12::100", "range_end": "2001:db8:abcd:12::100"}),
            ("2001:db8:abcd:12::100", "2001:db8:abcd:12::100"),
        ),
        (
            "v6 start ending in zeroes",
            json!({"range": "2001:db8:480:603d::/64", "range_start": "2001:db8:480:603d:304:403::", "range_end": "2001:db8:480:603d:304:403:0:4"}),
            ("2001:db8:480:603d:304:403::", "2001:db8:480:603d:304:403:0:4"),
        ),
        ("v6 /126", json!({"range": "2000::/126"}), ("2000::1", "2000::2")),
        // whereabouts: "net mask is too short" at ADD. plexus: point-to-point, every address.
        ("v4 /31 (extension)", json!({"range": "192.168.0.0/31"}), ("192.168.0.0", "192.168.0.1")),
        ("v4 /32 (extension)", json!({"range": "192.168.0.0/32"}), ("192.168.0.0", "192.168.0.0")),
        ("v6 /127 (extension)", json!({"range": "2000::/127"}), ("2000::", "2000::1")),
        ("v6 /128 (extension)", json!({"range": "2000::/128"}), ("2000::", "2000::")),
    ];
    for (name, ipam, (first, last)) in cases {
        assert_eq!(bounds(ipam.clone()), (first.to_string(), last.to_string()), "{name}");
    }
}

#[test]
fn cmd_test_cases_give_the_same_results() {
    // cmd/whereabouts_test.go: first address of each configuration.
    let cases: &[(&str, Value, Result<&str, &str>)] = &[
        ("A-B/nn start", json!({"range": "192.168.1.5-192.168.1.25/24", "gateway": "192.168.10.1"}), Ok("192.168.1.5")),
        ("range_start", json!({"range": "192.168.1.0/24", "range_start": "192.168.1.5"}), Ok("192.168.1.5")),
        ("v6 leading-zero hextet", json!({"range": "fd::1/116", "gateway": "fd::f:1"}), Ok("fd::1")),
        (
            "v6 range ending in zeroes",
            json!({"range": "2001:db8:480:603d:0304:0403:000:0000-2001:db8:480:603d:0304:0403:0000:0004/64"}),
            Ok("2001:db8:480:603d:304:403::"),
        ),
        (
            "v6 start = network",
            json!({"range": "2001:db8:5422:0005::-2001:db8:5422:0005:7fff:ffff:ffff:ffff/64"}),
            Ok("2001:db8:5422:5::1"),
        ),
        (
            "DNS-1123 pool name case",
            json!({"range": "fd00:0:0:10:0:0:3:1-fd00:0:0:10:0:0:3:6/64", "gateway": "2001::f:1"}),
            Ok("fd00::10:0:0:3:1"),
        ),
        (
            "exclude v4",
            json!({"range": "192.168.1.0/24", "exclude": ["192.168.1.0/28", "192.168.1.16/28"], "gateway": "192.168.10.1"}),
            Ok("192.168.1.32"),
        ),
        (
            "exclude v6 /128s",
            json!({"range": "2001::1/116", "exclude": ["2001::0/128", "2001::1/128", "2001::2/128"], "gateway": "2001::f:1"}),
            Ok("2001::3"),
        ),
        (
            "exclude v6 half",
            json!({"range": "caa5::0/112", "exclude": ["caa5::0/113"], "gateway": "2001::f:1"}),
            Ok("caa5::8000"),
        ),
        ("host bits", json!({"range": "192.168.1.44/28", "gateway": "192.168.1.1"}), Ok("192.168.1.33")),
        ("single ipRanges entry", json!({"ipRanges": [{"range": "192.168.10.1/24"}]}), Ok("192.168.10.1")),
        // Deliberate difference: whereabouts hands the gateway out; plexus never does.
        (
            "gateway inside the range (differs)",
            json!({"range": "192.168.1.0/24", "gateway": "192.168.1.1"}),
            Ok("192.168.1.2"),
        ),
    ];
    for (name, ipam, want) in cases {
        let got = first_free(ipam.clone(), &[]);
        match (want, &got) {
            (Ok(w), Ok(g)) => assert_eq!(g, w, "{name}"),
            (Err(w), Err(g)) => assert!(g.contains(w), "{name}: {g}"),
            _ => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
    // range_end exhaustion: .5 to .12 are eight addresses, the ninth attachment finds none.
    let held: Vec<String> = (5..=12).map(|i| format!("192.168.1.{i}")).collect();
    let held: Vec<&str> = held.iter().map(String::as_str).collect();
    let e = first_free(
        json!({"range": "192.168.1.0/24", "range_start": "192.168.1.5", "range_end": "192.168.1.12"}),
        &held,
    );
    assert!(e.unwrap_err().contains("no free address left"));
}

#[test]
fn results_carry_allocated_then_static_addresses_with_gateways_routes_and_dns() {
    // cmd/whereabouts_test.go "static addresses + routes + dns" and the probe of CNI_ARGS.
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        json!({"range": "192.168.1.44/28", "gateway": "192.168.1.1",
               "addresses": [{"address": "10.10.0.1/24", "gateway": "10.10.0.254"},
                             {"address": "3ffe:ffff:0:01ff::1/64", "gateway": "3ffe:ffff:0::1"}],
               "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.10.5.1"}],
               "dns": {"nameservers": ["8.8.8.8"], "domain": "example.com"}}),
        dir.path(),
    )
    .unwrap();
    let r = cfg.result(&["192.168.1.33".parse().unwrap()], &[]);
    let ips: Vec<(String, Option<String>)> =
        r.ips.iter().map(|i| (i.address.to_string(), i.gateway.map(|g| g.to_string()))).collect();
    assert_eq!(
        ips,
        [
            ("192.168.1.33/28".to_string(), Some("192.168.1.1".to_string())),
            ("10.10.0.1/24".to_string(), Some("10.10.0.254".to_string())),
            ("3ffe:ffff:0:1ff::1/64".to_string(), Some("3ffe:ffff::1".to_string())),
        ]
    );
    assert_eq!(r.routes.len(), 2);
    assert_eq!(r.dns.nameservers, ["8.8.8.8"]);
    // CNI_ARGS GATEWAY=: the gateway of the addresses whose network holds it.
    let r = cfg.result(&["192.168.1.33".parse().unwrap()], &["10.10.0.1".parse().unwrap()]);
    assert_eq!(r.ips[1].gateway.unwrap().to_string(), "10.10.0.1");
    assert_eq!(r.ips[0].gateway.unwrap().to_string(), "192.168.1.1", "not in 10.10.0.0/24: unchanged");
    // A static address needs a prefix, as in whereabouts.
    let e =
        config(json!({"range": "192.168.1.0/24", "addresses": [{"address": "10.10.0.1"}]}), dir.path()).unwrap_err();
    assert!(e.to_string().contains("invalid addresses entry \"10.10.0.1\": a CIDR such as"), "{e}");
}

#[test]
fn ip_ranges_come_after_the_top_level_range_and_the_top_level_exclude_stays_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(json!({"range": "abcd::1/64", "ipRanges": [{"range": "192.168.10.1/24"}]}), dir.path()).unwrap();
    let firsts: Vec<String> = cfg.ranges.iter().map(|r| r.addr(r.first).to_string()).collect();
    assert_eq!(firsts, ["abcd::1", "192.168.10.1"], "the top-level range comes first");
    let cfg = config(json!({"ipRanges": [{"range": "10.0.0.0/24"}], "exclude": ["10.0.0.0/28"]}), dir.path()).unwrap();
    assert!(cfg.ranges[0].excluded.is_empty(), "a top-level exclude applies to the top-level range only");
}

#[test]
fn overlapping_ranges_share_addresses_only_when_overlap_is_disabled() {
    // cmd/whereabouts_test.go: pod A on a /24, then pod B on a /28 inside it.
    for (a_overlap, a_range, b_range, want_a, want_b) in [
        (None, "192.168.22.0/24", "192.168.22.0/28", "192.168.22.1", "192.168.22.2"),
        (None, "2001::2:3:0/124", "2001::2:3:0/126", "2001::2:3:1", "2001::2:3:2"),
        (Some(false), "192.168.33.0/24", "192.168.33.0/28", "192.168.33.1", "192.168.33.1"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let get = |range: &str, overlap: Option<bool>, cid: &str| {
            let mut ipam = json!({"range": range});
            if let Some(o) = overlap {
                ipam["enable_overlapping_ranges"] = json!(o);
            }
            let cfg = config(ipam, dir.path()).unwrap();
            let policy = policy(dir.path());
            let cx = Context {
                policy: &policy,
                namespace: None,
                deadline: plexus_cni::Deadline::after(Duration::from_secs(30)),
            };
            let store = plexus_ipam_core::store::open(&cfg, &cx).unwrap();
            let req = AllocRequest {
                owner: owner(cid),
                ranges: &cfg.ranges,
                requested: vec![None],
                overlapping: cfg.overlapping,
            };
            store.allocate(&req).unwrap()[0].to_string()
        };
        assert_eq!(get(a_range, a_overlap, "a"), want_a, "{a_range}");
        assert_eq!(get(b_range, None, "b"), want_b, "{b_range} after {a_range} (overlap {a_overlap:?})");
    }
}
