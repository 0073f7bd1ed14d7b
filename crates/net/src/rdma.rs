//! RDMA netlink (`NETLINK_RDMA`, the `RDMA_NL_NLDEV` client): the subsystem's netns mode, the
//! device index of an RDMA device, and moving an RDMA device into a network namespace — what
//! `rdma system show netns` and `rdma dev set <dev> netns <ns>` do. No Rust crate speaks it, so
//! the messages are encoded here; the constants are the kernel's `include/uapi/rdma/rdma_netlink.h`.
//!
//! The kernel on the development machines has no RDMA (`socket(NETLINK_RDMA)` fails with
//! EPROTONOSUPPORT): this module is tested at the byte level against golden messages.

use std::io;

use crate::error::{NetError, Result};

/// `NETLINK_RDMA` (include/uapi/linux/netlink.h).
pub const NETLINK_RDMA: isize = 20;
/// `RDMA_NL_NLDEV`: the netlink client of the RDMA core's device API.
pub const RDMA_NL_NLDEV: u16 = 5;
pub const RDMA_NLDEV_CMD_GET: u16 = 1;
pub const RDMA_NLDEV_CMD_SET: u16 = 2;
pub const RDMA_NLDEV_CMD_SYS_GET: u16 = 6;
pub const RDMA_NLDEV_ATTR_DEV_INDEX: u16 = 1;
pub const RDMA_NLDEV_ATTR_DEV_NAME: u16 = 2;
pub const RDMA_NLDEV_SYS_ATTR_NETNS_MODE: u16 = 66;
pub const RDMA_NLDEV_NET_NS_FD: u16 = 68;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const HEADER_LEN: usize = 16;

/// `RDMA_NL_GET_TYPE(client, op)`.
pub const fn message_type(op: u16) -> u16 {
    (RDMA_NL_NLDEV << 10) + op
}

/// The RDMA subsystem's network namespace mode (`rdma system`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetnsMode {
    /// Each RDMA device belongs to one namespace and can be moved (`ib_core netns_mode=0`).
    Exclusive,
    /// Every namespace sees every RDMA device; devices cannot be moved.
    Shared,
}

fn put_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len() + (4 - len % 4) % 4, 0);
}

fn message(op: u16, flags: u16, seq: u32, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut buf = vec![0u8; HEADER_LEN];
    for (kind, payload) in attrs {
        put_attr(&mut buf, *kind, payload);
    }
    let len = buf.len() as u32;
    buf[0..4].copy_from_slice(&len.to_ne_bytes());
    buf[4..6].copy_from_slice(&message_type(op).to_ne_bytes());
    buf[6..8].copy_from_slice(&flags.to_ne_bytes());
    buf[8..12].copy_from_slice(&seq.to_ne_bytes());
    buf
}

/// `RDMA_NLDEV_CMD_SYS_GET`: ask for the netns mode.
pub fn encode_sys_get(seq: u32) -> Vec<u8> {
    message(RDMA_NLDEV_CMD_SYS_GET, NLM_F_REQUEST, seq, &[])
}

/// `RDMA_NLDEV_CMD_GET` dump: every RDMA device with its index and name.
pub fn encode_dev_dump(seq: u32) -> Vec<u8> {
    message(RDMA_NLDEV_CMD_GET, NLM_F_REQUEST | NLM_F_DUMP, seq, &[])
}

/// `RDMA_NLDEV_CMD_SET` with `DEV_INDEX` and `NET_NS_FD`: move the device into the namespace.
pub fn encode_set_netns(seq: u32, dev_index: u32, netns_fd: u32) -> Vec<u8> {
    message(
        RDMA_NLDEV_CMD_SET,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        &[
            (RDMA_NLDEV_ATTR_DEV_INDEX, dev_index.to_ne_bytes().to_vec()),
            (RDMA_NLDEV_NET_NS_FD, netns_fd.to_ne_bytes().to_vec()),
        ],
    )
}

