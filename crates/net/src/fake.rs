//! A recording fake of the kernel (feature `fake`, unit tests only): namespaces with links,
//! addresses, routes, rules and sysctls, kept as plain data and changed by the [`Kernel`] verbs
//! the way the kernel changes them (names unique per namespace, a move drops a link's addresses
//! and routes, a deleted link takes its routes). Every verb is written to a log, in order, and any
//! one of them can be made to fail, so a test states what a plugin sends, in which order, and what
//! it undoes when step k fails. It is not the kernel: the end-to-end tests run the real one.

use std::cell::RefCell;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use ipnetwork::IpNetwork;

use crate::error::{NetError, Result};
use crate::kernel::Kernel;
use crate::link::{Address, Dad, IpFamily, Link, LinkChange, MAIN_TABLE, NewMacvlan, RouteSpec, RuleSpec};
use crate::netns::Netns;

/// What one namespace holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeNamespace {
    pub name: String,
    pub links: Vec<Link>,
    /// (link index, address)
    pub addresses: Vec<(u32, Address)>,
    pub routes: Vec<RouteSpec>,
    pub rules: Vec<RuleSpec>,
    /// (link index, `net.ipv4.conf` settings as sent), the last change per link.
    pub ipv4_conf: Vec<(u32, crate::link::Ipv4Conf)>,
    pub sysctls: Vec<(PathBuf, String)>,
}

#[derive(Debug, Default)]
struct State {
    namespaces: Vec<(PathBuf, FakeNamespace)>,
    next_index: u32,
    log: Vec<String>,
    verbs: usize,
    fail_at: Vec<usize>,
}

/// The fake machine: every namespace a test made, one log, one step counter.
#[derive(Clone, Debug, Default)]
pub struct FakeKernel {
    state: Rc<RefCell<State>>,
}

/// One namespace's socket on the fake machine (what [`crate::LinkSocket`] is on the real one).
#[derive(Clone, Debug)]
pub struct FakeSocket {
    state: Rc<RefCell<State>>,
    ns: usize,
}

impl FakeKernel {
    pub fn new() -> FakeKernel {
        FakeKernel { state: Rc::new(RefCell::new(State { next_index: 2, ..Default::default() })) }
    }

    /// A namespace named `name`, reached through `path`: a [`Netns`] opened on that path (any
    /// file: the fake only compares paths) names it in a move or a create-in-namespace.
    pub fn namespace(&self, name: &str, path: &Path) -> FakeSocket {
        let mut s = self.state.borrow_mut();
        s.namespaces.push((path.to_path_buf(), FakeNamespace { name: name.into(), ..Default::default() }));
        FakeSocket { state: self.state.clone(), ns: s.namespaces.len() - 1 }
    }

    /// Put a link there before the test (a NIC, a veth end), not logged.
    pub fn add_link(&self, on: &FakeSocket, name: &str, kind: &str, mtu: u32) -> Link {
        let mut s = self.state.borrow_mut();
        let index = s.next_index;
        s.next_index += 1;
        let link = Link {
            index,
            name: name.into(),
            mtu,
            mac: Some([0x02, 0, 0, 0, 0, index as u8]),
            up: true,
            parent: None,
            alias: None,
            alt_names: Vec::new(),
            kind: Some(kind.into()),
            macvlan_mode: None,
            master: None,
        };
        s.namespaces[on.ns].1.links.push(link.clone());
        link
    }

    /// Give a link an address there before the test, not logged.
    pub fn add_address(&self, on: &FakeSocket, index: u32, net: IpNetwork) {
        self.state.borrow_mut().namespaces[on.ns].1.addresses.push((index, Address { net, tentative: false }));
    }

    /// Make the `n`-th verb from now on (1-based, over every namespace) fail with EIO, as the
    /// kernel refusing a request would; called again, another one fails too.
    pub fn fail_at(&self, n: usize) {
        let mut s = self.state.borrow_mut();
        let at = s.verbs + n;
        s.fail_at.push(at);
    }

