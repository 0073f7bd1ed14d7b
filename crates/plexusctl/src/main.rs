//! plexusctl: a cnitool-compatible runner (`add|check|del|gc|status <network> <netns>`, libcni's
//! result cache, so cnitool and plexusctl finish each other's work), IPAM inspection, and node
//! RoCE readiness checks, a pod's RoCE GIDs, and `install`, the DaemonSet image's entrypoint.

mod doctor;
mod install;
mod ipam;
mod roce;
mod runner;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "plexusctl",
    version,
    about = "Operate plexus: run CNI networks like cnitool, inspect IPAM, check a node for RoCE, install plexus on a node"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// ADD network NETWORK to the namespace NETNS (a path, or a name under /run/netns).
    Add(RunArgs),
    /// CHECK the attachment against libcni's cached result.
    Check(RunArgs),
    /// DEL the attachment (the cached result is prevResult).
    Del(RunArgs),
    /// GC: every plugin of the network, with the attachments libcni's cache still holds as valid.
    Gc(RunArgs),
    /// STATUS of every plugin of the network.
    Status(RunArgs),
    /// IPAM allocations of a network's plexus-ipam (file, etcd or kubernetes store).
    #[command(subcommand)]
    Ipam(IpamCmd),
    /// The RoCE GIDs of a pod's interfaces (`show_gids` style): the GID index NCCL needs.
    Roce {
        /// The pod's network namespace (a path, or a name under /run/netns).
        netns: Option<String>,
        /// The pod, NAMESPACE/NAME, found in plexus's cache (`--cni-dir`).
        #[arg(long, conflicts_with = "netns")]
        pod: Option<String>,
        #[arg(long, default_value = plexus_node::paths::META_CACHE_DIR)]
        cni_dir: PathBuf,
    },
    /// Is this node ready for RoCE attachments?
    Doctor {
        /// The RoCE port (PF, VF or SF netdev) pods attach to.
        #[arg(long)]
        parent: Option<String>,
        /// The MTU the fabric needs.
        #[arg(long)]
        mtu: Option<u32>,
        #[arg(long, default_value = plexus_node::paths::CNI_BIN_DIR)]
        bin_dir: PathBuf,
        /// The meta-plugin config to check (e.g. /etc/cni/net.d/00-plexus.conflist).
        #[arg(long)]
        conf: Option<PathBuf>,
    },
    /// Install plexus on this node: the DaemonSet image's entrypoint.
    #[command(subcommand)]
    Install(install::Cmd),
}

#[derive(clap::Args)]
struct RunArgs {
    network: String,
    /// A namespace path, or a name under /run/netns.
    netns: Option<String>,
    /// Interface name (CNI_IFNAME; default eth0).
    #[arg(short, long)]
    ifname: Option<String>,
    /// ADD: create the namespace (/run/netns/NAME) first; DEL: remove it afterwards.
    #[arg(long)]
    create_netns: bool,
}

#[derive(Subcommand)]
enum IpamCmd {
    /// Who holds which address, on which node.
    List {
        network: String,
        #[arg(long)]
        json: bool,
    },
    /// Release what (container ID, ifname) holds.
    Release { network: String, container_id: String, ifname: String },
}

fn netns_path(arg: &str) -> PathBuf {
    if arg.contains('/') { PathBuf::from(arg) } else { PathBuf::from("/run/netns").join(arg) }
}

fn run(verb: &str, a: &RunArgs) -> Result<()> {
    let ns = a.netns.as_deref().map(netns_path).unwrap_or_else(|| "/var/run/netns/none".into());
    if a.create_netns && verb == "add" {
        plexus_net::netns::create_named(&ns).with_context(|| format!("create {}", ns.display()))?;
        eprintln!("created namespace {}", ns.display());
    }
    let inv = runner::Invocation::from_env(&a.network, &ns, a.ifname.as_deref())?;
    match verb {
        "add" => {
            let result = inv.add()?;
            println!("{}", serde_json::to_string_pretty(&result)?);
            let ips: Vec<&str> =
                result["ips"].as_array().into_iter().flatten().filter_map(|i| i["address"].as_str()).collect();
            eprintln!("{} attached to {} as {} ({})", a.network, ns.display(), inv.env.ifname, ips.join(", "));
        }
        "check" => {
            inv.check()?;
            eprintln!("{}: {} in {} is as ADD left it", a.network, inv.env.ifname, ns.display());
        }
        "del" => {
            inv.del()?;
            eprintln!("{} detached from {}", a.network, ns.display());
            if a.create_netns {
                plexus_net::netns::delete_named(&ns).with_context(|| format!("remove {}", ns.display()))?;
            }
        }
        "gc" => inv.gc()?,
        "status" => {
            inv.status()?;
            eprintln!("{}: ready", a.network);
        }
        _ => unreachable!(),
    }
    Ok(())
}

plexus_plugin::binary_role!(Tool);

fn main() -> ExitCode {
    // Exec'd as a CNI plugin (a network naming it as its "type"): refused at once.
    if let Some(refused) = plexus_plugin::refuse_as_delegate("plexusctl") {
        return refused;
    }
    let cmd = match Cli::parse().cmd {
        Cmd::Install(c) => return install::main(c),
        other => other,
    };
    let outcome = match &cmd {
        Cmd::Install(_) => unreachable!("returned above"),
        Cmd::Add(a) => run("add", a),
        Cmd::Check(a) => run("check", a),
        Cmd::Del(a) => run("del", a),
        Cmd::Gc(a) => run("gc", a),
        Cmd::Status(a) => run("status", a),
        Cmd::Ipam(c) => (|| {
            let dir = runner::conf_dir();
            match c {
                IpamCmd::List { network, json } => ipam::list(&runner::load_conf_list(&dir, network)?.0, *json),
                IpamCmd::Release { network, container_id, ifname } => {
                    ipam::release(&runner::load_conf_list(&dir, network)?.0, container_id, ifname)
                }
            }
        })(),
        Cmd::Roce { netns, pod, cni_dir } => (|| {
            let path = match (netns, pod) {
                (Some(n), _) => netns_path(n),
                (None, Some(p)) => roce::pod_netns(cni_dir, p)?,
                (None, None) => anyhow::bail!("name a network namespace or --pod NAMESPACE/NAME"),
            };
            let rows = roce::rows(&path)?;
            roce::print(&rows);
            if rows.is_empty() {
                eprintln!("no GID of {}'s addresses in any RDMA device's table", path.display());
            }
            Ok(())
        })(),
        Cmd::Doctor { parent, mtu, bin_dir, conf } => {
            match doctor::check(&doctor::Options {
                parent: parent.clone(),
                mtu: *mtu,
                bin_dir: bin_dir.clone(),
                conf: conf.clone(),
            }) {
                Ok(findings) if doctor::print(&findings) => Ok(()),
                Ok(_) => return ExitCode::from(1),
                Err(e) => Err(e),
            }
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors repeat what plugins and stores said (tenant strings among them): escaped.
            eprintln!("plexusctl: {}", plexus_plugin::logging::escape_controls(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}
