//! Network namespace handles. The only place plexus calls `setns`: always on a short-lived
//! thread of its own, never on a thread tokio may schedule work on.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns, unshare};

use crate::error::{NetError, Result};

/// An open network namespace.
#[derive(Debug)]
pub struct Netns {
    file: File,
    path: PathBuf,
}

impl Netns {
    /// Open the namespace at `path` (`/run/netns/x`, `/proc/<pid>/ns/net`).
    pub fn open(path: &Path) -> Result<Netns> {
        let file = File::open(path).map_err(|source| NetError::NetnsOpen { path: path.to_path_buf(), source })?;
        Ok(Netns { file, path: path.to_path_buf() })
    }

    /// The namespace of the calling thread.
    pub fn current() -> Result<Netns> {
        Netns::open(Path::new("/proc/thread-self/ns/net"))
    }

    /// Another handle on the same namespace.
    pub fn try_clone(&self) -> Result<Netns> {
        let file = self.file.try_clone().map_err(|e| NetError::io(format!("dup netns handle {:?}", self.path), e))?;
        Ok(Netns { file, path: self.path.clone() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Run `f` on a fresh thread that has joined this namespace (sysctls, sockets of other
    /// families). The thread ends with `f`, so no other work ever runs in the namespace.
    pub fn run<T: Send>(&self, what: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
        let fd = self.file.as_fd();
        std::thread::scope(|s| {
            s.spawn(move || enter(fd, what, &self.path).map(|()| f())).join().unwrap_or_else(|_| Err(panicked(what)))
        })
    }

    /// Which of `names` are interfaces in this namespace (`if_nametoindex` from a thread that
    /// joined it: no netlink socket, no runtime — the meta-plugin asks before every ADD).
    pub fn existing_links(&self, names: &[&str]) -> Result<Vec<String>> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        self.run("look up interface names", move || {
            names.into_iter().filter(|n| nix::net::if_::if_nametoindex(n.as_str()).is_ok()).collect()
        })
    }

    /// Start `f` on a fresh thread that joins this namespace, and go on: the caller does other
    /// work meanwhile and collects `f`'s value with [`InNetns::join`]. Like [`Netns::run`], the
    /// thread ends with `f`.
    pub fn spawn<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<InNetns<T>> {
        let file = self.file.try_clone().map_err(|e| NetError::io(format!("{what}: dup netns handle"), e))?;
        let path = self.path.clone();
        let thread = std::thread::Builder::new()
            .name("netns".into())
            .spawn(move || enter(file.as_fd(), what, &path).map(|()| f()))
            .map_err(|e| NetError::io(format!("{what}: start thread"), e))?;
        Ok(InNetns { what, thread })
    }
    /// Write sysctls (paths under `/proc/sys`, see [`sysctl`]) inside this namespace, in order.
    pub fn write_sysctls(&self, settings: &[(PathBuf, &str)]) -> Result<()> {
        if settings.is_empty() {
            return Ok(());
        }
        self.run("sysctl", || {
            for (key, value) in settings {
                std::fs::write(Path::new("/proc/sys").join(key), value)
                    .map_err(|e| NetError::io(format!("sysctl {}={value}", key.display()), e))?;
            }
            Ok(())
        })?
    }
}

/// Work started by [`Netns::spawn`], running in that namespace.
#[derive(Debug)]
pub struct InNetns<T> {
    what: &'static str,
    thread: std::thread::JoinHandle<Result<T>>,
}

impl<T> InNetns<T> {
    /// Wait for the work and take its value.
    pub fn join(self) -> Result<T> {
        self.thread.join().unwrap_or_else(|_| Err(panicked(self.what)))
    }
}

/// Join the namespace `fd` on the calling thread, which must be one of [`Netns::run`]'s or
/// [`Netns::spawn`]'s own.
fn enter(fd: BorrowedFd<'_>, what: &str, path: &Path) -> Result<()> {
    // A private fs context, so setns cannot be refused for a shared one.
    unshare(CloneFlags::CLONE_FS).map_err(|e| NetError::io(format!("{what}: unshare"), e.into()))?;
    setns(fd, CloneFlags::CLONE_NEWNET).map_err(|e| NetError::io(format!("{what}: enter netns {path:?}"), e.into()))
}

fn panicked(what: &str) -> NetError {
    NetError::Protocol { op: what.into(), msg: "thread panicked".into() }
}

/// Create a named network namespace at `path` (`/run/netns/<name>`, as `ip netns add` does): a
/// fresh namespace made on a short-lived thread and bind-mounted there.
pub fn create_named(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| NetError::io(format!("create {}", dir.display()), e))?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| NetError::io(format!("create {}", path.display()), e))?;
    let target = path.to_path_buf();
    let made = std::thread::spawn(move || -> Result<()> {
        unshare(CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_FS)
            .map_err(|e| NetError::io("unshare a network namespace", e.into()))?;
        nix::mount::mount(
            Some("/proc/thread-self/ns/net"),
            &target,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| NetError::io(format!("bind-mount the namespace at {}", target.display()), e.into()))
    })
    .join()
    .unwrap_or_else(|_| Err(NetError::Protocol { op: "create netns".into(), msg: "thread panicked".into() }));
    if made.is_err() {
        let _ = std::fs::remove_file(path);
    }
    made
}

/// Remove a named namespace made by [`create_named`] (or `ip netns add`).
pub fn delete_named(path: &Path) -> Result<()> {
    let _ = nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH);
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(NetError::io(format!("remove {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

/// The `/proc/sys` path of a per-interface setting: `sysctl("ipv4", "net1", "arp_notify")`.
/// Built from parts, because interface names may contain dots.
pub fn sysctl(family: &str, ifname: &str, key: &str) -> PathBuf {
    ["net", family, "conf", ifname, key].iter().collect()
}

/// Every address configured in the calling thread's network namespace, with its interface's
/// name (`getifaddrs(3)`: one netlink dump, no thread of its own): called in the node's
/// namespace, the node's own addresses — on its ports and anywhere else.
pub fn addresses_here() -> Result<Vec<(String, std::net::IpAddr)>, crate::NetError> {
    let all = nix::ifaddrs::getifaddrs()
        .map_err(|e| crate::NetError::netlink("list the namespace's addresses", std::io::Error::from(e)))?;
    Ok(all
        .filter_map(|a| {
            let addr = a.address?;
            let ip = match (addr.as_sockaddr_in(), addr.as_sockaddr_in6()) {
                (Some(v4), _) => std::net::IpAddr::V4(v4.ip()),
                (_, Some(v6)) => std::net::IpAddr::V6(v6.ip()),
                _ => return None,
            };
            Some((a.interface_name, ip))
        })
        .collect())
}
