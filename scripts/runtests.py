#!/usr/bin/env python3
"""The test command's runner: every test of the workspace in a process of its own, as
cargo-nextest runs them, scheduled by the same .config/nextest.toml (threads, test groups,
priorities, the timeout), so that a fresh machine need not compile nextest first (170 of the cold
run's CPU seconds). `cargo nextest run` reads the same file and runs the same tests the same way.

    python3 scripts/runtests.py                          # the whole workspace
    python3 scripts/runtests.py -E 'binary(entry_point)' # a filter, nextest's syntax (a subset)
    python3 scripts/runtests.py -p plexus-ipam-core      # arguments for cargo's build of the tests

The filter language is the part of nextest's filtersets the config and the scripts use:
binary(NAME), package(NAME) and test(TEXT) (a glob for binary and package, a substring for test),
all(), none(), not / !, and / &, or / | / +, and parentheses.
"""
import argparse
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field


# --- filtersets -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Test:
    package: str
    binary: str  # nextest's binary name: the test target's name (the lib's: the crate's name)
    binary_id: str  # how nextest prints it: package, or package::binary
    name: str


_TOKEN = re.compile(r"\s*(?:(?P<fn>[a-z_]+)\((?P<arg>[^()]*)\)|(?P<op>&|\||\+|!|\(|\)|\band\b|\bor\b|\bnot\b))")


def parse_filter(expr):
    """A predicate on a Test for a filterset expression; ValueError names what it cannot read."""
    tokens, pos = [], 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"filter {expr!r}: cannot read {expr[pos:].strip()!r}")
        tokens.append(("fn", m["fn"], m["arg"].strip()) if m["fn"] else ("op", m["op"], None))
        pos = m.end()

    def leaf(fn, arg):
        if fn in ("binary", "package", "test") and arg[:1] in ("=", "~", "/", "#"):
            raise ValueError(f"filter {expr!r}: {fn}({arg}): nextest's matchers (=, ~, /re/, #glob) are not read here")
        if fn == "binary":
            return lambda t: fnmatch.fnmatchcase(t.binary, arg)
        if fn == "package":
            return lambda t: fnmatch.fnmatchcase(t.package, arg)
        if fn == "test":
            return lambda t: arg in t.name
        if fn == "all" and arg == "":
            return lambda t: True
        if fn == "none" and arg == "":
            return lambda t: False
        raise ValueError(f"filter {expr!r}: unknown predicate {fn}({arg})")

    def parse_or(i):
        left, i = parse_and(i)
        while i < len(tokens) and tokens[i][1] in ("|", "+", "or"):
            right, i = parse_and(i + 1)
            left = (lambda a, b: lambda t: a(t) or b(t))(left, right)
        return left, i

    def parse_and(i):
        left, i = parse_not(i)
        while i < len(tokens) and tokens[i][1] in ("&", "and"):
            right, i = parse_not(i + 1)
            left = (lambda a, b: lambda t: a(t) and b(t))(left, right)
        return left, i

    def parse_not(i):
        if i >= len(tokens):
            raise ValueError(f"filter {expr!r}: ends early")
        kind, val, arg = tokens[i]
        if kind == "op" and val in ("!", "not"):
            inner, i = parse_not(i + 1)
            return (lambda a: lambda t: not a(t))(inner), i
        if kind == "op" and val == "(":
            inner, i = parse_or(i + 1)
            if i >= len(tokens) or tokens[i][1] != ")":
                raise ValueError(f"filter {expr!r}: a '(' is not closed")
            return inner, i + 1
        if kind == "fn":
            return leaf(val, arg), i + 1
        raise ValueError(f"filter {expr!r}: unexpected {val!r}")

    pred, i = parse_or(0)
    if i != len(tokens):
        raise ValueError(f"filter {expr!r}: unexpected {tokens[i][1]!r}")
    return pred


# --- the config -------------------------------------------------------------------------------

def parse_duration(text):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*", text)
    if not m:
        raise ValueError(f"duration {text!r}: a number and ms, s, m or h")
    return float(m[1]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m[2]]


@dataclass
class Config:
    threads: int = 1
    slow: float = 60.0
    timeout: float | None = None  # slow-timeout's period times terminate-after
    groups: dict = field(default_factory=dict)  # name -> max-threads
    overrides: list = field(default_factory=list)  # (predicate, group or None, priority or None)

    def settings(self, test):
        """(group, priority) for a test: per setting, the first override that matches and sets it."""
        group = priority = None
        for pred, g, p in self.overrides:
            if pred(test):
                group = g if group is None else group
                priority = p if priority is None else priority
        return group, priority or 0


# What this runner reads of nextest's config; anything else is refused, so that the two runners
# never differ silently.
PROFILE_KEYS = {"test-threads", "slow-timeout", "overrides"}
OVERRIDE_KEYS = {"filter", "test-group", "priority"}


