//! CHECK for the attaching plugins: find the attachment in prevResult and compare the link in the
//! pod with it. Failures are code 104 (CHECK failed) and name the interface and the difference.

use plexus_cni::{CniResult, Error, code};

use crate::kernel::Kernel;
use crate::link::Link;
use crate::netns::Netns;

pub fn failed(what: String) -> Error {
    Error::new(code::CHECK_FAILED, what)
}

/// The index, in prevResult's interfaces, of `ifname` in the sandbox `pod`.
pub fn prev_interface(prev: &CniResult, ifname: &str, pod: &Netns) -> Result<usize, Error> {
    let sandbox = pod.path().display().to_string();
    prev.interfaces
        .iter()
        .position(|i| i.name == ifname && i.sandbox.as_deref() == Some(sandbox.as_str()))
        .ok_or_else(|| failed(format!("prevResult has no interface {ifname:?} in {sandbox}")))
}

/// The link `ifname` in the pod (`sock` is the pod's socket).
pub async fn pod_link(sock: &impl Kernel, ifname: &str, pod: &Netns) -> Result<Link, Error> {
    sock.link(ifname)
        .await?
        .ok_or_else(|| failed(format!("interface {ifname:?} not found in {}", pod.path().display())))
}

/// The link has the MAC prevResult gives interface `idx`, and every address prevResult assigns it.
pub async fn mac_and_addresses(
    sock: &impl Kernel,
    link: &Link,
    ifname: &str,
    prev: &CniResult,
    idx: usize,
) -> Result<(), Error> {
    if let Some(mac) = &prev.interfaces[idx].mac
        && link.mac_string().as_deref() != Some(mac.to_ascii_lowercase().as_str())
    {
        return Err(failed(format!("{ifname} has MAC {:?}, prevResult says {mac}", link.mac_string())));
    }
    let have: Vec<_> = sock.addresses(link.index).await?.into_iter().map(|a| a.net).collect();
    match prev.ips.iter().filter(|i| i.interface == Some(idx)).find(|ip| !have.contains(&ip.address)) {
        Some(ip) => Err(failed(format!("{ifname} lacks address {}", ip.address))),
        None => Ok(()),
    }
}
