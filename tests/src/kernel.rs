//! Kernel state as `ip -j` reports it inside a namespace.

use serde::Deserialize;
use serde_json::Value;

use crate::netns::Netns;

/// A link as `ip -j -d link show` describes it.
#[derive(Clone, Debug, Deserialize)]
pub struct Link {
    pub ifindex: u32,
    pub ifname: String,
    pub mtu: u32,
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub flags: Vec<String>,
    /// Parent name (or index if in another namespace) for stacked links.
    #[serde(default)]
    pub link: Option<String>,
    /// Parent index when the parent is in another namespace.
    #[serde(default)]
    pub link_index: Option<u32>,
    #[serde(default)]
    pub ifalias: Option<String>,
    #[serde(default)]
    pub altnames: Vec<String>,
    #[serde(default)]
    pub linkinfo: Option<Value>,
}

impl Link {
    pub fn kind(&self) -> Option<&str> {
        self.linkinfo.as_ref()?.get("info_kind")?.as_str()
    }

    /// macvlan mode (`bridge`, `private`, ...).
    pub fn macvlan_mode(&self) -> Option<&str> {
        self.linkinfo.as_ref()?.get("info_data")?.get("mode")?.as_str()
    }

    pub fn is_up(&self) -> bool {
        self.flags.iter().any(|f| f == "UP")
    }
}

/// One address on a link.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Addr {
    pub family: String,
    pub local: String,
    pub prefixlen: u8,
    #[serde(default)]
    pub scope: String,
}

impl Addr {
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.local, self.prefixlen)
    }
}

/// One route (`ip -j route show table all`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Route {
    pub dst: String,
    #[serde(default)]
    pub gateway: Option<String>,
    #[serde(default)]
    pub dev: Option<String>,
    #[serde(default)]
    pub table: Option<String>,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub scope: Option<String>,
}

/// One policy rule (`ip -j rule`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Rule {
    pub priority: u32,
    #[serde(default)]
    pub src: Option<String>,
    #[serde(default)]
    pub srclen: Option<u8>,
    pub table: String,
}

fn json<T: serde::de::DeserializeOwned>(ns: &Netns, args: &[&str]) -> T {
    let mut all = vec!["-j"];
    all.extend_from_slice(args);
    let text = ns.ip(&all);
    let text = if text.trim().is_empty() { "[]" } else { text.as_str() };
    serde_json::from_str(text).unwrap_or_else(|e| panic!("ip {}: {e}: {text}", args.join(" ")))
}

impl Netns {
    /// Every link in the namespace.
    pub fn links(&self) -> Vec<Link> {
        json(self, &["-d", "link", "show"])
    }

    /// The link called `name`, if present.
    pub fn link(&self, name: &str) -> Option<Link> {
        self.links().into_iter().find(|l| l.ifname == name)
    }

    /// Addresses on `dev` of global scope (link-local IPv6 left out).
    pub fn addrs(&self, dev: &str) -> Vec<Addr> {
        #[derive(Deserialize)]
        struct Entry {
            #[serde(default)]
            addr_info: Vec<Addr>,
        }
        let entries: Vec<Entry> = json(self, &["addr", "show", "dev", dev]);
        entries.into_iter().flat_map(|e| e.addr_info).filter(|a| a.scope == "global").collect()
    }

    /// Routes of every table and both families, without the kernel's local/broadcast table.
    pub fn routes(&self) -> Vec<Route> {
        let mut all: Vec<Route> = json(self, &["-4", "route", "show", "table", "all"]);
        all.extend(json::<Vec<Route>>(self, &["-6", "route", "show", "table", "all"]));
        all.retain(|r| {
            r.table.as_deref() != Some("local") && !r.dst.starts_with("fe80") && !r.dst.starts_with("multicast")
        });
        all
    }

    /// Policy rules of both families.
    pub fn rules(&self) -> Vec<Rule> {
        let mut all: Vec<Rule> = json(self, &["-4", "rule", "show"]);
        all.extend(json::<Vec<Rule>>(self, &["-6", "rule", "show"]));
        all
    }
}

impl Netns {
    /// Everything a plugin may leave behind in the namespace, as the kernel reports it: each
    /// link (name, kind, MTU, MAC, admin state, alias, parent) with its global addresses, the
    /// routes of every table, the policy rules and the per-interface IPv4/IPv6 sysctls. Two equal snapshots: nothing was left.
    pub fn state(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .links()
            .into_iter()
            .map(|l| {
                let addrs: Vec<String> = self.addrs(&l.ifname).iter().map(Addr::cidr).collect();
                format!(
                    "link {} kind={:?} mtu={} mac={} up={} alias={:?} parent={:?} addrs={addrs:?}",
                    l.ifname,
                    l.kind(),
                    l.mtu,
                    l.address,
                    l.is_up(),
                    l.ifalias,
                    l.link
                )
            })
            .collect();
        out.extend(self.routes().iter().map(|r| format!("{r:?}")));
        out.extend(self.rules().iter().map(|r| format!("{r:?}")));
        out.extend(self.conf_sysctls());
        out.sort();
        out
    }

    /// `net.ipv4.conf.*` and `net.ipv6.conf.*` (every interface, `all`, `default`) and
    /// `net.ipv4.ip_forward`, as `sysctl` reads them in the namespace.
    pub fn conf_sysctls(&self) -> Vec<String> {
        let out = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                self.name(),
                "sysctl",
                "-a",
                "-r",
                r"^net\.ipv(4|6)\.conf\.|^net\.ipv4\.ip_forward$",
            ])
            .output()
            .expect("run sysctl");
        String::from_utf8_lossy(&out.stdout).lines().map(|l| format!("sysctl {l}")).collect()
    }
}