def load_config(text):
    doc = tomllib.loads(text)
    if set(doc) - {"profile", "test-groups"} or set(doc.get("profile", {})) - {"default"}:
        raise ValueError("nextest.toml: only [profile.default] and [test-groups] are read here")
    profile = doc.get("profile", {}).get("default", {})
    if set(profile) - PROFILE_KEYS:
        raise ValueError(f"nextest.toml: {sorted(set(profile) - PROFILE_KEYS)} not read here")
    c = Config()
    cpus = os.cpu_count() or 1
    threads = profile.get("test-threads", cpus)
    c.threads = cpus if threads == "num-cpus" else int(threads)
    if c.threads <= 0:
        c.threads = max(1, cpus + c.threads)  # nextest: num-cpus minus that many
    slow = profile.get("slow-timeout")
    if isinstance(slow, str):
        c.slow = parse_duration(slow)
    elif isinstance(slow, dict):
        c.slow = parse_duration(slow["period"])
        if "terminate-after" in slow:
            c.timeout = c.slow * int(slow["terminate-after"])
    c.groups = {name: int(g["max-threads"]) for name, g in doc.get("test-groups", {}).items()}
    for o in profile.get("overrides", []):
        if set(o) - OVERRIDE_KEYS:
            raise ValueError(f"override {o.get('filter')!r}: {sorted(set(o) - OVERRIDE_KEYS)} not read here")
        group = o.get("test-group")
        if group is not None and group not in c.groups:
            raise ValueError(f"override {o['filter']!r}: no test group {group!r}")
        c.overrides.append((parse_filter(o["filter"]), group, o.get("priority")))
    return c


# --- finding the tests ------------------------------------------------------------------------

@dataclass(frozen=True)
class Binary:
    package: str
    name: str
    binary_id: str
    exe: str
    cwd: str


def build_tests(cargo_args):
    """The test binaries cargo builds (nothing when they are built already), as nextest finds them."""
    cmd = ["cargo", "test", "--no-run", "--message-format=json-render-diagnostics", *cargo_args]
    built = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if built.returncode != 0:
        raise SystemExit(f"runtests.py: the tests did not build (`{' '.join(cmd)}` exited {built.returncode})")
    out = built.stdout
    meta = subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1"], stdout=subprocess.PIPE,
                          check=True, text=True).stdout
    packages = {p["manifest_path"]: p["name"] for p in json.loads(meta)["packages"]}
    return binaries_of(out, packages)


def binaries_of(cargo_json, packages):
    """Test binaries from cargo's JSON messages; `packages` maps a manifest's path to its package."""
    found = []
    for line in cargo_json.splitlines():
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("profile", {}).get("test") or not msg.get("executable"):
            continue
        target, package = msg["target"], packages[msg["manifest_path"]]
        kind = target["kind"][0]
        if kind == "bin":
            binary_id = f"{package}::bin/{target['name']}"
        elif kind in ("test", "bench", "example"):
            binary_id = f"{package}::{target['name']}"
        else:
            binary_id = package
        found.append(Binary(package, target["name"], binary_id, msg["executable"], os.path.dirname(msg["manifest_path"])))
    return found


def list_tests(binary):
    """A binary's tests (`--list --format terse`, as nextest asks), ignored ones left out."""
    out = subprocess.run([binary.exe, "--list", "--format", "terse"], cwd=binary.cwd, stdout=subprocess.PIPE,
                         check=True, text=True).stdout
    ignored = subprocess.run([binary.exe, "--list", "--format", "terse", "--ignored"], cwd=binary.cwd,
                             stdout=subprocess.PIPE, check=True, text=True).stdout
    skip = {line[: -len(": test")] for line in ignored.splitlines() if line.endswith(": test")}
    return [line[: -len(": test")] for line in out.splitlines() if line.endswith(": test") and line[: -len(": test")] not in skip]


# --- running them -----------------------------------------------------------------------------

@dataclass
class Job:
    test: Test
    binary: Binary
    group: str | None
    priority: int


@dataclass
class Running:
    job: Job
    proc: subprocess.Popen
    log: object
    started: float
    slow_said: bool = False
    term_at: float | None = None


def order(jobs):
    """Highest priority first, then by binary and name (nextest's order)."""
    return sorted(jobs, key=lambda j: (-j.priority, j.test.binary_id, j.test.name))


def next_runnable(queue, running, config):
    """The first queued job its group has room for (a full group holds only its own tests back)."""
    busy = {}
    for r in running:
        busy[r.job.group] = busy.get(r.job.group, 0) + 1
    for i, j in enumerate(queue):
        if j.group is None or busy.get(j.group, 0) < config.groups[j.group]:
            return i
    return None


class Interrupted(Exception):
    """The runner was told to stop (SIGINT, SIGTERM, SIGHUP, SIGQUIT): the running tests were ended
    first."""


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}


def _stop(signum, frame):
    raise Interrupted()


