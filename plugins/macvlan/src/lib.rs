//! plexus-macvlan: a macvlan on a RoCE-capable parent for the pod (shared RDMA mode).
//!
//! ADD: resolve the master and MTU → start IPAM ADD → create the macvlan straight inside the pod
//! namespace under a temporary name → rename to CNI_IFNAME with the IPv4 settings (arp_notify;
//! multi-rail ARP and rp_filter) — a taken name fails here → collect the IPAM result → IPv6
//! settings, addresses (no DAD unless asked), up, routes (multi-rail: own table + source rules) →
//! device-info, with the RoCE GIDs of the pod's addresses on the parent's RDMA device → result.
//! Each completed step goes on an undo stack ([`Undo`]): a failure undoes them last first.
//!
//! IPAM runs concurrently with link creation (its process start-up overlaps our netlink work);
//! only `dhcp`, which talks on the interface, waits for the renamed link, as in the reference.

mod conf;
#[cfg(test)]
mod tests;

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use conf::MacvlanConf;
use plexus_cni::{CniResult, Command, Error, Interface, code};
use plexus_net::check::{self, failed};
use plexus_net::configure;
use plexus_net::sysfs::{Sysfs, device_info_pci, write_device_info};
use plexus_net::{Kernel, Link, LinkChange, LinkSocket, Netns, NewMacvlan, roce};
use plexus_node::files;
use plexus_node::policy::Allowed;
use plexus_plugin::ipam::{IpamStep, del_with_ipam, forward_to_ipam};
use plexus_plugin::undo::Undo;
use plexus_plugin::{About, Plugin, Request};

/// Attempts at a free temporary name before giving up.
const TEMP_NAME_ATTEMPTS: usize = 3;

/// The plugin (its binary's `main`, and plexus-daemon's in-process delegate).
pub struct Macvlan;

/// The plugin's name, version and build.
pub const ABOUT: About =
    About { name: "plexus-macvlan", version: env!("CARGO_PKG_VERSION"), build: Some(plexus_build_id::BUILD) };

impl Plugin for Macvlan {
    fn known_args(&self) -> &'static [&'static str] {
        &["MAC", "IP", "GATEWAY"]
    }

    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let conf = MacvlanConf::load(req)?;
        // A bad or disallowed mode fails before anything is opened.
        conf.check_policy(req)?;
        let mac = conf.mac(req)?;
        let device_info = req.device_info_file()?;
        let wait = roce::configured_wait(conf.roce_gid_wait_ms)?;
        let pod = Netns::open(req.netns().expect("ADD has CNI_NETNS"))?;
        // The pod's socket opens on a thread of its own while the master is looked up.
        let opening = LinkSocket::opening(&pod)?;
        configure::runtime()?.block_on(async {
            let node = LinkSocket::current()?;
            let (pod_sock, master) = if conf.link_in_container {
                let pod_sock = opening.finish()?;
                let master = find_master(&pod_sock, &conf).await?;
                (pod_sock, master)
            } else {
                let master = find_master(&node, &conf).await?;
                (opening.finish()?, master)
            };
            if !conf.link_in_container {
                // The pod's own links are its own; a node parent is the admin's to allow.
                req.policy.check_allowed(Allowed::Parent, "master", &master.name, req.pod_namespace())?;
                conf.check_implicit_master(req, &master)?;
            }
            let spec = conf.new_macvlan(&master, mac, &pod)?;
            let add = Add {
                req,
                conf: &conf,
                pod: &pod,
                master_sock: if conf.link_in_container { &pod_sock } else { &node },
                pod_sock: &pod_sock,
                master: &master,
                device_info: device_info.as_deref(),
                gid_wait: wait,
            };
            add.run(&spec).await
        })
    }

    fn del(&self, req: &Request) -> Result<(), Error> {
        let conf = MacvlanConf::load(req)?;
        // IPAM DEL always runs, even when the namespace is gone.
        del_with_ipam(req, || {
            req.remove_device_info()?;
            match req.netns() {
                Some(path) => delete_link(&conf, path, &req.env),
                None => Ok(()),
            }
        })
    }

    fn check(&self, req: &Request) -> Result<(), Error> {
        let conf = MacvlanConf::load(req)?;
        let prev = req.config.prev_result_for_check()?;
        forward_to_ipam(req, Command::Check)?;
        let pod = Netns::open(req.netns().expect("CHECK has CNI_NETNS"))?;
        configure::runtime()?.block_on(check_attachment(req, &conf, &prev, &pod))
    }

    fn status(&self, req: &Request) -> Result<(), Error> {
        let conf = MacvlanConf::load(req)?;
        if !conf.link_in_container {
            configure::runtime()?.block_on(async {
                let node = LinkSocket::current()?;
                find_master(&node, &conf).await.map(|_| ()).map_err(|e| Error::new(code::PLUGIN_NOT_AVAILABLE, e.msg))
            })?;
        }
        forward_to_ipam(req, Command::Status)
    }

    fn gc(&self, req: &Request) -> Result<(), Error> {
        forward_to_ipam(req, Command::Gc)
    }
}