    /// The verbs sent so far, in order: `"<namespace>: <verb> <what>"`.
    pub fn log(&self) -> Vec<String> {
        self.state.borrow().log.clone()
    }

    /// How many verbs were sent so far.
    pub fn verbs(&self) -> usize {
        self.state.borrow().verbs
    }

    /// Every namespace's contents, to compare before and after.
    pub fn snapshot(&self) -> Vec<FakeNamespace> {
        self.state.borrow().namespaces.iter().map(|(_, n)| n.clone()).collect()
    }
}

fn errno(op: &str, e: i32) -> NetError {
    NetError::netlink(op, io::Error::from_raw_os_error(e))
}

impl FakeSocket {
    /// Count and log one verb; the step [`FakeKernel::fail_at`] chose fails.
    fn step(&self, what: String) -> Result<()> {
        let mut s = self.state.borrow_mut();
        s.verbs += 1;
        let entry = format!("{}: {what}", s.namespaces[self.ns].1.name);
        s.log.push(entry);
        if s.fail_at.contains(&s.verbs) {
            return Err(errno(&what, nix::libc::EIO));
        }
        Ok(())
    }

    fn with<T>(&self, f: impl FnOnce(&mut State, usize) -> T) -> T {
        f(&mut self.state.borrow_mut(), self.ns)
    }
}

fn ns_of(s: &State, netns: Option<&Netns>, own: usize) -> Result<usize> {
    match netns {
        None => Ok(own),
        Some(n) => s
            .namespaces
            .iter()
            .position(|(p, _)| p == n.path())
            .ok_or_else(|| errno(&format!("namespace {:?}", n.path()), nix::libc::EINVAL)),
    }
}

fn find(ns: &FakeNamespace, index: u32) -> Option<usize> {
    ns.links.iter().position(|l| l.index == index)
}

fn describe_change(c: &LinkChange<'_>) -> String {
    let mut parts = Vec::new();
    if let Some(n) = c.netns {
        parts.push(format!("netns {}", n.path().display()));
    }
    if let Some(n) = c.name {
        parts.push(format!("name {n}"));
    }
    if let Some(m) = c.mtu {
        parts.push(format!("mtu {m}"));
    }
    if c.mac.is_some() {
        parts.push("mac".into());
    }
    if let Some(a) = c.alias {
        parts.push(format!("alias {a}"));
    }
    if c.ipv4_conf.is_some_and(|c| !c.is_empty()) {
        parts.push("ipv4-conf".into());
    }
    match c.up {
        Some(true) => parts.push("up".into()),
        Some(false) => parts.push("down".into()),
        None => {}
    }
    parts.join(" ")
}

impl Kernel for FakeSocket {
    async fn link(&self, name: &str) -> Result<Option<Link>> {
        self.step(format!("get link {name}"))?;
        Ok(self.with(|s, ns| s.namespaces[ns].1.links.iter().find(|l| l.name == name).cloned()))
    }

    async fn link_by_index(&self, index: u32) -> Result<Option<Link>> {
        self.step(format!("get link #{index}"))?;
        Ok(self.with(|s, ns| s.namespaces[ns].1.links.iter().find(|l| l.index == index).cloned()))
    }

    async fn links(&self) -> Result<Vec<Link>> {
        self.step("list links".into())?;
        Ok(self.with(|s, ns| s.namespaces[ns].1.links.clone()))
    }

    async fn default_route_link(&self) -> Result<Option<Link>> {
        self.step("default route link".into())?;
        Ok(self.with(|s, ns| {
            let n = &s.namespaces[ns].1;
            let oif = n.routes.iter().find(|r| r.dst.prefix() == 0 && r.table == MAIN_TABLE).and_then(|r| r.oif)?;
            n.links.iter().find(|l| l.index == oif).cloned()
        }))
    }

