//! nv-ipam's `IPPool` (`nv-ipam.nvidia.com/v1alpha1`) as plexus reads it, and the block
//! arithmetic its controller uses, so that blocks plexus hands out and blocks nv-ipam's
//! controller hands out are the same blocks.
//!
//! ```text
//! spec.subnet              the network; pods' addresses carry its prefix
//! spec.perNodeBlockSize    addresses per node block; block i is [first + i·size, first + (i+1)·size − 1]
//!                          where first is the network's first address after the network address
//!                          (the network address itself on /31, /32, /127, /128)
//! spec.gateway             the pods' gateway; never handed out (a block holding it has one less)
//! spec.exclusions          [{startIP, endIP}] never handed out (nvidia-k8s-ipam #154)
//! spec.perNodeExclusions   [{startIndex, endIndex}] indexes within every block, never handed out
//! spec.nodeSelector        a core NodeSelector: which nodes get blocks (none: every node)
//! spec.defaultGateway      a default route through the gateway
//! spec.routes              [{dst}] routes through the gateway
//! status.allocations       [{nodeName, startIP, endIP}] the nodes' blocks
//! ```
//!
//! The object is the admin's (or nv-ipam's controller's): a tenant's network config names a pool,
//! never writes one. Still, what is read is checked as outside input: every address parsed and
//! inside the subnet, every walk bounded by what the object holds.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde_json::Value;

use crate::error::IpamError;
use crate::range::{IpRange, parse_addr, parse_cidr, to_u128};

/// The API group and version of nv-ipam's pools.
pub const GROUP_PATH: &str = "/apis/nv-ipam.nvidia.com/v1alpha1";
pub const API_VERSION: &str = "nv-ipam.nvidia.com/v1alpha1";

/// One node's block as `status.allocations` records it, as offsets from the network address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub node: String,
    pub first: u128,
    pub last: u128,
}

/// A pool as read.
#[derive(Clone, Debug)]
pub struct IpPool {
    pub name: String,
    pub resource_version: String,
    pub subnet: IpNetwork,
    pub block_size: u128,
    pub gateway: Option<IpAddr>,
    /// `spec.exclusions` as offset spans of the subnet (clipped to it).
    pub exclusions: Vec<(u128, u128)>,
    /// `spec.perNodeExclusions`: index spans within each block.
    pub per_node_exclusions: Vec<(u128, u128)>,
    pub node_selector: Option<Value>,
    pub default_gateway: bool,
    pub routes: Vec<IpNetwork>,
    /// Every entry of `status.allocations` that names a span of the subnet (a malformed one is
    /// left out, and no block is handed out over what it covers: see [`IpPool::taken`]).
    pub blocks: Vec<Block>,
    /// Spans of the subnet some entry covers, also entries not read as blocks.
    taken: Vec<(u128, u128)>,
    /// Whether the object has `status.allocations` at all (a claim adds the list, or appends).
    pub has_allocations: bool,
}

fn bad(pool: &str, key: &str, value: impl std::fmt::Display, why: impl std::fmt::Display) -> IpamError {
    IpamError::Config(format!("IPPool {pool}: {key} {value}: {why}"))
}