def run(jobs, config, out=sys.stdout, poll=0.05, grace=10.0):
    """Runs the jobs; returns (passed, failed) lists of (job, seconds, why). Interrupted, it ends
    the running tests (SIGTERM to each test's process group, SIGKILL after `grace`) and raises
    Interrupted: each test runs in a session of its own, out of reach of the terminal's signals.

    While it runs, the stop signals are its own (they raise Interrupted), whatever they were:
    exec resets a handled signal to its default but keeps an ignored one ignored, and a runner
    started with SIGINT and SIGQUIT ignored (`cmd &` from a script, `nohup`, some CI agents)
    would hand that on to every test and the daemons the tests start."""
    running = []
    previous = {sig: signal.signal(sig, _stop) for sig in STOP_SIGNALS}
    try:
        return _run(jobs, config, out, poll, grace, running)
    except (KeyboardInterrupt, Interrupted):
        for r in running:
            _signal_group(r.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        try:
            for r in running:
                try:
                    r.proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _signal_group(r.proc, signal.SIGKILL)
                    r.proc.wait()
        except (KeyboardInterrupt, Interrupted):
            # Told again while waiting: no more grace.
            for r in running:
                _signal_group(r.proc, signal.SIGKILL)
                r.proc.wait()
        for r in running:
            r.log.close()
        raise Interrupted() from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(jobs, config, out, poll, grace, running):
    queue, passed, failed = order(jobs), [], []
    total, done = len(queue), 0
    while queue or running:
        while queue and len(running) < config.threads:
            i = next_runnable(queue, running, config)
            if i is None:
                break
            job = queue.pop(i)
            log = tempfile.TemporaryFile()
            # Signals are not blocked around the start: a test inherits the mask it is started
            # with, and one started with SIGTERM blocked never sees its daemons' SIGTERM either.
            proc = subprocess.Popen([job.binary.exe, "--exact", job.test.name, "--nocapture"], cwd=job.binary.cwd,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            running.append(Running(job, proc, log, time.monotonic()))
        time.sleep(poll)
        now = time.monotonic()
        for r in list(running):
            took = now - r.started
            rc = r.proc.poll()
            if rc is None:
                if not r.slow_said and took >= config.slow:
                    r.slow_said = True
                    print(f"        SLOW [>{config.slow:7.1f}s] {r.job.test.binary_id} {r.job.test.name}", file=out, flush=True)
                if config.timeout is not None and took >= config.timeout and r.term_at is None:
                    r.term_at = now
                    _signal_group(r.proc, signal.SIGTERM)
                elif r.term_at is not None and now - r.term_at >= grace:
                    _signal_group(r.proc, signal.SIGKILL)
                continue
            running.remove(r)
            done += 1
            r.log.seek(0)
            output = r.log.read().decode(errors="replace")
            r.log.close()
            line = f"[{took:8.3f}s] ({done}/{total}) {r.job.test.binary_id} {r.job.test.name}"
            if rc == 0 and r.term_at is None:
                passed.append((r.job, took, ""))
                print(f"        PASS {line}", file=out, flush=True)
            else:
                why = f"timed out after {config.timeout:g} s" if r.term_at is not None else f"exit status {rc}"
                failed.append((r.job, took, why))
                print(f"        FAIL {line} ({why})\n--- output ---\n{output}--- end ---", file=out, flush=True)
    return passed, failed


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-E", "--filter-expr", action="append", default=[], help="a filterset (nextest's syntax, a subset)")
    ap.add_argument("--nextest-config", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".config", "nextest.toml"))
    # Everything else is for `cargo test --no-run` (default: --workspace).
    args, cargo_args = ap.parse_known_args(argv)
    with open(args.nextest_config, "rb") as f:
        config = load_config(f.read().decode())
    filters = [parse_filter(e) for e in args.filter_expr]
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop)
    started = time.monotonic()
    jobs = []
    for b in build_tests(cargo_args or ["--workspace"]):
        for name in list_tests(b):
            t = Test(b.package, b.name, b.binary_id, name)
            if filters and not any(f(t) for f in filters):
                continue
            group, priority = config.settings(t)
            jobs.append(Job(t, b, group, priority))
    if not jobs:
        # As nextest: a run that selects nothing is a mistake (a filter matching no test).
        print("runtests.py: no test matches", file=sys.stderr)
        return 4
    print(f"    Starting {len(jobs)} tests, {config.threads} at a time", flush=True)
    try:
        passed, failed = run(jobs, config)
    except Interrupted:
        print("runtests.py: interrupted; the running tests were ended", file=sys.stderr)
        return 130
    took = time.monotonic() - started
    print("────────────")
    print(f"     Summary [{took:8.3f}s] {len(jobs)} tests run: {len(passed)} passed, {len(failed)} failed")
    for job, secs, why in failed:
        print(f"        FAIL [{secs:8.3f}s] {job.test.binary_id} {job.test.name} ({why})")
    return 100 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
