//! The scripts' own Python passes its unit tests, run with the python3 the test command installs:
//! the steps the benchmark and check scripts take between their shell commands
//! (`scripts/bench/benchtool.py`, `scripts/bench/test_benchtool.py`) and the test command's runner
//! (`scripts/runtests.py`, `scripts/test_runtests.py`). No root needed.

use std::path::Path;
use std::process::Command;

/// `python3 -m unittest MODULE` in `dir` (under the repository) passes, and ran at least `at_least`
/// tests: unittest says how many ran, and a test file that lost its tests would pass with none.
fn unit_tests_pass(dir: &str, module: &str, at_least: usize) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join(dir);
    let out = Command::new("python3")
        .args(["-m", "unittest", "-v", module])
        .current_dir(&dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 (scripts/test.sh installs it)");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{report}");
    let ran: usize = report
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no 'Ran N tests' line:\n{report}"));
    assert!(ran >= at_least, "only {ran} tests ran:\n{report}");
}

#[test]
fn the_benchmark_and_check_steps_pass_their_unit_tests() {
    unit_tests_pass("scripts/bench", "test_benchtool", 12);
}

#[test]
fn the_test_runner_reads_filters_and_the_config_as_nextest_and_keeps_groups_priorities_and_the_timeout() {
    unit_tests_pass("scripts", "test_runtests", 15);
}