    async fn add_macvlan(&self, m: &NewMacvlan<'_>) -> Result<()> {
        let into = m.netns.map(|n| format!(" netns {}", n.path().display())).unwrap_or_default();
        let op = format!("add macvlan {} on #{} mode {}{into}", m.name, m.parent_index, m.mode.as_str());
        self.step(op.clone())?;
        self.with(|s, own| {
            let target = ns_of(s, m.netns, own)?;
            let parent = s.namespaces[own].1.links.iter().find(|l| l.index == m.parent_index).cloned();
            let parent = parent.ok_or_else(|| errno(&op, nix::libc::ENODEV))?;
            if s.namespaces[target].1.links.iter().any(|l| l.name == m.name) {
                return Err(errno(&op, nix::libc::EEXIST));
            }
            let index = s.next_index;
            s.next_index += 1;
            s.namespaces[target].1.links.push(Link {
                index,
                name: m.name.into(),
                mtu: m.mtu.unwrap_or(parent.mtu),
                mac: Some(m.mac.unwrap_or([0x02, 0xfa, 0x4e, 0, 0, index as u8])),
                up: false,
                parent: Some(parent.index),
                alias: None,
                alt_names: Vec::new(),
                kind: Some("macvlan".into()),
                macvlan_mode: Some(m.mode),
                master: None,
            });
            Ok(())
        })
    }

    async fn set_link(&self, index: u32, c: &LinkChange<'_>) -> Result<()> {
        let op = format!("set link #{index} {}", describe_change(c));
        self.step(op.clone())?;
        self.with(|s, own| {
            let target = ns_of(s, c.netns, own)?;
            let at = find(&s.namespaces[own].1, index).ok_or_else(|| errno(&op, nix::libc::ENODEV))?;
            let mut link = s.namespaces[own].1.links[at].clone();
            let taken = |s: &State, name: &str| {
                s.namespaces[target].1.links.iter().any(|l| l.name == name && (target != own || l.index != index))
            };
            // As do_setlink: the move comes first, under the link's current name (refused, with
            // nothing changed, only when that name is taken there); the rename comes after it, so
            // a name taken in the target fails with the link already moved.
            if target != own && taken(s, &link.name) {
                return Err(errno(&op, nix::libc::EEXIST));
            }
            // Then, in do_setlink's order: MAC, MTU, name, alias, flags (a failed rename stops
            // there), and the IPv4 settings last.
            let rename_clash = c.name.is_some_and(|n| taken(s, n));
            link.mac = c.mac.or(link.mac);
            link.mtu = c.mtu.unwrap_or(link.mtu);
            if target != own {
                // A move takes the link down.
                link.up = false;
            }
            if !rename_clash {
                link.name = c.name.unwrap_or(&link.name).to_string();
                if let Some(a) = c.alias {
                    // An empty alias is none (the kernel clears IFLA_IFALIAS).
                    link.alias = Some(a.to_string()).filter(|a| !a.is_empty());
                }
                link.up = c.up.unwrap_or(link.up);
            }
            if target != own {
                // What the old namespace had on it stays there, and goes.
                let old = &mut s.namespaces[own].1;
                old.links.remove(at);
                old.addresses.retain(|(i, _)| *i != index);
                old.routes.retain(|r| r.oif != Some(index));
                old.ipv4_conf.retain(|(i, _)| *i != index);
                s.namespaces[target].1.links.push(link);
            } else {
                s.namespaces[own].1.links[at] = link;
            }
            if rename_clash {
                return Err(errno(&op, nix::libc::EEXIST));
            }
            if let Some(conf) = c.ipv4_conf.filter(|c| !c.is_empty()) {
                let n = &mut s.namespaces[target].1;
                n.ipv4_conf.retain(|(i, _)| *i != index);
                n.ipv4_conf.push((index, conf));
            }
            Ok(())
        })
    }

    async fn set_alt_name(&self, index: u32, name: &str, present: bool) -> Result<()> {
        let op = format!("{} altname #{index} {name}", if present { "add" } else { "del" });
        self.step(op.clone())?;
        self.with(|s, own| {
            let n = &mut s.namespaces[own].1;
            // As the kernel: a name (or alternative name) is unique in its namespace.
            if present && n.links.iter().any(|l| l.name == name || l.alt_names.iter().any(|a| a == name)) {
                return Err(errno(&op, nix::libc::EEXIST));
            }
            let at = find(n, index).ok_or_else(|| errno(&op, nix::libc::ENODEV))?;
            let names = &mut n.links[at].alt_names;
            if present {
                names.push(name.to_string());
            } else if let Some(i) = names.iter().position(|a| a == name) {
                names.remove(i);
            } else {
                return Err(errno(&op, nix::libc::ENOENT));
            }
            Ok(())
        })
    }