impl IpPool {
    /// Read an IPPool object. An error names the pool, the key and the value.
    pub fn from_object(obj: &Value) -> Result<IpPool, IpamError> {
        let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        let resource_version =
            obj.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default().to_string();
        let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
        let s = |k: &str| spec.get(k).and_then(Value::as_str);
        let subnet_text = s("subnet").unwrap_or_default();
        let subnet = parse_cidr(subnet_text)
            .filter(|_| subnet_text.contains('/'))
            .ok_or_else(|| bad(&name, "spec.subnet", format!("{subnet_text:?}"), "not a CIDR"))?;
        let subnet = IpNetwork::new(subnet.network(), subnet.prefix()).expect("valid prefix");
        let size = spec.get("perNodeBlockSize").and_then(Value::as_u64).unwrap_or(0);
        let span = host_span(subnet);
        if size == 0 || u128::from(size) > span {
            return Err(bad(&name, "spec.perNodeBlockSize", size, format!("must be 1 to the size of {subnet}")));
        }
        let in_subnet = |key: &str, text: &str| -> Result<u128, IpamError> {
            let ip = parse_addr(text).ok_or_else(|| bad(&name, key, format!("{text:?}"), "not an IP address"))?;
            if ip.is_ipv4() != subnet.is_ipv4() || !subnet.contains(ip) {
                return Err(bad(&name, key, ip, format!("not in {subnet}")));
            }
            Ok(to_u128(ip) - to_u128(subnet.network()))
        };
        let gateway = match s("gateway").filter(|g| !g.is_empty()) {
            Some(g) => Some(subnet_addr(subnet, in_subnet("spec.gateway", g)?)),
            None => None,
        };
        let mut exclusions = Vec::new();
        for (i, x) in list(&spec, "exclusions").iter().enumerate() {
            let key = |f: &str| format!("spec.exclusions[{i}].{f}");
            let lo = in_subnet(&key("startIP"), x.get("startIP").and_then(Value::as_str).unwrap_or_default())?;
            let hi = in_subnet(&key("endIP"), x.get("endIP").and_then(Value::as_str).unwrap_or_default())?;
            if hi < lo {
                return Err(bad(&name, &key("endIP"), subnet_addr(subnet, hi), "before its startIP"));
            }
            exclusions.push((lo, hi));
        }
        let mut per_node_exclusions = Vec::new();
        for (i, x) in list(&spec, "perNodeExclusions").iter().enumerate() {
            let index = |f: &str| x.get(f).and_then(Value::as_u64).map(u128::from);
            let key = format!("spec.perNodeExclusions[{i}]");
            match (index("startIndex"), index("endIndex")) {
                (Some(lo), Some(hi)) if lo <= hi && hi < u128::from(size) => per_node_exclusions.push((lo, hi)),
                _ => {
                    return Err(bad(&name, &key, x, format!("needs 0 <= startIndex <= endIndex < {size}")));
                }
            }
        }
        let mut routes = Vec::new();
        for (i, r) in list(&spec, "routes").iter().enumerate() {
            let dst = r.get("dst").and_then(Value::as_str).unwrap_or_default();
            let net =
                parse_cidr(dst).filter(|n| dst.contains('/') && n.is_ipv4() == subnet.is_ipv4()).ok_or_else(|| {
                    bad(
                        &name,
                        &format!("spec.routes[{i}].dst"),
                        format!("{dst:?}"),
                        "not a CIDR of the subnet's family",
                    )
                })?;
            routes.push(net);
        }
        let default_gateway = spec.get("defaultGateway").and_then(Value::as_bool).unwrap_or(false);
        if (default_gateway || !routes.is_empty()) && gateway.is_none() {
            return Err(bad(&name, "spec.gateway", "(none)", "routes and defaultGateway go through the gateway"));
        }
        let allocations = obj.pointer("/status/allocations").and_then(Value::as_array);
        let mut blocks = Vec::new();
        let mut taken = Vec::new();
        for a in allocations.into_iter().flatten() {
            let ip = |k: &str| a.get(k).and_then(Value::as_str).and_then(parse_addr);
            let (Some(start), Some(end)) = (ip("startIP"), ip("endIP")) else { continue };
            let offset = |ip: IpAddr| {
                (ip.is_ipv4() == subnet.is_ipv4() && subnet.contains(ip))
                    .then(|| to_u128(ip) - to_u128(subnet.network()))
            };
            let (Some(first), Some(last)) = (offset(start), offset(end)) else { continue };
            if first > last {
                continue;
            }
            taken.push((first, last));
            let node = a.get("nodeName").and_then(Value::as_str).unwrap_or_default();
            if !node.is_empty() {
                blocks.push(Block { node: node.to_string(), first, last });
            }
        }
        taken.sort_unstable();
        Ok(IpPool {
            name,
            resource_version,
            subnet,
            block_size: u128::from(size),
            gateway,
            exclusions,
            per_node_exclusions,
            node_selector: spec.get("nodeSelector").filter(|v| !v.is_null()).cloned(),
            default_gateway,
            routes,
            blocks,
            taken,
            has_allocations: allocations.is_some(),
        })
    }

