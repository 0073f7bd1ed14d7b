//! plexus's DRA driver in the node daemon (`--dra`): the node's RoCE ports published as its
//! ResourceSlice, and the kubelet plugin (registration and DRA service) preparing claims for the
//! meta-plugin's ADD. Every setting is the admin's (the DaemonSet's flags).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use plexus_dra::DraError;
use plexus_dra::claims::Store;
use plexus_dra::driver::{ClaimSource, Driver, Ports};
use plexus_dra::kubelet::Sockets;
use plexus_dra::nics::Nic;
use plexus_net::sysfs::Sysfs;

/// The DRA driver's flags.
#[derive(clap::Args, Debug, Clone)]
pub struct DraArgs {
    /// Run plexus's DRA driver (`plexus.dev`) on this node: publish its RoCE ports as a
    /// ResourceSlice and serve the kubelet's prepare and unprepare calls. Needs the API.
    #[arg(long, default_value_t = false)]
    pub dra: bool,
    /// The ports handed out as macvlans, several claims at once (the others move into one pod
    /// whole), comma-separated netdev names.
    #[arg(long, value_delimiter = ',')]
    pub dra_shared_ports: Vec<String>,
    /// `k8s.cni.cncf.io/resourceName` on every device (what Multus's DRA path matches NADs by).
    #[arg(long)]
    pub dra_resource_name: Option<String>,
    /// How many claims a shared port takes at once (its `plexus.dev/macvlans` capacity).
    #[arg(long, default_value_t = 64)]
    pub dra_macvlans_per_port: i64,
    /// How often the node's ports are scanned, in seconds.
    #[arg(long, default_value_t = 2.0)]
    pub dra_scan_interval: f64,
    /// The kubelet's root directory (its `plugins_registry/` and `plugins/`).
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// Where CDI specs go (the runtime's CDI spec directory).
    #[arg(long, default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
    /// The host's device directory (its `infiniband/` nodes go into the containers by CDI).
    #[arg(long, default_value = "/dev")]
    pub dev_root: PathBuf,
    /// Where prepared claims are kept for the meta-plugin (its `draClaimsDir`; root-only).
    #[arg(long, default_value = plexus_node::paths::DRA_CLAIMS_DIR)]
    pub dra_claims_dir: PathBuf,
}

/// The API as the kubelet plugin reads and writes it: the daemon's client, with its deadline and
/// retries (called on the plugin's blocking threads).
struct Api(plexus_k8s::api::ApiClient);

impl ClaimSource for Api {
    fn claim(&self, namespace: &str, name: &str) -> plexus_dra::error::Result<ResourceClaim> {
        match self.0.resource_claim(namespace, name) {
            Ok(Some(claim)) => Ok(claim),
            Ok(None) => Err(DraError::Api(format!("resourceclaim {namespace}/{name} not found"))),
            Err(e) => Err(DraError::Api(e.to_string())),
        }
    }

    fn clear_status(&self, claim: &plexus_dra::kubelet::Claim) -> plexus_dra::error::Result<()> {
        let c = plexus_k8s::claims::ClaimRef {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        };
        self.0.apply_claim_status(&c, &[]).map_err(|e| DraError::Api(e.to_string()))
    }
}

/// What a scan of the node's ports reads: the sysfs, the node policy as it is at each scan, and
/// the ports shared as macvlans.
#[derive(Clone)]
struct Scan {
    sysfs: Sysfs,
    policy: Arc<NodePolicy>,
    shared: Vec<String>,
}

impl Scan {
    /// The node's ports now; a scan that fails offers none, and says why.
    async fn run(self) -> (Vec<Nic>, Vec<plexus_dra::nics::Skipped>) {
        let scanned = match self.policy.now() {
            Ok(policy) => plexus_dra::nics::scan(&self.sysfs, &policy, &self.shared).await,
            Err(e) => Err(DraError::Scan(e.msg)),
        };
        scanned.unwrap_or_else(|e| {
            tracing::warn!("DRA: {e}");
            (Vec::new(), Vec::new())
        })
    }
}

struct Scanned {
    scan: Scan,
    runtime: tokio::runtime::Handle,
}

impl Ports for Scanned {
    fn nics(&self) -> Vec<Nic> {
        self.runtime.block_on(self.scan.clone().run()).0
    }
}

/// The daemon's own node policy: the file its `PLEXUS_POLICY` named when it started (else the
/// default file, else defaults), read again when it changes.
pub struct NodePolicy {
    file: Option<String>,
    memo: plexus_node::PolicyMemo,
}

impl NodePolicy {
    /// The policy `file` names (`None`: the default file, else defaults).
    pub fn new(file: Option<String>) -> NodePolicy {
        NodePolicy { file, memo: plexus_node::PolicyMemo::default() }
    }

    fn now(&self) -> Result<plexus_node::Policy, plexus_cni::error::Error> {
        self.memo.load(|k| (k == plexus_node::paths::POLICY_ENV).then(|| self.file.clone()).flatten())
    }
}

/// The node the driver serves: its name, the sysfs its ports are read through (the daemon's
/// `--sysfs-root`) and the node policy that says which ports it may offer.
pub struct ThisNode {
    pub name: String,
    pub sysfs: Sysfs,
    pub policy: NodePolicy,
}

/// Start the publisher and the kubelet plugin on the current runtime; the plugin's sockets go
/// when `stop` fires. `ready` is told when the kubelet registers the plugin and when the slices
/// are published.
pub fn start(
    args: &DraArgs,
    api: kube::Client,
    watch: kube::Client,
    this: ThisNode,
    timeout: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
    ready: Arc<plexus_dra::ready::Readiness>,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let ThisNode { name: node, sysfs, policy } = this;
    let runtime = tokio::runtime::Handle::current();
    let shared = args.dra_shared_ports.clone();
    let publishing = plexus_dra::slice::Publishing {
        resource_name: args.dra_resource_name.clone(),
        macvlans_per_port: args.dra_macvlans_per_port,
        rdma_netns_mode: plexus_dra::nics::rdma_netns_mode(),
    };
    let scan = Scan { sysfs, policy: Arc::new(policy), shared };
    let publish_scan: Box<plexus_dra::publish::Scan> = {
        let scan = scan.clone();
        Box::new(move || Box::pin(scan.clone().run()))
    };
    let every = Duration::from_secs_f64(args.dra_scan_interval.max(0.1));
    tokio::spawn(plexus_dra::publish::run(watch, node.clone(), publish_scan, publishing, every, ready.clone()));
    let driver = Driver {
        node,
        claims: Arc::new(Api(plexus_k8s::api::ApiClient::on_runtime(api, runtime.clone(), timeout))),
        ports: Arc::new(Scanned { scan, runtime }),
        store: Store::new(&args.dra_claims_dir),
        cdi_dir: args.cdi_dir.clone(),
        dev_root: args.dev_root.clone(),
        ready,
    };
    let sockets = Sockets::under(&args.kubelet_dir, plexus_dra::DRIVER);
    tracing::info!(registration = %sockets.registration(plexus_dra::DRIVER).display(), "DRA: kubelet plugin");
    let mut stop = stop;
    let served = plexus_dra::kubelet::serve(plexus_dra::DRIVER.to_string(), sockets, Arc::new(driver), async move {
        let _ = stop.wait_for(|s| *s).await;
    });
    // Said when it happens (a kubelet dir that is not there, a socket path taken), not at exit.
    tokio::spawn(async move {
        let served = served.await;
        if let Err(e) = &served {
            tracing::error!("DRA: the kubelet plugin stopped: {e}");
        }
        served
    })
}
