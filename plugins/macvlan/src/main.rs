//! plexus-macvlan: a macvlan on a RoCE-capable parent for the pod (shared RDMA mode).
//!
//! ADD: resolve the master and MTU → start IPAM ADD → create the macvlan straight inside the pod
//! namespace under a temporary name → rename to CNI_IFNAME with the IPv4 settings (arp_notify;
//! multi-rail ARP and rp_filter) — a taken name fails here → collect the IPAM result → IPv6
//! settings, addresses (no DAD unless asked), up, routes (multi-rail: own table + source rules) →
//! device-info, with the RoCE GIDs of the pod's addresses on the parent's RDMA device → result. Any failure after IPAM started or the link exists undoes both.
//!
//! IPAM runs concurrently with link creation (its process start-up overlaps our netlink work);
//! only `dhcp`, which talks on the interface, waits for the renamed link, as in the reference.

mod conf;

use std::hash::{BuildHasher, Hasher};
use std::process::ExitCode;

use conf::MacvlanConf;
use plexus_cni::delegate::{IpamStep, del_with_ipam, forward_to_ipam};
use plexus_cni::policy::Allowed;
use plexus_cni::{About, CniResult, Command, Error, Interface, Plugin, Request, code};
use plexus_net::check::{self, failed};
use plexus_net::configure;
use plexus_net::sysfs::{Sysfs, device_info_file, device_info_pci, remove_device_info, write_device_info};
use plexus_net::{Link, LinkChange, LinkSocket, Netns, NewMacvlan, roce};

/// Attempts at a free temporary name before giving up.
const TEMP_NAME_ATTEMPTS: usize = 3;

struct Macvlan;

fn main() -> ExitCode {
    plexus_cni::plugin::run(About { name: "plexus-macvlan", version: env!("CARGO_PKG_VERSION") }, &Macvlan)
}

