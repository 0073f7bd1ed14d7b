//! Logging for plugins: `logFile`, `logLevel` and `logToStderr` from the config, through tracing.
//! Never stdout: stdout carries the one result document.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;

use tracing::level_filters::LevelFilter;
use tracing::subscriber::DefaultGuard;

use crate::config::NetConf;

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

/// Start logging as the config asks, for the rest of this invocation (until the guard drops).
/// Without `logFile` or `logToStderr` nothing is logged. A log file that cannot be opened is
/// reported on stderr and otherwise ignored: logging must never fail an attachment.
pub fn init(config: &NetConf, plugin: &str) -> Option<DefaultGuard> {
    let text = |k: &str| config.extra.get(k).and_then(|v| v.as_str()).filter(|s| !s.is_empty());
    let level = level(text("logLevel").unwrap_or("error"));
    let builder =
        tracing_subscriber::fmt().with_max_level(level).with_ansi(false).with_target(false).with_thread_ids(false);
    if let Some(path) = text("logFile") {
        match open_log(Path::new(path)) {
            Ok(file) => {
                let sub = builder.with_writer(Mutex::new(file)).finish();
                return Some(tracing::subscriber::set_default(sub));
            }
            Err(e) => eprintln!("{plugin}: cannot open logFile {path:?}: {e}"),
        }
    }
    if config.extra.get("logToStderr").and_then(|v| v.as_bool()) == Some(true) {
        let sub = builder.with_writer(std::io::stderr).finish();
        return Some(tracing::subscriber::set_default(sub));
    }
    None
}

fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}
