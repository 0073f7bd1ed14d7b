//! The plexus-macvlan configuration: the reference macvlan's keys plus `multiRail`,
//! `routeTable`, `dad` and `roceGidWaitMs`.

use plexus_cni::Error;
use plexus_net::configure::IfaceKeys;
use plexus_net::link::parse_mac;
use plexus_net::{Link, MacvlanMode, Netns, NewMacvlan};
use plexus_node::policy::Allowed;
use plexus_plugin::Request;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MacvlanConf {
    #[serde(default)]
    pub master: Option<String>,
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub mac: Option<String>,
    #[serde(default)]
    pub link_in_container: bool,
    #[serde(default)]
    pub bcqueuelen: Option<u32>,
    /// `mtu`, `multiRail`, `routeTable`, `dad`: read on their own from the same config, so a
    /// type error still names its key (serde's `flatten` loses the path).
    #[serde(skip)]
    pub iface: IfaceKeys,
    /// How long ADD waits for the RoCE v2 GIDs of the pod's addresses (tenant-settable, bounded).
    #[serde(default)]
    pub roce_gid_wait_ms: Option<u64>,
}

impl MacvlanConf {
    pub fn load(req: &Request) -> Result<MacvlanConf, Error> {
        let mut conf: MacvlanConf = req.config_as()?;
        conf.iface = req.config_as()?;
        Ok(conf)
    }

    /// `mode`: the reference's set (`source` is refused, as there).
    pub fn mode(&self) -> Result<MacvlanMode, Error> {
        match self.mode.as_deref().unwrap_or("") {
            "" | "bridge" => Ok(MacvlanMode::Bridge),
            "private" => Ok(MacvlanMode::Private),
            "vepa" => Ok(MacvlanMode::Vepa),
            "passthru" => Ok(MacvlanMode::Passthru),
            other => Err(Error::invalid_config(format!("unknown macvlan mode: {other}"))
                .with_details("\"mode\" must be one of bridge, private, vepa, passthru")),
        }
    }

    /// What the node policy says of the keys that reach beyond the pod, on a node parent (one in
    /// the pod's own namespace, `linkInContainer`, is the pod's alone): a mode that takes the
    /// parent over only where `allow.macvlanModes` names it for the pod's namespace, and a
    /// broadcast queue (the parent's, shared by every macvlan on it) no longer than
    /// `limits.bcQueueLen`. Both before anything is opened (code 7).
    pub fn check_policy(&self, req: &Request) -> Result<(), Error> {
        if self.link_in_container {
            return Ok(());
        }
        let mode = self.mode()?;
        req.policy.check_allowed(Allowed::MacvlanMode, "mode", mode.as_str(), req.pod_namespace())?;
        let most = req.policy.limits.bc_queue_len;
        if let Some(len) = self.bcqueuelen.filter(|len| *len > most) {
            return Err(Error::invalid_config(format!(
                "bcqueuelen {len} is more than the node policy allows ({most})"
            ))
            .with_details(format!(
                "the broadcast queue is the parent's, shared by every macvlan on it: limits.bcQueueLen (policy: {})",
                req.policy.source
            )));
        }
        Ok(())
    }

    /// The master a config left unset, the node's default-route interface: a tenant's parent only
    /// where the policy's `allow.parents` names it (for the pod's namespace, else node-wide), so
    /// a NAD without `master` never lands on the node's uplink by default.
    pub fn check_implicit_master(&self, req: &Request, master: &Link) -> Result<(), Error> {
        if self.link_in_container || self.master.as_deref().is_some_and(|m| !m.is_empty()) {
            return Ok(());
        }
        if req.policy.names(Allowed::Parent, &master.name, req.pod_namespace()) {
            return Ok(());
        }
        Err(Error::invalid_config(format!(
            "\"master\" is not set, and the node's default-route interface {:?} is not a parent the node policy names",
            master.name
        ))
        .with_details(format!(
            "set \"master\" to a RoCE port, or (admin) name {:?} in allow.parents (policy: {})",
            master.name, req.policy.source
        )))
    }

    /// The MAC to set: config < `CNI_ARGS` `MAC=` < `runtimeConfig.mac` (reference precedence).
    pub fn mac(&self, req: &Request) -> Result<Option<[u8; 6]>, Error> {
        let runtime = req.config.runtime("mac").and_then(|v| v.as_str());
        let (key, value) = match (runtime, req.env.args.get("MAC"), self.mac.as_deref()) {
            (Some(m), _, _) => ("runtimeConfig.mac", m),
            (None, Some(m), _) => ("CNI_ARGS MAC", m),
            (None, None, Some(m)) => ("mac", m),
            (None, None, None) => return Ok(None),
        };
        match parse_mac(value) {
            Some(mac) if mac[0] & 1 == 0 => Ok(Some(mac)),
            _ => Err(Error::invalid_config(format!("invalid {key} {value:?}: not a unicast MAC address"))),
        }
    }

    /// The MTU to give the macvlan: absent or 0 means the parent's; more than the parent's is an error.
    pub fn mtu(&self, master: &str, master_mtu: u32) -> Result<u32, Error> {
        match self.iface.mtu() {
            None => Ok(master_mtu),
            Some(m) if m > master_mtu => {
                Err(Error::invalid_config(format!("invalid MTU {m}, must be [0, master MTU({master_mtu})]"))
                    .with_details(format!("\"mtu\" {m} is larger than the MTU {master_mtu} of master {master:?}")))
            }
            Some(m) => Ok(m),
        }
    }

    /// The macvlan to create on `master` for the pod `pod` (straight in the pod's namespace,
    /// unless the master is the pod's own); its name comes with each attempt.
    pub fn new_macvlan<'a>(
        &self,
        master: &Link,
        mac: Option<[u8; 6]>,
        pod: &'a Netns,
    ) -> Result<NewMacvlan<'a>, Error> {
        Ok(NewMacvlan {
            name: "",
            parent_index: master.index,
            mode: self.mode()?,
            mtu: Some(self.mtu(&master.name, master.mtu)?),
            mac,
            bcqueuelen: self.bcqueuelen,
            netns: (!self.link_in_container).then_some(pod),
        })
    }
}