/// One message the kernel answered with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `NLMSG_ERROR` with 0: the request was done.
    Ack,
    /// `NLMSG_ERROR` with a negative errno.
    Error(i32),
    Done,
    /// A device of a `CMD_GET` answer.
    Device {
        index: u32,
        name: String,
    },
    /// The `CMD_SYS_GET` answer.
    System {
        netns_mode: Option<NetnsMode>,
    },
    Other(u16),
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Decode every message in `buf` (a datagram may hold several). Malformed input is an error,
/// never a panic.
pub fn decode(buf: &[u8]) -> io::Result<Vec<Reply>> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("RDMA netlink: {what}"));
    let mut out = Vec::new();
    let mut at = 0;
    while at + HEADER_LEN <= buf.len() {
        let len = u32_at(buf, at).ok_or_else(|| bad("short header"))? as usize;
        let kind = u16_at(buf, at + 4).ok_or_else(|| bad("short header"))?;
        if len < HEADER_LEN || at + len > buf.len() {
            return Err(bad("message length out of bounds"));
        }
        let body = &buf[at + HEADER_LEN..at + len];
        out.push(match kind {
            NLMSG_ERROR => {
                let code = u32_at(body, 0).ok_or_else(|| bad("short error message"))? as i32;
                if code == 0 { Reply::Ack } else { Reply::Error(code) }
            }
            NLMSG_DONE => Reply::Done,
            k if k == message_type(RDMA_NLDEV_CMD_GET) || k == message_type(RDMA_NLDEV_CMD_SYS_GET) => {
                let (mut index, mut name, mut mode) = (None, None, None);
                let mut a = 0;
                while a + 4 <= body.len() {
                    let alen = u16_at(body, a).unwrap_or(0) as usize;
                    let akind = u16_at(body, a + 2).unwrap_or(0) & 0x3fff;
                    if alen < 4 || a + alen > body.len() {
                        return Err(bad("attribute length out of bounds"));
                    }
                    let payload = &body[a + 4..a + alen];
                    match akind {
                        RDMA_NLDEV_ATTR_DEV_INDEX => index = u32_at(payload, 0),
                        RDMA_NLDEV_ATTR_DEV_NAME => {
                            name = Some(
                                String::from_utf8_lossy(payload.split(|c| *c == 0).next().unwrap_or_default())
                                    .into_owned(),
                            )
                        }
                        RDMA_NLDEV_SYS_ATTR_NETNS_MODE => {
                            mode =
                                payload.first().map(|m| if *m == 0 { NetnsMode::Exclusive } else { NetnsMode::Shared })
                        }
                        _ => {}
                    }
                    a += (alen + 3) & !3;
                }
                if k == message_type(RDMA_NLDEV_CMD_SYS_GET) {
                    Reply::System { netns_mode: mode }
                } else {
                    match (index, name) {
                        (Some(index), Some(name)) => Reply::Device { index, name },
                        _ => return Err(bad("device without index or name")),
                    }
                }
            }
            other => Reply::Other(other),
        });
        at += (len + 3) & !3;
    }
    Ok(out)
}

/// A blocking RDMA netlink socket in the calling thread's namespace.
pub struct RdmaSocket {
    sock: netlink_sys::Socket,
    seq: u32,
}

impl RdmaSocket {
    /// Fails (EPROTONOSUPPORT) where the kernel has no RDMA core.
    pub fn open() -> Result<RdmaSocket> {
        let mut sock =
            netlink_sys::Socket::new(NETLINK_RDMA).map_err(|e| NetError::io("open RDMA netlink socket", e))?;
        sock.bind_auto().map_err(|e| NetError::io("bind RDMA netlink socket", e))?;
        sock.connect(&netlink_sys::SocketAddr::new(0, 0))
            .map_err(|e| NetError::io("connect RDMA netlink socket", e))?;
        Ok(RdmaSocket { sock, seq: 1 })
    }

    fn exchange(&mut self, op: &str, request: Vec<u8>) -> Result<Vec<Reply>> {
        self.seq += 1;
        plexus_node::fault::at(plexus_node::fault::Point::Netlink).map_err(|e| NetError::io(op, e.into()))?;
        self.sock.send(&request, 0).map_err(|e| NetError::io(op, e))?;
        let mut replies = Vec::new();
        loop {
            let mut buf = vec![0u8; 32 * 1024];
            let n = self.sock.recv(&mut &mut buf[..], 0).map_err(|e| NetError::io(op, e))?;
            let batch = decode(&buf[..n]).map_err(|e| NetError::io(op, e))?;
            let last =
                batch.iter().any(|r| matches!(r, Reply::Ack | Reply::Error(_) | Reply::Done | Reply::System { .. }));
            for r in batch {
                if let Reply::Error(code) = r {
                    return Err(NetError::netlink(op, io::Error::from_raw_os_error(-code)));
                }
                replies.push(r);
            }
            if last {
                return Ok(replies);
            }
        }
    }

    pub fn netns_mode(&mut self) -> Result<NetnsMode> {
        let seq = self.seq;
        let replies = self.exchange("query the RDMA netns mode", encode_sys_get(seq))?;
        replies
            .into_iter()
            .find_map(|r| match r {
                Reply::System { netns_mode } => netns_mode,
                _ => None,
            })
            .ok_or_else(|| NetError::Protocol {
                op: "query the RDMA netns mode".into(),
                msg: "no mode in the answer".into(),
            })
    }