/// The master by name, or the interface of the default route (reference behaviour).
async fn find_master(sock: &impl Kernel, conf: &MacvlanConf) -> Result<Link, Error> {
    match conf.master.as_deref().filter(|m| !m.is_empty()) {
        Some(name) => {
            plexus_cni::env::validate_ifname(name)
                .map_err(|e| Error::invalid_config(format!("invalid \"master\" {name:?}: {}", e.msg)))?;
            sock.link(name).await?.ok_or_else(|| {
                let place = if conf.link_in_container { "container" } else { "node" };
                Error::invalid_config(format!("master interface {name:?} not found"))
                    .with_details(format!("no link {name:?} in the {place} namespace"))
            })
        }
        None => sock.default_route_link().await?.ok_or_else(|| {
            Error::invalid_config("no default route interface found").with_details("set \"master\" in the config")
        }),
    }
}

/// The temporary name of attempt `attempt`: first the attachment's own (`plx` + its tag), so a
/// DEL finds a macvlan a killed ADD left under it; then random ones if that name is taken.
fn temp_name(env: &plexus_cni::CniEnv, attempt: usize) -> String {
    if attempt == 1 {
        return own_temp_name(env);
    }
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    format!("plx{:08x}", random as u32)
}

fn own_temp_name(env: &plexus_cni::CniEnv) -> String {
    let tag = plexus_cni::env::attachment_tag(&env.container_id, &env.ifname);
    format!("plx{}", &tag[..12])
}

/// One ADD from the master on: where the macvlan is created, the pod it is for, and what the
/// config asks of it.
struct Add<'a, K> {
    req: &'a Request,
    conf: &'a MacvlanConf,
    pod: &'a Netns,
    /// The master's namespace (the node's, or the pod's with `linkInContainer`).
    master_sock: &'a K,
    pod_sock: &'a K,
    master: &'a Link,
    device_info: Option<&'a Path>,
    gid_wait: Duration,
}

/// A completed step of ADD, and what undoing it takes.
#[derive(Debug)]
enum Step {
    /// IPAM ADD started: release the address (IPAM DEL).
    Ipam,
    /// A macvlan was created under this temporary name: delete it if it still has that name (it
    /// was never found, or never renamed). The name is ours alone.
    Created { name: String },
    /// The macvlan, found in the pod: delete it, whatever its name now; its addresses and routes
    /// go with it.
    Link { index: u32, name: String },
    /// Multi-rail: source rules into this table may exist in the pod.
    Rules { table: u32 },
    /// The device-info file was written.
    DeviceInfo(PathBuf),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Ipam => write!(f, "release the address (IPAM DEL)"),
            Step::Created { name } => write!(f, "delete macvlan {name} if it is still there"),
            Step::Link { index, name } => write!(f, "delete macvlan {name} (#{index})"),
            Step::Rules { table } => write!(f, "remove the source rules of table {table}"),
            Step::DeviceInfo(p) => write!(f, "remove device-info file {}", p.display()),
        }
    }
}

