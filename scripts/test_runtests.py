"""Unit tests of scripts/runtests.py, the test command's runner (run by tests/tests/scripts.rs):
the filter language, the config as nextest reads it, cargo's messages, and the scheduling against
fake test binaries (shell scripts that answer `--list` and run a test by `--exact NAME`)."""
import io
import json
import os
import stat
import _thread
import tempfile
import textwrap
import threading
import time
import unittest

import runtests as rt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def t(binary, name, package="plexus-tests"):
    return rt.Test(package, binary, f"{package}::{binary}", name)


class Filters(unittest.TestCase):
    def test_binary_matches_the_whole_name_or_a_glob_and_test_a_substring(self):
        self.assertTrue(rt.parse_filter("binary(cluster)")(t("cluster", "a")))
        self.assertFalse(rt.parse_filter("binary(cluster)")(t("cluster_more", "a")))
        self.assertTrue(rt.parse_filter("binary(clu*)")(t("cluster_more", "a")))
        self.assertTrue(rt.parse_filter("test(keep_their)")(t("x", "pods_keep_their_networks")))
        self.assertTrue(rt.parse_filter("package(plexus-tests)")(t("x", "a")))

    def test_and_binds_tighter_than_or_and_parentheses_and_not_change_that(self):
        f = rt.parse_filter("binary(a) & test(x) | binary(b)")
        self.assertTrue(f(t("a", "x1")))
        self.assertFalse(f(t("a", "y")))
        self.assertTrue(f(t("b", "y")))
        g = rt.parse_filter("binary(a) & (test(x) | test(y))")
        self.assertTrue(g(t("a", "y")))
        self.assertFalse(g(t("b", "y")))
        self.assertTrue(rt.parse_filter("not binary(a)")(t("b", "z")))
        self.assertFalse(rt.parse_filter("!binary(a) and all()")(t("a", "z")))
        self.assertTrue(rt.parse_filter("none() or binary(a) + binary(c)")(t("c", "z")))

    def test_what_it_cannot_read_is_an_error_naming_it(self):
        for bad, says in [("binary(a) &", "ends early"), ("(binary(a)", "not closed"), ("kind(lib)", "unknown"),
                          ("binary(a) binary(b)", "unexpected"), ("binary(a) % x", "cannot read"),
                          ("test(=exact)", "matchers"), ("binary(~clu)", "matchers"), ("test(/re/)", "matchers")]:
            with self.assertRaises(ValueError) as e:
                rt.parse_filter(bad)
            self.assertIn(says, str(e.exception), bad)


class Config(unittest.TestCase):
    def test_the_repositorys_config_runs_four_at_once_three_clusters_and_the_longest_first(self):
        with open(os.path.join(REPO, ".config", "nextest.toml")) as f:
            c = rt.load_config(f.read())
        self.assertEqual(c.threads, 4)
        self.assertEqual(c.groups, {"cluster": 3})
        self.assertEqual(c.timeout, 600)
        self.assertEqual(c.settings(t("cluster", "plexus_ipam_and_whereabouts_share_one_pool")), ("cluster", 100))
        self.assertEqual(c.settings(t("cluster", "kubelet_runs_a_pod")), ("cluster", 50))
        self.assertEqual(c.settings(t("two_nodes", "anything")), ("cluster", 100))
        self.assertEqual(c.settings(t("ipam", "anything")), (None, 0))

    def test_each_setting_comes_from_the_first_override_that_sets_it(self):
        c = rt.load_config(textwrap.dedent("""
            [profile.default]
            test-threads = 2
            slow-timeout = "30s"
            [test-groups]
            g = { max-threads = 1 }
            [[profile.default.overrides]]
            filter = 'binary(a)'
            priority = 5
            [[profile.default.overrides]]
            filter = 'binary(a) | binary(b)'
            test-group = 'g'
            priority = 1
            """))
        self.assertEqual((c.threads, c.slow, c.timeout), (2, 30, None))
        self.assertEqual(c.settings(t("a", "x")), ("g", 5))
        self.assertEqual(c.settings(t("b", "x")), ("g", 1))

    def test_a_setting_it_does_not_read_is_refused_not_ignored(self):
        for text in ["[profile.default]\nretries = 2\n", "[profile.ci]\ntest-threads = 1\n",
                     "[[profile.default.overrides]]\nfilter = 'all()'\nslow-timeout = '1s'\n"]:
            with self.assertRaises(ValueError, msg=text):
                rt.load_config(text)

    def test_a_thread_count_below_one_counts_down_from_the_cpus(self):
        c = rt.load_config("[profile.default]\ntest-threads = -100\n")
        self.assertEqual(c.threads, 1)

    def test_an_override_naming_a_group_that_is_not_there_is_an_error(self):
        with self.assertRaises(ValueError):
            rt.load_config("[[profile.default.overrides]]\nfilter = 'all()'\ntest-group = 'nope'\n")
        with self.assertRaises(ValueError):
            rt.parse_duration("60 seconds")