    /// The index of RDMA device `name`, if the namespace sees it.
    pub fn device_index(&mut self, name: &str) -> Result<Option<u32>> {
        let seq = self.seq;
        let replies = self.exchange("list RDMA devices", encode_dev_dump(seq))?;
        Ok(replies.into_iter().find_map(|r| match r {
            Reply::Device { index, name: n } if n == name => Some(index),
            _ => None,
        }))
    }

    /// Move RDMA device `index` into the namespace of `netns_fd`.
    pub fn move_to_netns(&mut self, index: u32, netns_fd: i32) -> Result<()> {
        let seq = self.seq;
        self.exchange(&format!("move RDMA device #{index}"), encode_set_netns(seq, index, netns_fd as u32)).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golden bytes written from rdma_netlink.h by hand: nlmsghdr {len, type, flags, seq, pid}
    /// in host order (x86_64: little endian), then the attributes.
    #[test]
    fn byte_level_sys_get_request_matches_the_uapi_layout() {
        let b = encode_sys_get(7);
        assert_eq!(
            b,
            [
                16, 0, 0, 0, // len
                0x06, 0x14, // type (5 << 10) + 6 = 0x1406
                0x01, 0x00, // NLM_F_REQUEST
                7, 0, 0, 0, // seq
                0, 0, 0, 0, // pid
            ]
        );
    }

    #[test]
    fn byte_level_set_netns_request_carries_dev_index_and_net_ns_fd() {
        let b = encode_set_netns(9, 3, 11);
        #[rustfmt::skip]
        let golden: [u8; 32] = [
            32, 0, 0, 0,  0x02, 0x14,  0x05, 0x00,  9, 0, 0, 0,  0, 0, 0, 0,
            8, 0, 1, 0,  3, 0, 0, 0,     // RDMA_NLDEV_ATTR_DEV_INDEX = 3
            8, 0, 68, 0,  11, 0, 0, 0,   // RDMA_NLDEV_NET_NS_FD = 11
        ];
        assert_eq!(b, golden);
        assert_eq!(encode_dev_dump(1)[6..8], [0x01, 0x03], "REQUEST | DUMP");
    }

    #[test]
    fn byte_level_replies_decode_devices_mode_acks_and_errors() {
        #[rustfmt::skip]
        let dev: Vec<u8> = vec![
            36, 0, 0, 0,  0x01, 0x14,  0x02, 0x00,  1, 0, 0, 0,  0, 0, 0, 0,
            8, 0, 1, 0,  4, 0, 0, 0,                 // DEV_INDEX 4
            11, 0, 2, 0,  b'm', b'l', b'x', b'5', b'_', b'1', 0, 0,  // DEV_NAME "mlx5_1\0" + pad
        ];
        #[rustfmt::skip]
        let sys: Vec<u8> = vec![
            24, 0, 0, 0,  0x06, 0x14,  0, 0,  2, 0, 0, 0,  0, 0, 0, 0,
            5, 0, 66, 0,  0, 0, 0, 0,                // NETNS_MODE 0 = exclusive
        ];
        let mut err = vec![36, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0];
        err.extend_from_slice(&(-95i32).to_ne_bytes()); // EOPNOTSUPP
        err.extend_from_slice(&encode_sys_get(3));
        let mut ack = vec![36, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        ack.extend_from_slice(&encode_sys_get(4));
        let done = vec![20, 0, 0, 0, 3, 0, 2, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let mut all = dev.clone();
        all.extend(&sys);
        all.extend(&err);
        all.extend(&ack);
        all.extend(&done);
        assert_eq!(
            decode(&all).unwrap(),
            vec![
                Reply::Device { index: 4, name: "mlx5_1".into() },
                Reply::System { netns_mode: Some(NetnsMode::Exclusive) },
                Reply::Error(-95),
                Reply::Ack,
                Reply::Done,
            ]
        );
        let mut shared = sys.clone();
        shared[20] = 1;
        assert_eq!(decode(&shared).unwrap(), vec![Reply::System { netns_mode: Some(NetnsMode::Shared) }]);
    }

    #[test]
    fn byte_level_malformed_replies_are_errors_not_panics() {
        for bad in [
            vec![200, 0, 0, 0, 1, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            vec![20, 0, 0, 0, 1, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 40, 0, 1, 0],
            vec![20, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4][..18].to_vec(),
        ] {
            let _ = decode(&bad); // must not panic
        }
        assert!(decode(&[200, 0, 0, 0, 1, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(decode(&[20, 0, 0, 0, 1, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 40, 0, 1, 0]).is_err());
    }

    #[test]
    fn opening_fails_cleanly_where_the_kernel_has_no_rdma() {
        // On these machines ib_core is absent: the error must be a clear NetError, not a panic.
        match RdmaSocket::open() {
            Ok(_) => {} // a kernel with RDMA
            Err(e) => assert!(e.to_string().starts_with("open RDMA netlink socket"), "{e}"),
        }
    }
}