impl<K: Kernel> Add<'_, K> {
    /// The whole ADD; on failure every completed step is undone and the ADD's error returned.
    async fn run(&self, spec: &NewMacvlan<'_>) -> Result<CniResult, Error> {
        let mut undo = Undo::new();
        let mut ipam = IpamStep::start_early(self.req)?;
        if !matches!(ipam, IpamStep::None) {
            undo.push(Step::Ipam);
        }
        match self.steps(spec, &mut ipam, &mut undo).await {
            Ok(result) => {
                undo.commit();
                Ok(result)
            }
            Err(e) => Err(undo
                .unwind_async(e, async |step| match step {
                    Step::Ipam => std::mem::replace(&mut ipam, IpamStep::None).roll_back(self.req),
                    Step::Created { name } => match self.pod_sock.link(&name).await? {
                        Some(link) => delete_present(self.pod_sock, link.index).await,
                        None => Ok(()),
                    },
                    Step::Link { index, .. } => delete_present(self.pod_sock, index).await,
                    Step::Rules { table } => configure::remove_rules(self.pod_sock, table).await.map_err(Error::from),
                    Step::DeviceInfo(path) => files::remove_if_present(&path),
                })
                .await),
        }
    }

    async fn steps(
        &self,
        spec: &NewMacvlan<'_>,
        ipam: &mut IpamStep,
        undo: &mut Undo<Step>,
    ) -> Result<CniResult, Error> {
        let link = self.create_under_temp_name(spec, undo).await?;
        undo.push(Step::Link { index: link.index, name: link.name.clone() });
        let ifname = self.req.env.ifname.as_str();
        if let Some(table) = self.conf.iface.rail_table(ifname) {
            undo.push(Step::Rules { table });
        }
        // The final name and the IPv4 settings in one request. A name already taken in the pod
        // fails here (EEXIST) and leaves that link untouched; the spec requires ADD to fail then.
        // L2 only: nothing comes between the rename and link-up, so they are one request.
        let l2_only = matches!(ipam, IpamStep::None);
        let rename = LinkChange {
            name: Some(ifname),
            ipv4_conf: Some(self.conf.iface.ipv4_conf()),
            up: l2_only.then_some(true),
            ..Default::default()
        };
        self.pod_sock.set_link(link.index, &rename).await.map_err(|e| {
            configure::naming_error(e, ifname, self.pod, || format!("rename {} to {ifname}", link.name))
        })?;
        let mut result = configure::apply_ipam(
            self.pod_sock,
            &self.conf.iface,
            &self.req.env.ifname,
            link.index,
            l2_only,
            ipam.result(self.req)?,
            self.req.config.dns.as_ref(),
        )
        .await?;
        tracing::debug!(ifname, master = %self.master.name, "attached");
        result.interfaces = vec![Interface {
            name: ifname.to_string(),
            mac: link.mac_string(),
            mtu: Some(link.mtu),
            sandbox: Some(self.pod.path().display().to_string()),
            ..Default::default()
        }];
        if let Some(path) = self.device_info
            && self.write_device_info(path, &result)?
        {
            undo.push(Step::DeviceInfo(path.to_path_buf()));
        }
        Ok(result)
    }

    /// Create the macvlan under a temporary name (a name clash is retried with another), and
    /// find it in the pod namespace.
    async fn create_under_temp_name(&self, spec: &NewMacvlan<'_>, undo: &mut Undo<Step>) -> Result<Link, Error> {
        for attempt in 1..=TEMP_NAME_ATTEMPTS {
            let name = temp_name(&self.req.env, attempt);
            match self.master_sock.add_macvlan(&NewMacvlan { name: &name, ..spec.clone() }).await {
                Ok(()) => {
                    undo.push(Step::Created { name: name.clone() });
                    return self.pod_sock.link(&name).await?.ok_or_else(|| {
                        Error::kernel(format!("macvlan {name:?} was created but is not in the container namespace"))
                    });
                }
                Err(e) if e.is_exists() && attempt < TEMP_NAME_ATTEMPTS => continue,
                Err(e) => return Err(Error::from(e).context("create macvlan")),
            }
        }
        unreachable!("the last attempt returns")
    }

    /// The device-info file for the master's PCI device, with the RoCE GIDs of the pod's
    /// addresses on its RDMA device (shared RDMA mode); `false` when the master has no PCI device.
    fn write_device_info(&self, path: &Path, result: &CniResult) -> Result<bool, Error> {
        let sysfs = Sysfs::new(self.req.sysfs_root());
        let hw = sysfs.netdev_hardware(&self.master.name);
        let Some(doc) = device_info_pci(&hw) else {
            tracing::info!(master = %self.master.name, "no PCI device behind the master: no device-info written");
            return Ok(false);
        };
        let gids = match &hw.rdma_device {
            Some(dev) => roce::gids_for(&sysfs, dev, &result.addresses(), self.gid_wait),
            None => Vec::new(),
        };
        write_device_info(path, &roce::with_gids(doc, &gids))?;
        Ok(true)
    }
}

/// Delete link `index`; one already gone is fine.
async fn delete_present(sock: &impl Kernel, index: u32) -> Result<(), Error> {
    match sock.delete_link(index).await {
        Err(e) if !e.is_not_found() => Err(e.into()),
        _ => Ok(()),
    }
}

