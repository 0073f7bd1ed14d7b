//! The scripts' own Python: the steps the benchmark and check scripts take between their shell
//! commands (`scripts/bench/benchtool.py`) pass their unit tests (`scripts/bench/test_benchtool.py`),
//! run with the python3 the test command installs. No root needed.

use std::path::Path;
use std::process::Command;

#[test]
fn the_benchmark_and_check_steps_pass_their_unit_tests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("scripts/bench");
    let out = Command::new("python3")
        .args(["-m", "unittest", "-v", "test_benchtool"])
        .current_dir(&dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 (scripts/test.sh installs it)");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{report}");
    // unittest says how many ran: a test file that lost its tests would pass with none.
    let ran: usize = report
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no 'Ran N tests' line:\n{report}"));
    assert!(ran >= 12, "only {ran} tests ran:\n{report}");
}
