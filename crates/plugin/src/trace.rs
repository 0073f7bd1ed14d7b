//! The runtime's trace context, handed on to every delegate.
//!
//! A runtime that traces (libcni since 2026: containernetworking/cni#1173) gives a plugin the W3C
//! trace context of the operation in its environment, as OpenTelemetry carries context between
//! processes: `TRACEPARENT`, `TRACESTATE` and `BAGGAGE`. A plexus plugin hands them on to every
//! delegate it runs — in the delegate's environment, whether the delegate is exec'd or run
//! in-process, and whatever process runs it (plexus-daemon runs a request with the environment
//! the shim sent, not its own). Who may set them: whoever execs the plugin (the runtime); a
//! network config cannot. A value that is not a trace context of the W3C form (or is longer than
//! the W3C bounds) is dropped, never handed on.

/// The variables of the trace context, and the most bytes each may hold (W3C Trace Context:
/// traceparent 55, tracestate 32 members of at most 256; W3C Baggage: 8,192).
pub const TRACE_CONTEXT_ENV: [(&str, usize); 3] = [("TRACEPARENT", 55), ("TRACESTATE", 8_223), ("BAGGAGE", 8_192)];

/// The trace context in the environment `getenv` reads, as the variables a delegate gets.
pub fn carried(getenv: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    TRACE_CONTEXT_ENV
        .iter()
        .filter_map(|&(key, most)| {
            let value = getenv(key)?;
            let ok = value.len() <= most
                && value.bytes().all(|b| (0x20..0x7f).contains(&b))
                && (key != "TRACEPARENT" || is_traceparent(&value));
            if !ok {
                tracing::debug!("{key}: not a trace context, not handed on");
            }
            ok.then(|| (key.to_string(), value))
        })
        .collect()
}

/// `version-traceid-parentid-flags`, lowercase hex of 2, 32, 16 and 2 digits; version `ff` and
/// all-zero IDs are invalid.
fn is_traceparent(v: &str) -> bool {
    let parts: Vec<&str> = v.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && nonzero(parts[1])
        && hex(parts[2], 16)
        && nonzero(parts[2])
        && hex(parts[3], 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn a_w3c_trace_context_is_handed_on_whole() {
        let vars =
            [("TRACEPARENT", PARENT), ("TRACESTATE", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"), ("BAGGAGE", "k=v")];
        let got = carried(env(&vars));
        assert_eq!(got, vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>());
        assert!(carried(env(&[])).is_empty());
    }

    #[test]
    fn what_is_not_a_trace_context_is_dropped() {
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n",
        ] {
            assert!(carried(env(&[("TRACEPARENT", bad)])).is_empty(), "{bad:?}");
        }
        let long = "k=".to_string() + &"v".repeat(8_191);
        assert!(carried(env(&[("BAGGAGE", &long)])).is_empty());
        assert!(carried(env(&[("TRACESTATE", "a=b\u{1b}[31m")])).is_empty());
    }
}