/// DEL's kernel part: succeeds when the namespace or the link is already gone.
fn delete_link(conf: &MacvlanConf, netns: &std::path::Path, env: &plexus_cni::CniEnv) -> Result<(), Error> {
    let pod = match Netns::open(netns) {
        Ok(ns) => ns,
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    configure::runtime()?.block_on(async {
        let sock = match LinkSocket::open(&pod) {
            Ok(s) => s,
            // A path that is no longer a namespace (unmounted): nothing left to delete.
            Err(e) if e.is_not_found() || e.errno() == Some(EINVAL_NOT_A_NAMESPACE) => return Ok(()),
            Err(e) => return Err(Error::from(e)),
        };
        remove_attachment(&sock, conf, env).await
    })
}

/// What setns answers for a file that is not a namespace (EINVAL).
const EINVAL_NOT_A_NAMESPACE: i32 = 22;

/// Remove the attachment's macvlan from the pod (`sock`): under its name, and under its temporary
/// name (a killed ADD's); a link of another kind under the name is left alone; then the
/// multi-rail rules. Whatever is already gone is fine.
async fn remove_attachment(sock: &impl Kernel, conf: &MacvlanConf, env: &plexus_cni::CniEnv) -> Result<(), Error> {
    let ifname = env.ifname.as_str();
    for (name, killed_add) in [(ifname.to_string(), false), (own_temp_name(env), true)] {
        match sock.link(&name).await? {
            Some(link) if link.kind.as_deref() == Some("macvlan") => match sock.delete_link(link.index).await {
                Err(e) if !e.is_not_found() => return Err(Error::from(e).context(format!("delete {name}"))),
                _ if killed_add => tracing::info!(link = %name, "removed a macvlan a killed ADD left"),
                _ => {}
            },
            Some(link) if !killed_add => tracing::warn!(ifname, kind = ?link.kind, "not a macvlan: left in place"),
            _ => {}
        }
    }
    if let Some(table) = conf.iface.rail_table(ifname) {
        configure::remove_rules(sock, table).await?;
    }
    Ok(())
}

/// CHECK: the link in the pod is the macvlan ADD made, with prevResult's MAC, addresses, routes.
async fn check_attachment(req: &Request, conf: &MacvlanConf, prev: &CniResult, pod: &Netns) -> Result<(), Error> {
    let ifname = req.env.ifname.as_str();
    let idx = check::prev_interface(prev, ifname, pod)?;
    let node = LinkSocket::current()?;
    let sock = LinkSocket::open(pod)?;
    let link = check::pod_link(&sock, ifname, pod).await?;
    if link.kind.as_deref() != Some("macvlan") {
        return Err(failed(format!("{ifname} is a {:?} link, not a macvlan", link.kind.unwrap_or_default())));
    }
    let mode = conf.mode()?;
    if link.macvlan_mode != Some(mode) {
        return Err(failed(format!(
            "{ifname} is in macvlan mode {:?}, config says {}",
            link.macvlan_mode.map(|m| m.as_str()),
            mode.as_str()
        )));
    }
    let master = find_master(if conf.link_in_container { &sock } else { &node }, conf).await?;
    if link.parent != Some(master.index) {
        return Err(failed(format!("{ifname} is not on master {:?}", master.name)));
    }
    // The MTU the result reported (1.1), else the configured one: a later plugin of a chain that
    // changes the MTU and says so in its result is not a failure.
    let want_mtu = match prev.interfaces[idx].mtu {
        Some(m) if m != 0 => m,
        _ => conf.mtu(&master.name, master.mtu)?,
    };
    if link.mtu != want_mtu {
        return Err(failed(format!("{ifname} has MTU {}, expected {want_mtu}", link.mtu)));
    }
    check::mac_and_addresses(&sock, &link, ifname, prev, idx).await?;
    let table = conf.iface.rail_table(ifname);
    let routes = sock.all_routes().await?;
    for r in &prev.routes {
        let want_table = table.or(r.table).unwrap_or(plexus_net::link::MAIN_TABLE);
        if !routes.iter().any(|k| k.dst == r.dst && k.table == want_table && (r.gw.is_none() || k.gw == r.gw)) {
            return Err(failed(format!("route to {} (table {want_table}) is missing", r.dst)));
        }
    }
    Ok(())
}