    /// The blocks of `node`, in the order the pool lists them.
    pub fn blocks_of<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Block> + 'a {
        self.blocks.iter().filter(move |b| b.node == node)
    }

    /// The offset of the first block's first address: the network address only where the subnet
    /// has no other (point-to-point and single-address subnets), as nv-ipam.
    fn first_offset(&self) -> u128 {
        if host_span(self.subnet) <= 2 { 0 } else { 1 }
    }

    /// The last offset a block may end at: never the IPv4 broadcast address, as nv-ipam.
    fn last_offset(&self) -> u128 {
        let span = host_span(self.subnet);
        if self.subnet.is_ipv4() && span > 2 { span - 2 } else { span - 1 }
    }

    /// The addresses of block `[first, last]` a pod may be given, as a range of the subnet: the
    /// network and broadcast addresses, the gateway, the exclusions and the per-node exclusions
    /// left out.
    pub fn block_range(&self, first: u128, last: u128) -> IpRange {
        let mut excluded = self.exclusions.clone();
        excluded.extend(self.per_node_exclusions.iter().map(|&(lo, hi)| (first + lo, (first + hi).min(last))));
        if self.first_offset() == 1 {
            excluded.push((0, 0));
        }
        if self.subnet.is_ipv4() && host_span(self.subnet) > 2 {
            let broadcast = host_span(self.subnet) - 1;
            excluded.push((broadcast, broadcast));
        }
        excluded.retain(|&(lo, hi)| lo <= hi);
        IpRange::span(self.subnet, first, last, excluded, self.gateway)
    }

    /// The first free block, as nv-ipam's controller picks it: the lowest block no entry of
    /// `status.allocations` overlaps and not wholly excluded. The walk jumps over each entry and
    /// exclusion it meets, so it ends within as many steps as the pool lists them.
    pub fn next_free_block(&self) -> Option<(u128, u128)> {
        let base = self.first_offset();
        let size = self.block_size;
        let align_after = |offset: u128| base + (offset.saturating_sub(base)).div_ceil(size) * size;
        let mut start = base;
        let bound = self.taken.len() + self.exclusions.len() + 4;
        for _ in 0..bound * 2 + 2 {
            let end = start.checked_add(size - 1)?;
            if end > self.last_offset() {
                return None;
            }
            if let Some(&(_, hi)) = self.taken.iter().find(|&&(lo, hi)| lo <= end && start <= hi) {
                start = align_after(hi + 1);
                continue;
            }
            let range = self.block_range(start, end);
            if range.capacity() == 0 {
                // Wholly excluded: past the exclusion that covers its start, or the next block.
                let past =
                    self.exclusions.iter().filter(|&&(lo, hi)| lo <= start && start <= hi).map(|&(_, hi)| hi + 1).max();
                // To the block holding the first address past it (that block may have others).
                let past = past.unwrap_or(end + 1).max(end + 1);
                start = base + (past - base) / size * size;
                continue;
            }
            return Some((start, end));
        }
        None
    }

    /// The blocks one claim writes when `asking` has no room left: with no block of the pool at
    /// all, a block for it and for every other node of `selected` that has none (as nv-ipam's
    /// controller gives every selected node one, so that the nodes' first ADDs find theirs
    /// instead of each claiming, one after another, on the pool's resourceVersion); with blocks
    /// that are full, one more for it alone. The asking node's comes first; the others', in
    /// `selected`'s order, as long as free blocks last. `None` when no block is free for it.
    pub fn plan_claim(&self, asking: &str, selected: &[String]) -> Option<Vec<Block>> {
        let mut plan = self.clone();
        let mut out = Vec::new();
        let first_blocks = plan.blocks_of(asking).next().is_none();
        let others = selected.iter().filter(|n| n.as_str() != asking && first_blocks);
        for node in std::iter::once(asking).chain(others.map(String::as_str)) {
            if node != asking && plan.blocks_of(node).next().is_some() {
                continue;
            }
            let Some((first, last)) = plan.next_free_block() else { break };
            let block = Block { node: node.to_string(), first, last };
            plan.taken.push((first, last));
            plan.taken.sort_unstable();
            plan.blocks.push(block.clone());
            out.push(block);
        }
        (!out.is_empty()).then_some(out)
    }

    /// The address at `offset` of the subnet.
    pub fn addr(&self, offset: u128) -> IpAddr {
        subnet_addr(self.subnet, offset)
    }

    /// The routes a pod's result carries: `spec.routes` and, with `defaultGateway`, the default
    /// route, each through the gateway.
    pub fn result_routes(&self) -> Vec<plexus_cni::Route> {
        let Some(gw) = self.gateway else { return Vec::new() };
        let mut dsts = self.routes.clone();
        if self.default_gateway {
            let any = if self.subnet.is_ipv4() { "0.0.0.0/0" } else { "::/0" };
            dsts.push(any.parse().expect("default route"));
        }
        dsts.into_iter().map(|dst| plexus_cni::Route::new(dst, Some(gw))).collect()
    }
}

