//! Whether the DRA driver can serve a claim yet: the kubelet registered its plugin (its
//! `NotifyRegistrationStatus` said so) and the node's ResourceSlices are in the API. A pod whose
//! claim the kubelet prepares before the first is told "DRA driver plexus.dev is not registered"
//! and waits for the kubelet's retry (some 80 s); before the second, the scheduler has no device
//! to allocate. plexus-daemon's readiness (`/readyz`, the chart's probe) waits for both.

use std::sync::atomic::{AtomicBool, Ordering};

/// What the driver has done so far; shared by the kubelet plugin, the publisher and the probe.
#[derive(Debug, Default)]
pub struct Readiness {
    registered: AtomicBool,
    published: AtomicBool,
}

impl Readiness {
    /// The kubelet's word on the registration (a later refusal makes it unready again).
    pub fn set_registered(&self, registered: bool) {
        self.registered.store(registered, Ordering::SeqCst);
    }

    /// The node's slices are in the API, as offered.
    pub fn set_published(&self) {
        self.published.store(true, Ordering::SeqCst);
    }

    /// `Ok` once both, else what is still missing.
    pub fn check(&self) -> Result<(), &'static str> {
        match (self.registered.load(Ordering::SeqCst), self.published.load(Ordering::SeqCst)) {
            (true, true) => Ok(()),
            (false, _) => Err("the kubelet has not registered the DRA plugin yet"),
            (true, false) => Err("the node's ResourceSlices are not published yet"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_registered_and_published_and_no_longer_once_the_kubelet_refuses() {
        let r = Readiness::default();
        assert_eq!(r.check(), Err("the kubelet has not registered the DRA plugin yet"));
        r.set_published();
        assert!(r.check().is_err(), "published but not registered");
        r.set_registered(true);
        assert_eq!(r.check(), Ok(()));
        r.set_registered(false);
        assert!(r.check().is_err());
        let r = Readiness::default();
        r.set_registered(true);
        assert_eq!(r.check(), Err("the node's ResourceSlices are not published yet"));
    }
}