impl Plugin for Macvlan {
    fn known_args(&self) -> &'static [&'static str] {
        &["MAC", "IP", "GATEWAY"]
    }

    fn add(&self, req: &Request) -> Result<CniResult, Error> {
        let conf = MacvlanConf::load(req)?;
        let mode = conf.mode()?;
        let mac = conf.mac(req)?;
        let device_info = device_info_file(req)?;
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
            }
            let master_sock = if conf.link_in_container { &pod_sock } else { &node };
            let mtu = conf.mtu(&master.name, master.mtu)?;
            let spec = NewMacvlan {
                name: "",
                parent_index: master.index,
                mode,
                mtu: Some(mtu),
                mac,
                bcqueuelen: conf.bcqueuelen,
                netns: (!conf.link_in_container).then_some(&pod),
            };
            let mut ipam = IpamStep::start_early(&req.env, &req.config)?;
            let link = match create_under_temp_name(&req.env, master_sock, &pod_sock, &spec).await {
                Ok(link) => link,
                Err(e) => {
                    ipam.roll_back(&req.env, &req.config);
                    return Err(e);
                }
            };
            let attached = attach(req, &conf, &pod, &pod_sock, &link, &master, &mut ipam).await;
            if attached.is_err() {
                undo_add(req, &conf, &pod_sock, &link, ipam).await;
            }
            let result = attached?;
            if let Some(path) = device_info {
                let sysfs = Sysfs::from_env();
                let hw = sysfs.netdev_hardware(&master.name);
                match device_info_pci(&hw) {
                    Some(doc) => {
                        // Shared RDMA mode: the parent's RDMA device lists the macvlan's GIDs.
                        let gids = match &hw.rdma_device {
                            Some(dev) => roce::gids_for(&sysfs, dev, &result.addresses(), wait),
                            None => Vec::new(),
                        };
                        write_device_info(&path, &roce::with_gids(doc, &gids))?
                    }
                    None => {
                        tracing::info!(master = %master.name, "no PCI device behind the master: no device-info written")
                    }
                }
            }
            Ok(result)
        })
    }

    fn del(&self, req: &Request) -> Result<(), Error> {
        let conf = MacvlanConf::load(req)?;
        // IPAM DEL always runs, even when the namespace is gone.
        del_with_ipam(req, || {
            remove_device_info(req)?;
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
async fn find_master(sock: &LinkSocket, conf: &MacvlanConf) -> Result<Link, Error> {
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

/// Create the macvlan under a temporary name (a name clash is retried with another), and find it
/// in the pod namespace.
async fn create_under_temp_name(
    env: &plexus_cni::CniEnv,
    create_sock: &LinkSocket,
    pod_sock: &LinkSocket,
    spec: &NewMacvlan<'_>,
) -> Result<Link, Error> {
    for attempt in 1..=TEMP_NAME_ATTEMPTS {
        let name = temp_name(env, attempt);
        match create_sock.add_macvlan(&NewMacvlan { name: &name, ..spec.clone() }).await {
            Ok(()) => {
                return pod_sock.link(&name).await?.ok_or_else(|| {
                    Error::kernel(format!("macvlan {name:?} was created but is not in the container namespace"))
                });
            }
            Err(e) if e.is_exists() && attempt < TEMP_NAME_ATTEMPTS => continue,
            Err(e) => return Err(Error::from(e).context("create macvlan")),
        }
    }
    unreachable!("the last attempt returns")
}

/// Everything after the link exists: rename, IPAM, interface setup, result.
async fn attach(
    req: &Request,
    conf: &MacvlanConf,
    pod: &Netns,
    sock: &LinkSocket,
    link: &Link,
    master: &Link,
    ipam: &mut IpamStep,
) -> Result<CniResult, Error> {
    let ifname = req.env.ifname.as_str();
    // The final name and the IPv4 settings in one request. A name already taken in the pod fails
    // here (EEXIST) and leaves that link untouched; the spec requires ADD to fail then.
    // L2 only: nothing comes between the rename and link-up, so they are one request.
    let l2_only = matches!(ipam, IpamStep::None);
    let rename = LinkChange {
        name: Some(ifname),
        ipv4_conf: Some(conf.iface.ipv4_conf()),
        up: l2_only.then_some(true),
        ..Default::default()
    };
    sock.set_link(link.index, &rename).await.map_err(|e| {
        if e.is_exists() {
            configure::ifname_taken(ifname, pod)
        } else {
            Error::from(e).context(format!("rename {} to {ifname}", link.name))
        }
    })?;
    let mut result = configure::apply_ipam(req, ipam, pod, sock, &conf.iface, link.index, l2_only).await?;
    tracing::debug!(ifname, master = %master.name, "attached");
    result.interfaces = vec![Interface {
        name: ifname.to_string(),
        mac: link.mac_string(),
        mtu: Some(link.mtu),
        sandbox: Some(pod.path().display().to_string()),
        ..Default::default()
    }];
    Ok(result)
}

/// Roll back a failed ADD: release the address, remove the link (its routes go with it) and the
/// multi-rail rules.
async fn undo_add(req: &Request, conf: &MacvlanConf, sock: &LinkSocket, link: &Link, ipam: IpamStep) {
    ipam.roll_back(&req.env, &req.config);
    if let Err(e) = sock.delete_link(link.index).await {
        tracing::error!("rollback: delete link: {e}");
    }
    if let Some(table) = conf.iface.rail_table(&req.env.ifname)
        && let Err(e) = configure::remove_rules(sock, table).await
    {
        tracing::error!("rollback: remove rules: {e}");
    }
}

/// DEL's kernel part: succeeds when the namespace or the link is already gone.
fn delete_link(conf: &MacvlanConf, netns: &std::path::Path, env: &plexus_cni::CniEnv) -> Result<(), Error> {
    let ifname = env.ifname.as_str();
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
        match sock.link(ifname).await? {
            Some(link) if link.kind.as_deref() == Some("macvlan") => match sock.delete_link(link.index).await {
                Err(e) if !e.is_not_found() => return Err(Error::from(e).context(format!("delete {ifname}"))),
                _ => {}
            },
            Some(link) => tracing::warn!(ifname, kind = ?link.kind, "not a macvlan: left in place"),
            None => {}
        }
        // A macvlan a killed ADD left under this attachment's temporary name.
        if let Some(link) = sock.link(&own_temp_name(env)).await?
            && link.kind.as_deref() == Some("macvlan")
        {
            match sock.delete_link(link.index).await {
                Err(e) if !e.is_not_found() => return Err(Error::from(e).context(format!("delete {}", link.name))),
                _ => tracing::info!(link = %link.name, "removed a macvlan a killed ADD left"),
            }
        }
        if let Some(table) = conf.iface.rail_table(ifname) {
            configure::remove_rules(&sock, table).await?;
        }
        Ok(())
    })
}

/// What setns answers for a file that is not a namespace (EINVAL).
const EINVAL_NOT_A_NAMESPACE: i32 = 22;

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