fn list<'a>(spec: &'a Value, key: &str) -> &'a [Value] {
    spec.get(key).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// The number of addresses of `net`, less one (its last offset); `u128::MAX` for a /0 of IPv6.
fn host_span(net: IpNetwork) -> u128 {
    let bits: u32 = if net.is_ipv4() { 32 } else { 128 };
    let host = bits - u32::from(net.prefix());
    if host >= 128 { u128::MAX } else { 1u128 << host }
}

fn subnet_addr(net: IpNetwork, offset: u128) -> IpAddr {
    let v = to_u128(net.network()) + offset;
    match net {
        IpNetwork::V4(_) => IpAddr::V4((v as u32).into()),
        IpNetwork::V6(_) => IpAddr::V6(v.into()),
    }
}

/// The `status.allocations` entry of a block.
pub fn allocation_entry(pool: &IpPool, node: &str, first: u128, last: u128) -> Value {
    serde_json::json!({"nodeName": node, "startIP": pool.addr(first).to_string(), "endIP": pool.addr(last).to_string()})
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool(spec: Value, allocations: Value) -> IpPool {
        IpPool::from_object(&json!({"metadata": {"name": "rail0", "resourceVersion": "7"}, "spec": spec,
            "status": {"allocations": allocations}}))
        .unwrap()
    }

    fn ips(r: &IpRange) -> Vec<String> {
        (r.first..=r.last).filter(|o| !r.is_excluded(*o)).map(|o| r.addr(o).to_string()).collect()
    }

    #[test]
    fn blocks_are_the_ones_nv_ipams_controller_hands_out_the_gateway_never_a_pods() {
        // nv-ipam's README: 192.168.0.0/16, gateway .1, blocks of 4: node1 .1-.4, node2 .5-.8.
        let p = pool(json!({"subnet": "198.18.0.0/16", "perNodeBlockSize": 4, "gateway": "198.18.0.1"}), json!([]));
        assert_eq!(p.next_free_block(), Some((1, 4)));
        let r = p.block_range(1, 4);
        assert_eq!(ips(&r), ["198.18.0.2", "198.18.0.3", "198.18.0.4"], "the gateway is skipped");
        assert_eq!(r.with_prefix(r.addr(2)).to_string(), "198.18.0.2/16", "the subnet's prefix");
        let p = pool(
            json!({"subnet": "198.18.0.0/16", "perNodeBlockSize": 4, "gateway": "198.18.0.1"}),
            json!([{"nodeName": "node1", "startIP": "198.18.0.1", "endIP": "198.18.0.4"}]),
        );
        assert_eq!(p.next_free_block(), Some((5, 8)));
        assert_eq!(p.blocks_of("node1").map(|b| (b.first, b.last)).collect::<Vec<_>>(), [(1, 4)]);
        assert_eq!(p.blocks_of("node2").count(), 0);
    }

    #[test]
    fn exclusions_and_per_node_exclusions_are_never_handed_out_nv_ipam_154() {
        let p = pool(
            json!({"subnet": "198.18.0.0/24", "perNodeBlockSize": 8,
                "exclusions": [{"startIP": "198.18.0.3", "endIP": "198.18.0.4"}, {"startIP": "198.18.0.9", "endIP": "198.18.0.23"}],
                "perNodeExclusions": [{"startIndex": 0, "endIndex": 0}]}),
            json!([]),
        );
        let (first, last) = p.next_free_block().unwrap();
        assert_eq!((first, last), (1, 8));
        assert_eq!(
            ips(&p.block_range(first, last)),
            ["198.18.0.2", "198.18.0.5", "198.18.0.6", "198.18.0.7", "198.18.0.8"]
        );
        // .9-.16 is wholly excluded, .17-.24 holds only .24 (index 0 is .17, excluded on every node).
        let taken = pool(
            json!({"subnet": "198.18.0.0/24", "perNodeBlockSize": 8,
                "exclusions": [{"startIP": "198.18.0.9", "endIP": "198.18.0.23"}],
                "perNodeExclusions": [{"startIndex": 0, "endIndex": 0}]}),
            json!([{"nodeName": "a", "startIP": "198.18.0.1", "endIP": "198.18.0.8"}]),
        );
        let (first, last) = taken.next_free_block().unwrap();
        assert_eq!((first, last), (17, 24));
        assert_eq!(ips(&taken.block_range(first, last)), ["198.18.0.24"]);
    }

    #[test]
    fn the_last_block_never_holds_the_broadcast_address_and_a_full_pool_has_no_free_block() {
        let p = pool(json!({"subnet": "198.18.0.0/29", "perNodeBlockSize": 3}), json!([]));
        assert_eq!(p.next_free_block(), Some((1, 3)));
        let p = pool(
            json!({"subnet": "198.18.0.0/29", "perNodeBlockSize": 3}),
            json!([{"nodeName": "a", "startIP": "198.18.0.1", "endIP": "198.18.0.3"}]),
        );
        assert_eq!(p.next_free_block(), Some((4, 6)), ".7 is the broadcast address");
        let p = pool(
            json!({"subnet": "198.18.0.0/29", "perNodeBlockSize": 3}),
            json!([{"nodeName": "a", "startIP": "198.18.0.1", "endIP": "198.18.0.3"},
                   {"nodeName": "b", "startIP": "198.18.0.4", "endIP": "198.18.0.6"}]),
        );
        assert_eq!(p.next_free_block(), None);
        // A malformed or foreign entry still keeps its span from being handed out again.
        let p = pool(
            json!({"subnet": "198.18.0.0/29", "perNodeBlockSize": 3}),
            json!([{"nodeName": "", "startIP": "198.18.0.2", "endIP": "198.18.0.2"}]),
        );
        assert_eq!(p.next_free_block(), Some((4, 6)));
        assert!(p.blocks.is_empty(), "no node's block");
    }

    #[test]
    fn ipv6_blocks_use_the_last_address_and_walks_are_bounded_by_what_the_pool_lists() {
        let p = pool(json!({"subnet": "2001:db8::/64", "perNodeBlockSize": 16, "gateway": "2001:db8::1"}), json!([]));
        assert_eq!(p.next_free_block(), Some((1, 16)));
        let full: Vec<Value> = (0..1000u32)
            .map(|i| {
                let (a, b) = (1 + u128::from(i) * 16, 16 + u128::from(i) * 16);
                json!({"nodeName": format!("n{i}"), "startIP": p.addr(a).to_string(), "endIP": p.addr(b).to_string()})
            })
            .collect();
        let p = pool(json!({"subnet": "2001:db8::/64", "perNodeBlockSize": 16}), Value::Array(full));
        assert_eq!(p.next_free_block(), Some((16001, 16016)));
        let tiny = pool(json!({"subnet": "2001:db8::/127", "perNodeBlockSize": 2}), json!([]));
        assert_eq!(tiny.next_free_block(), Some((0, 1)), "a /127 uses both addresses");
    }

    #[test]
    fn a_pool_that_cannot_be_used_is_refused_naming_the_pool_the_key_and_the_value() {
        let err = |spec: Value| {
            IpPool::from_object(&json!({"metadata": {"name": "rail0"}, "spec": spec})).unwrap_err().to_string()
        };
        assert!(err(json!({"subnet": "198.18.0.0"})).contains("IPPool rail0: spec.subnet \"198.18.0.0\": not a CIDR"));
        assert!(err(json!({"subnet": "198.18.0.0/24"})).contains("spec.perNodeBlockSize 0"));
        assert!(err(json!({"subnet": "198.18.0.0/24", "perNodeBlockSize": 300})).contains("spec.perNodeBlockSize 300"));
        assert!(
            err(json!({"subnet": "198.18.0.0/24", "perNodeBlockSize": 4, "gateway": "198.19.0.1"}))
                .contains("spec.gateway 198.19.0.1: not in 198.18.0.0/24")
        );
        assert!(
            err(json!({"subnet": "198.18.0.0/24", "perNodeBlockSize": 4,
            "exclusions": [{"startIP": "198.18.0.9", "endIP": "198.18.0.3"}]}))
            .contains("spec.exclusions[0].endIP 198.18.0.3: before its startIP")
        );
        assert!(
            err(json!({"subnet": "198.18.0.0/24", "perNodeBlockSize": 4,
            "perNodeExclusions": [{"startIndex": 2, "endIndex": 4}]}))
            .contains("spec.perNodeExclusions[0]")
        );
        assert!(
            err(json!({"subnet": "198.18.0.0/24", "perNodeBlockSize": 4, "defaultGateway": true}))
                .contains("spec.gateway (none)")
        );
    }

    #[test]
    fn a_nodes_first_claim_gives_every_selected_node_without_one_a_block_and_a_full_node_one_more() {
        let p = pool(
            json!({"subnet": "198.18.0.0/24", "perNodeBlockSize": 16}),
            json!([{"nodeName": "b", "startIP": "198.18.0.1", "endIP": "198.18.0.16"}]),
        );
        let nodes: Vec<String> = ["a", "b", "c", "d"].iter().map(|n| n.to_string()).collect();
        let plan = p.plan_claim("c", &nodes).unwrap();
        let shown: Vec<(&str, u128, u128)> = plan.iter().map(|b| (b.node.as_str(), b.first, b.last)).collect();
        assert_eq!(shown, [("c", 17, 32), ("a", 33, 48), ("d", 49, 64)], "b has one already");
        // b's block is full: one more, for b alone.
        let plan = p.plan_claim("b", &nodes).unwrap();
        assert_eq!(plan, [Block { node: "b".into(), first: 17, last: 32 }]);
        // Free blocks run out: the asking node's first, then as many others as fit.
        let small = pool(json!({"subnet": "198.18.0.0/27", "perNodeBlockSize": 16}), json!([]));
        let plan = small.plan_claim("d", &nodes).unwrap();
        assert_eq!(plan.iter().map(|b| b.node.as_str()).collect::<Vec<_>>(), ["d"], ".17-.32 holds the broadcast");
        let full = pool(
            json!({"subnet": "198.18.0.0/27", "perNodeBlockSize": 16}),
            json!([{"nodeName": "a", "startIP": "198.18.0.1", "endIP": "198.18.0.16"}]),
        );
        assert_eq!(full.plan_claim("d", &nodes), None);
    }

    #[test]
    fn routes_go_through_the_gateway_and_default_gateway_adds_the_default_route() {
        let p = pool(
            json!({"subnet": "198.18.0.0/24", "perNodeBlockSize": 4, "gateway": "198.18.0.1",
                "defaultGateway": true, "routes": [{"dst": "198.19.0.0/16"}]}),
            json!([]),
        );
        let routes: Vec<String> =
            p.result_routes().iter().map(|r| format!("{} via {}", r.dst, r.gw.unwrap())).collect();
        assert_eq!(routes, ["198.19.0.0/16 via 198.18.0.1", "0.0.0.0/0 via 198.18.0.1"]);
    }
}