class CargoMessages(unittest.TestCase):
    def test_test_executables_are_found_and_named_as_nextest_names_them(self):
        def art(kind, name, test, exe, manifest="/r/tests/Cargo.toml"):
            return json.dumps({"reason": "compiler-artifact", "manifest_path": manifest,
                               "target": {"kind": [kind], "name": name, "src_path": "/r/x.rs"},
                               "profile": {"test": test}, "executable": exe})
        lines = [art("test", "cluster", True, "/t/cluster-1"), art("lib", "plexus_tests", True, "/t/plexus_tests-2"),
                 art("bin", "plexus-test-plugin", True, "/t/plugin-3"), art("bin", "plexus-test-plugin", False, "/t/plugin"),
                 art("lib", "plexus_tests", False, None), json.dumps({"reason": "build-finished", "success": True}),
                 "warning: not json"]
        found = rt.binaries_of("\n".join(lines), {"/r/tests/Cargo.toml": "plexus-tests"})
        self.assertEqual([(b.binary_id, b.name, b.exe, b.cwd) for b in found], [
            ("plexus-tests::cluster", "cluster", "/t/cluster-1", "/r/tests"),
            ("plexus-tests", "plexus_tests", "/t/plexus_tests-2", "/r/tests"),
            ("plexus-tests::bin/plexus-test-plugin", "plexus-test-plugin", "/t/plugin-3", "/r/tests"),
        ])


FAKE = """#!/bin/sh
# A test binary: `--list --format terse [--ignored]`, or `--exact NAME --nocapture`.
if [ "$1" = --list ]; then
  if [ "$4" = --ignored ]; then echo "ignored_one: test"; exit 0; fi
  printf 'g_one: test\\ng_two: test\\ng_three: test\\nfree: test\\nfails: test\\nhangs: test\\nsignals: test\\nignored_one: test\\nbench_x: benchmark\\n'
  exit 0
fi
name=$2
echo "start $name $(date +%s.%N)" >> "$LOG"
echo "pid $name $$" >> "$LOG"
case $name in
  g_*) sleep 0.3 ;;
  free) sleep 0.2 ;;
  fails) echo "assertion failed: the output is shown"; exit 101 ;;
  hangs) trap '' TERM; sleep 30 ;;
  signals) grep -E '^Sig(Blk|Ign)' /proc/$$/status | tr -d '\t' | sed 's/^/sig /' >> "$LOG" ;;
esac
echo "end $name $(date +%s.%N)" >> "$LOG"
"""


def fake_binary(dir):
    """FAKE written to DIR/fake, executable; its path."""
    exe = os.path.join(dir, "fake")
    with open(exe, "w") as f:
        f.write(FAKE)
    os.chmod(exe, stat.S_IRWXU)
    return exe