    async fn delete_link(&self, index: u32) -> Result<()> {
        let op = format!("delete link #{index}");
        self.step(op.clone())?;
        self.with(|s, own| {
            let n = &mut s.namespaces[own].1;
            let at = find(n, index).ok_or_else(|| errno(&op, nix::libc::ENODEV))?;
            n.links.remove(at);
            n.addresses.retain(|(i, _)| *i != index);
            n.routes.retain(|r| r.oif != Some(index));
            n.ipv4_conf.retain(|(i, _)| *i != index);
            Ok(())
        })
    }

    async fn add_address(&self, index: u32, addr: IpNetwork, dad: Dad) -> Result<()> {
        let op = format!("add address {addr} to #{index}{}", if dad == Dad::Skip { " nodad" } else { "" });
        self.step(op.clone())?;
        self.with(|s, own| {
            let n = &mut s.namespaces[own].1;
            find(n, index).ok_or_else(|| errno(&op, nix::libc::ENODEV))?;
            if n.addresses.iter().any(|(i, a)| *i == index && a.net.ip() == addr.ip()) {
                return Err(errno(&op, nix::libc::EEXIST));
            }
            // DAD finishes at once here: nothing on a fake link answers for the address.
            n.addresses.push((index, Address { net: addr, tentative: false }));
            Ok(())
        })
    }

    async fn addresses(&self, index: u32) -> Result<Vec<Address>> {
        self.step(format!("list addresses of #{index}"))?;
        Ok(self.with(|s, own| {
            s.namespaces[own].1.addresses.iter().filter(|(i, _)| *i == index).map(|(_, a)| *a).collect()
        }))
    }

    async fn add_route(&self, r: &RouteSpec) -> Result<()> {
        let op = format!("add route {} table {}", r.dst, r.table);
        self.step(op.clone())?;
        self.with(|s, own| {
            let n = &mut s.namespaces[own].1;
            if let Some(oif) = r.oif {
                find(n, oif).ok_or_else(|| errno(&op, nix::libc::ENODEV))?;
            }
            if n.routes.iter().any(|k| k.dst == r.dst && k.table == r.table && k.metric == r.metric) {
                return Err(errno(&op, nix::libc::EEXIST));
            }
            n.routes.push(r.clone());
            Ok(())
        })
    }

    async fn delete_default_routes(&self, index: u32, family: IpFamily) -> Result<usize> {
        self.step(format!("delete default routes {family:?} of #{index}"))?;
        Ok(self.with(|s, own| {
            let n = &mut s.namespaces[own].1;
            let before = n.routes.len();
            n.routes.retain(|r| {
                !(r.dst.prefix() == 0
                    && r.table == MAIN_TABLE
                    && r.oif == Some(index)
                    && r.dst.is_ipv4() == (family == IpFamily::V4))
            });
            before - n.routes.len()
        }))
    }

    async fn all_routes(&self) -> Result<Vec<RouteSpec>> {
        self.step("list routes".into())?;
        Ok(self.with(|s, own| s.namespaces[own].1.routes.clone()))
    }

    async fn add_rule(&self, r: &RuleSpec) -> Result<()> {
        let op = format!("add rule from {} lookup {}", r.src, r.table);
        self.step(op.clone())?;
        self.with(|s, own| {
            let n = &mut s.namespaces[own].1;
            if n.rules.contains(r) {
                return Err(errno(&op, nix::libc::EEXIST));
            }
            n.rules.push(r.clone());
            Ok(())
        })
    }

