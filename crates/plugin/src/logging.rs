//! Logging for plugins, through tracing. Never stdout: stdout carries the one result document.
//!
//! Where a plugin logs is the admin's choice, never a network config's: a NetworkAttachmentDefinition
//! is tenant-written, and root appending to a path it names is root writing where the tenant
//! says. So the destination comes from, in order:
//! - the meta-plugin's own config (`logFile`, `logLevel`, `logToStderr`: Multus's keys), which
//!   the admin writes in the CNI conf dir — only when the plugin says its config is the admin's;
//! - `PLEXUS_LOG_FILE` / `PLEXUS_LOG_LEVEL`, which the meta-plugin sets for its delegates from
//!   its own settings (the environment is the runtime's, not a tenant's);
//! - the node policy's `log`.
//!
//! A delegate's own `logFile`/`logLevel` keys are ignored. A log file is opened
//! `O_NOFOLLOW|O_NONBLOCK` and used only when it is a regular file (a FIFO or device would hang or
//! leak); one that cannot be opened is reported on stderr: logging never fails an attachment.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tracing::level_filters::LevelFilter;
use tracing::subscriber::DefaultGuard;

use plexus_cni::config::NetConf;
use plexus_node::policy::Policy;

/// The log file the meta-plugin hands its delegates.
pub const LOG_FILE_ENV: &str = "PLEXUS_LOG_FILE";
/// The log level the meta-plugin hands its delegates.
pub const LOG_LEVEL_ENV: &str = "PLEXUS_LOG_LEVEL";

/// The level a `logLevel` value names. Multus and whereabouts say `debug`, `verbose`, `error`,
/// `panic`; the tracing names are accepted too. Unknown values fall back to `error`.
pub fn level(name: &str) -> LevelFilter {
    match name.to_ascii_lowercase().as_str() {
        "trace" => LevelFilter::TRACE,
        "debug" => LevelFilter::DEBUG,
        "verbose" | "info" => LevelFilter::INFO,
        "warn" | "warning" => LevelFilter::WARN,
        "off" => LevelFilter::OFF,
        _ => LevelFilter::ERROR, // "error", "panic" and anything else
    }
}

/// Where and how much one invocation logs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogTarget {
    pub file: Option<PathBuf>,
    pub level: Option<String>,
    pub to_stderr: bool,
}

impl LogTarget {
    /// The destination for this invocation: the admin's config (when `admin_config`), else what
    /// the meta-plugin passed down, else the policy's.
    pub fn choose(
        config: &NetConf,
        admin_config: bool,
        getenv: impl Fn(&str) -> Option<String>,
        policy: &Policy,
    ) -> LogTarget {
        let text = |k: &str| config.extra.get(k).and_then(|v| v.as_str()).filter(|s| !s.is_empty()).map(String::from);
        if admin_config {
            let to_stderr = config.extra.get("logToStderr").and_then(|v| v.as_bool()) == Some(true);
            if text("logFile").is_some() || to_stderr {
                return LogTarget { file: text("logFile").map(PathBuf::from), level: text("logLevel"), to_stderr };
            }
        }
        let env = |k: &str| getenv(k).filter(|v| !v.is_empty());
        if let Some(file) = env(LOG_FILE_ENV) {
            return LogTarget { file: Some(file.into()), level: env(LOG_LEVEL_ENV), to_stderr: false };
        }
        LogTarget { file: policy.log.file.clone(), level: policy.log.level.clone(), to_stderr: false }
    }
}

/// `text` with its control characters escaped (`\x1b`, `\n`, `\u{9b}`...): tenant strings
/// (interface names, NAD names and configs, annotations) reach logs and terminals, and an ESC or a
/// newline in one must not rewrite what an operator sees or forge a log line.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 && c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.into()
}

/// A log writer that escapes control characters in each record ([`escape_controls`]), all but
/// the newline that ends it: whatever a tenant string holds, one record stays one line.
pub struct Escaping<W>(pub W);

impl<W: std::io::Write> std::io::Write for Escaping<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (body, end) = match text.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (&*text, ""),
        };
        let escaped = escape_controls(body);
        self.0.write_all(escaped.as_bytes())?;
        self.0.write_all(end.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Start logging to `target` for the rest of this invocation (until the guard drops).
pub fn init(target: &LogTarget, plugin: &str) -> Option<DefaultGuard> {
    let level = level(target.level.as_deref().unwrap_or("error"));
    let builder =
        tracing_subscriber::fmt().with_max_level(level).with_ansi(false).with_target(false).with_thread_ids(false);
    if let Some(path) = &target.file {
        match open_log(path) {
            Ok(file) => {
                let sub = builder.with_writer(Mutex::new(Escaping(file))).finish();
                return Some(tracing::subscriber::set_default(sub));
            }
            Err(e) => eprintln!("{plugin}: cannot open log file {:?}: {e}", path.display().to_string()),
        }
    }
    if target.to_stderr {
        let sub = builder.with_writer(|| Escaping(std::io::stderr())).finish();
        return Some(tracing::subscriber::set_default(sub));
    }
    None
}

/// Open (create 0600) a log file for appending: never through a symlink, never blocking on a
/// FIFO, and only a regular file is kept.
pub fn open_log(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let flags = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC;
    let file = OpenOptions::new().create(true).append(true).mode(0o600).custom_flags(flags.bits()).open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(v: serde_json::Value) -> NetConf {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_delegate_config_never_chooses_the_log_file() {
        let c = conf(json!({"logFile": "/etc/ld.so.preload", "logLevel": "debug"}));
        let policy = Policy::default();
        assert_eq!(LogTarget::choose(&c, false, |_| None, &policy), LogTarget::default());
        let passed = |k: &str| match k {
            LOG_FILE_ENV => Some("/var/log/plexus.log".to_string()),
            LOG_LEVEL_ENV => Some("debug".to_string()),
            _ => None,
        };
        let t = LogTarget::choose(&c, false, passed, &policy);
        assert_eq!(t.file.as_deref(), Some(Path::new("/var/log/plexus.log")));
        let t = LogTarget::choose(&c, true, |_| None, &policy);
        assert_eq!(t.file.as_deref(), Some(Path::new("/etc/ld.so.preload")), "the admin's own config is honoured");
    }

    #[test]
    fn control_characters_in_tenant_strings_are_escaped_and_a_record_stays_one_line() {
        assert_eq!(escape_controls("net1"), "net1");
        assert_eq!(escape_controls("a\x1b[2Jb\x07"), "a\\x1b[2Jb\\x07");
        assert_eq!(escape_controls("x\ny\u{9b}"), "x\\ny\\u{9b}");
        let mut out = Vec::new();
        std::io::Write::write_all(&mut Escaping(&mut out), b"ERROR ifname \"e\x1b]0;owned\x07\"\nforged line\n")
            .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "ERROR ifname \"e\\x1b]0;owned\\x07\"\\nforged line\n");
    }

    #[test]
    fn log_files_are_regular_files_never_symlinks_or_fifos() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("link")).unwrap();
        assert!(open_log(&dir.path().join("link")).is_err());
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let started = std::time::Instant::now();
        assert!(open_log(&fifo).is_err());
        assert!(started.elapsed() < std::time::Duration::from_secs(1), "never blocks");
        assert!(open_log(&dir.path().join("ok.log")).is_ok());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }
}