class Scheduling(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.exe = fake_binary(self.dir.name)
        self.log = os.path.join(self.dir.name, "log")
        os.environ["LOG"] = self.log
        self.binary = rt.Binary("p", "fake", "p::fake", self.exe, self.dir.name)

    def tearDown(self):
        del os.environ["LOG"]
        self.dir.cleanup()

    def spans(self):
        start, end = {}, {}
        with open(self.log) as f:
            for line in f:
                what, name, at = line.split()
                if what not in ("pid", "sig"):
                    (start if what == "start" else end)[name] = float(at)
        return start, end

    def test_listing_leaves_out_ignored_tests_and_benchmarks(self):
        self.assertEqual(rt.list_tests(self.binary), ["g_one", "g_two", "g_three", "free", "fails", "hangs", "signals"])

    def test_a_group_runs_no_more_than_its_share_and_the_rest_runs_beside_it_highest_priority_first(self):
        c = rt.Config(threads=3, groups={"g": 1})
        jobs = [rt.Job(rt.Test("p", "fake", "p::fake", n), self.binary, "g" if n.startswith("g_") else None,
                       10 if n == "g_three" else 0) for n in ["g_one", "g_two", "g_three", "free"]]
        out = io.StringIO()
        passed, failed = rt.run(jobs, c, out=out, poll=0.01)
        self.assertEqual((len(passed), failed), (4, []))
        start, end = self.spans()
        group = sorted(((start[n], end[n]) for n in ["g_one", "g_two", "g_three"]))
        for (_, e1), (s2, _) in zip(group, group[1:]):
            self.assertLessEqual(e1, s2, f"two of group g at once: {group}")
        self.assertLess(start["g_three"], start["g_one"])
        self.assertLess(start["free"], end["g_three"], "the test outside the group waited for it")
        self.assertIn("PASS", out.getvalue())

    def test_a_failing_test_is_reported_with_its_output_and_a_hanging_one_is_killed_at_the_timeout(self):
        c = rt.Config(threads=2, slow=0.2, timeout=0.5)
        jobs = [rt.Job(rt.Test("p", "fake", "p::fake", n), self.binary, None, 0) for n in ["fails", "hangs"]]
        out = io.StringIO()
        began = time.monotonic()
        passed, failed = rt.run(jobs, c, out=out, poll=0.01, grace=0.3)
        self.assertLess(time.monotonic() - began, 5, "the hanging test was not killed")
        self.assertEqual(passed, [])
        why = {j.test.name: w for j, _, w in failed}
        self.assertEqual(why, {"fails": "exit status 101", "hangs": "timed out after 0.5 s"})
        self.assertIn("assertion failed: the output is shown", out.getvalue())
        self.assertIn("SLOW", out.getvalue())

    def test_a_test_starts_with_no_signal_blocked_or_ignored(self):
        # A test that inherited a blocked SIGTERM would pass it on to the daemons it starts, which
        # then never stop when told to (the daemon tests found it).
        jobs = [rt.Job(rt.Test("p", "fake", "p::fake", "signals"), self.binary, None, 0)]
        passed, failed = rt.run(jobs, rt.Config(threads=1), out=io.StringIO(), poll=0.01)
        self.assertEqual((len(passed), failed), (1, []))
        with open(self.log) as f:
            masks = dict(line.split()[1].split(":") for line in f if line.startswith("sig "))
        import signal
        for what in ("SigBlk", "SigIgn"):
            mask = int(masks[what], 16)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
                self.assertFalse(mask & (1 << (sig - 1)), f"{sig.name} in {what} {masks[what]}")

    def test_started_with_sigint_and_sigquit_ignored_a_test_still_starts_with_none_ignored(self):
        # How `cmd &` in a script (nohup, some CI agents) starts the runner: the test command
        # must pass however it is started.
        import signal
        ignored = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGQUIT)}
        try:
            self.test_a_test_starts_with_no_signal_blocked_or_ignored()
        finally:
            for s, handler in ignored.items():
                signal.signal(s, handler)

    def test_interrupted_it_ends_the_running_tests_before_it_stops(self):
        c = rt.Config(threads=1)
        jobs = [rt.Job(rt.Test("p", "fake", "p::fake", "hangs"), self.binary, None, 0)]
        def started():
            try:
                with open(self.log) as f:
                    return next((int(line.split()[2]) for line in f if line.startswith("pid hangs")), None)
            except FileNotFoundError:
                return None

        def interrupt_once_started():
            deadline = time.monotonic() + 20
            while started() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            _thread.interrupt_main()

        threading.Thread(target=interrupt_once_started, daemon=True).start()
        with self.assertRaises(rt.Interrupted):
            rt.run(jobs, c, out=io.StringIO(), poll=0.01, grace=0.3)
        pid = started()
        self.assertIsNotNone(pid, "the test never started")
        self.assertFalse(os.path.exists(f"/proc/{pid}"), "the test outlived the runner")


class Main(unittest.TestCase):
    def test_a_filter_that_selects_no_test_fails_the_run(self):
        dir = tempfile.TemporaryDirectory()
        self.addCleanup(dir.cleanup)
        exe = fake_binary(dir.name)
        real = rt.build_tests
        rt.build_tests = lambda args: [rt.Binary("p", "fake", "p::fake", exe, dir.name)]
        self.addCleanup(setattr, rt, "build_tests", real)
        self.assertEqual(rt.main(["-E", "binary(entry_point)"]), 4)


if __name__ == "__main__":
    unittest.main()