    async fn delete_rule(&self, r: &RuleSpec) -> Result<()> {
        let op = format!("delete rule from {} lookup {}", r.src, r.table);
        self.step(op.clone())?;
        self.with(|s, own| {
            let n = &mut s.namespaces[own].1;
            let at = n.rules.iter().position(|k| k == r).ok_or_else(|| errno(&op, nix::libc::ENOENT))?;
            n.rules.remove(at);
            Ok(())
        })
    }

    async fn rules(&self) -> Result<Vec<RuleSpec>> {
        self.step("list rules".into())?;
        Ok(self.with(|s, own| s.namespaces[own].1.rules.clone()))
    }

    fn write_sysctls(&self, settings: &[(PathBuf, &str)]) -> Result<()> {
        if settings.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = settings.iter().map(|(k, v)| format!("{}={v}", k.display())).collect();
        self.step(format!("sysctl {}", keys.join(" ")))?;
        self.with(|s, own| {
            let n = &mut s.namespaces[own].1;
            for (k, v) in settings {
                n.sysctls.retain(|(key, _)| key != k);
                n.sysctls.push((k.clone(), v.to_string()));
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::MacvlanMode;

    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    #[test]
    fn a_macvlan_created_in_another_namespace_lands_there_and_a_taken_name_is_refused() {
        let k = FakeKernel::new();
        let dir = tempfile::tempdir().unwrap();
        let pod_path = dir.path().join("pod");
        std::fs::write(&pod_path, "").unwrap();
        let node = k.namespace("node", &dir.path().join("node"));
        let pod_sock = k.namespace("pod", &pod_path);
        let parent = k.add_link(&node, "ens1f0np0", "veth", 9000);
        let pod = Netns::open(&pod_path).unwrap();
        let spec = NewMacvlan {
            name: "plx1",
            parent_index: parent.index,
            mode: MacvlanMode::Bridge,
            mtu: None,
            mac: None,
            bcqueuelen: None,
            netns: Some(&pod),
        };
        block_on(async {
            node.add_macvlan(&spec).await.unwrap();
            assert!(node.link("plx1").await.unwrap().is_none(), "created in the pod, not the node");
            let link = pod_sock.link("plx1").await.unwrap().expect("in the pod");
            assert_eq!((link.mtu, link.parent, link.up), (9000, Some(parent.index), false));
            assert!(node.add_macvlan(&spec).await.unwrap_err().is_exists());
        });
        assert_eq!(k.verbs(), 4);
    }

    #[test]
    fn the_chosen_step_fails_and_only_that_one() {
        let k = FakeKernel::new();
        let node = k.namespace("node", Path::new("/fake/node"));
        let nic = k.add_link(&node, "ens1f0np0", "veth", 1500);
        k.fail_at(2);
        block_on(async {
            node.link("ens1f0np0").await.unwrap();
            let e = node.set_link(nic.index, &LinkChange { up: Some(false), ..Default::default() }).await.unwrap_err();
            assert_eq!(e.errno(), Some(nix::libc::EIO));
            node.set_link(nic.index, &LinkChange { up: Some(false), ..Default::default() }).await.unwrap();
        });
        assert_eq!(
            k.log(),
            vec![
                "node: get link ens1f0np0".to_string(),
                format!("node: set link #{} down", nic.index),
                format!("node: set link #{} down", nic.index),
            ]
        );
        assert!(!k.snapshot()[0].links[0].up);
    }

    #[test]
    fn deleting_a_link_takes_its_addresses_and_routes_and_a_missing_one_is_not_found() {
        let k = FakeKernel::new();
        let ns = k.namespace("pod", Path::new("/fake/pod"));
        let l = k.add_link(&ns, "net1", "macvlan", 1500);
        block_on(async {
            ns.add_address(l.index, "198.18.0.2/24".parse().unwrap(), Dad::Skip).await.unwrap();
            ns.add_route(&RouteSpec::new("198.19.0.0/16".parse().unwrap(), None, l.index)).await.unwrap();
            ns.delete_link(l.index).await.unwrap();
            assert!(ns.delete_link(l.index).await.unwrap_err().is_not_found());
        });
        let after = &k.snapshot()[0];
        assert!(after.links.is_empty() && after.addresses.is_empty() && after.routes.is_empty());
    }
}
