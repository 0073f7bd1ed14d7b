//! The RDMA device of the moved netdev: in exclusive mode it moves into the pod with the netdev
//! (`RDMA_NLDEV_CMD_SET` + `NET_NS_FD`) and back on DEL; in shared mode it stays, visible to every
//! namespace, and the log says so.

use plexus_cni::Error;
use plexus_net::Netns;
use plexus_net::rdma::{NetnsMode, RdmaSocket};

use crate::conf::RdmaPolicy;

/// What to do with an RDMA device, given the policy and what the subsystem answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Move,
    Skip(String),
    Fail(String),
}

pub fn decide(policy: RdmaPolicy, mode: Result<NetnsMode, String>) -> Decision {
    match (policy, mode) {
        (RdmaPolicy::Off, _) => Decision::Skip("rdma is off in the config".into()),
        (_, Ok(NetnsMode::Exclusive)) => Decision::Move,
        (RdmaPolicy::Auto, Ok(NetnsMode::Shared)) => {
            Decision::Skip("the RDMA subsystem is in shared netns mode: the device stays visible to every namespace".into())
        }
        (RdmaPolicy::Exclusive, Ok(NetnsMode::Shared)) => Decision::Fail(
            "the config asks for exclusive RDMA but the subsystem is in shared netns mode (set `rdma system set netns exclusive`, or ib_core netns_mode=0, at boot)".into(),
        ),
        (RdmaPolicy::Auto, Err(e)) => Decision::Skip(format!("RDMA netns mode unknown ({e}): the RDMA device is not moved")),
        (RdmaPolicy::Exclusive, Err(e)) => Decision::Fail(format!("the config asks for exclusive RDMA but the netns mode cannot be read: {e}")),
    }
}

/// Move `device` into the pod when the decision says so; returns the device moved.
pub fn move_in(policy: RdmaPolicy, device: &str, pod: &Netns) -> Result<Option<String>, Error> {
    let mut sock = None;
    let mode = RdmaSocket::open().and_then(|mut s| {
        let m = s.netns_mode();
        sock = Some(s);
        m
    });
    match decide(policy, mode.map_err(|e| e.to_string())) {
        Decision::Skip(why) => {
            tracing::warn!(device, "{why}");
            Ok(None)
        }
        Decision::Fail(why) => Err(Error::invalid_config(format!("RDMA device {device}: {why}"))),
        Decision::Move => {
            let mut s = sock.expect("the mode came from this socket");
            let index = s
                .device_index(device)?
                .ok_or_else(|| Error::kernel(format!("RDMA device {device} is not visible in the node namespace")))?;
            s.move_to_netns(index, pod.raw_fd())
                .map_err(|e| Error::from(e).context(format!("move RDMA device {device}")))?;
            tracing::info!(device, "RDMA device moved into the pod");
            Ok(Some(device.to_string()))
        }
    }
}

/// Move `device` from the pod back to the node namespace (from a thread inside the pod namespace,
/// where the device is visible).
pub fn move_back(pod: &Netns, node: &Netns, device: &str) -> Result<(), Error> {
    let node_fd = node.raw_fd();
    pod.run("move RDMA device back", || -> Result<(), Error> {
        let mut s = RdmaSocket::open()?;
        match s.device_index(device)? {
            Some(index) => s.move_to_netns(index, node_fd).map_err(Error::from),
            None => Ok(()), // already back
        }
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_mode_moves_shared_mode_skips_or_fails_by_policy() {
        assert_eq!(decide(RdmaPolicy::Auto, Ok(NetnsMode::Exclusive)), Decision::Move);
        assert_eq!(decide(RdmaPolicy::Exclusive, Ok(NetnsMode::Exclusive)), Decision::Move);
        assert!(
            matches!(decide(RdmaPolicy::Auto, Ok(NetnsMode::Shared)), Decision::Skip(w) if w.contains("shared netns mode"))
        );
        assert!(
            matches!(decide(RdmaPolicy::Exclusive, Ok(NetnsMode::Shared)), Decision::Fail(w) if w.contains("exclusive"))
        );
        assert!(matches!(decide(RdmaPolicy::Off, Ok(NetnsMode::Exclusive)), Decision::Skip(_)));
    }

    #[test]
    fn a_failed_mode_query_is_a_warning_in_auto_and_an_error_when_exclusive_is_required() {
        let err = || Err("open RDMA netlink socket: Protocol not supported".to_string());
        assert!(matches!(decide(RdmaPolicy::Auto, err()), Decision::Skip(w) if w.contains("Protocol not supported")));
        assert!(matches!(decide(RdmaPolicy::Exclusive, err()), Decision::Fail(w) if w.contains("cannot be read")));
    }
}
