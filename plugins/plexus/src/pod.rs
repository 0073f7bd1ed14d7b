//! The pod's network namespace as the meta-plugin sees it: Multus's checks before any delegate
//! runs (the namespace exists; no interface of the pod already has a name an attachment asks
//! for) and its `default-route` handling after every delegate has run.

use std::net::IpAddr;
use std::path::Path;

use ipnetwork::IpNetwork;
use plexus_cni::{CniResult, Error, Route, code};
use plexus_net::{IpFamily, LinkSocket, Netns};

use crate::attachment::Attachment;

/// The pod's namespace.
pub struct PodNetns {
    ns: Netns,
}

impl PodNetns {
    /// Open `CNI_NETNS`; a namespace that does not exist fails the ADD before any delegate runs
    /// (code 8, as the reference plugins answer).
    pub fn open(path: &Path) -> Result<PodNetns, Error> {
        let ns = Netns::open(path).map_err(|e| {
            Error::new(code::INVALID_NETNS, format!("CNI_NETNS {:?}: {e}", path.display().to_string()))
                .with_details("the pod's network namespace must exist before ADD")
        })?;
        Ok(PodNetns { ns })
    }

    /// Refuse, before any delegate runs, an attachment whose interface name the pod already has
    /// (the spec: ADD must fail then; Multus checks it before each delegate).
    pub fn refuse_taken_names(&self, attachments: &[Attachment]) -> Result<(), Error> {
        let names: Vec<&str> = attachments.iter().map(|a| a.ifname.as_str()).collect();
        let taken = self.ns.existing_links(&names)?;
        match attachments.iter().find(|a| taken.contains(&a.ifname)) {
            Some(a) => Err(Error::new(
                code::IFNAME_TAKEN,
                format!("network {}: interface {:?} already exists in the container", a.network, a.ifname),
            )),
            None => Ok(()),
        }
    }

    /// Multus's `default-route`: when any attachment's selection has the key (even empty), every
    /// attachment's default routes (in the pod and in its result) go, and an attachment that
    /// names gateways gets one default route per gateway (one per family, checked by the plan).
    /// Returns the indices of the results that changed.
    pub fn apply_default_routes(
        &self,
        attachments: &[Attachment],
        results: &mut [CniResult],
    ) -> Result<Vec<usize>, Error> {
        if attachments.iter().all(|a| a.default_route.is_none()) {
            return Ok(Vec::new());
        }
        // Only now a netlink socket in the pod (most pods have no default-route).
        let rt = plexus_net::configure::runtime()?;
        let sock = {
            let _in_runtime = rt.enter();
            LinkSocket::open(&self.ns)?
        };
        rt.block_on(async {
            let mut changed = Vec::new();
            for (i, (a, result)) in attachments.iter().zip(results.iter_mut()).enumerate() {
                let Some(link) = sock.link(&a.ifname).await? else { continue };
                let gateways: &[IpAddr] = a.default_route.as_deref().unwrap_or_default();
                let before = result.routes.len();
                result.routes.retain(|r| r.dst.prefix() != 0);
                let mut touched = result.routes.len() != before;
                for family in [IpFamily::V4, IpFamily::V6] {
                    touched |= sock.delete_default_routes(link.index, family).await? > 0;
                }
                for gw in gateways {
                    let any = if gw.is_ipv4() { IpAddr::from([0u8; 4]) } else { IpAddr::from([0u16; 8]) };
                    let dst = IpNetwork::new(any, 0).expect("prefix 0");
                    let spec = plexus_net::link::RouteSpec::new(dst, Some(*gw), link.index);
                    sock.add_route(&spec).await.map_err(|e| {
                        Error::from(e).context(format!("network {}: default route via {gw} on {}", a.network, a.ifname))
                    })?;
                    result.routes.push(Route::new(dst, Some(*gw)));
                    touched = true;
                }
                if touched {
                    changed.push(i);
                }
            }
            Ok(changed)
        })
    }
}
