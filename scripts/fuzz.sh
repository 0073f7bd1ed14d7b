#!/usr/bin/env bash
# Run the fuzz targets (fuzz/, libFuzzer) for SECONDS each (default 60), all of them
# or the ones named, and print one line per target: executions, coverage, crashes. Exit 1 when a
# target crashed (its input is in $PLEXUS_FUZZ_DIR/artifacts/<target>/; commit it under
# fuzz/regressions/<target>/ with the fix: every run replays those first).
#
#   bash scripts/fuzz.sh               # every target, 60 s each
#   bash scripts/fuzz.sh 600 result    # one target, 10 minutes
#   PLEXUS_FUZZ_RUNS=10000000 bash scripts/fuzz.sh 0 rdma   # a number of executions instead
#   PLEXUS_FUZZ_JOBS=2 bash scripts/fuzz.sh 60               # two targets at a time (one core each)
#   bash scripts/fuzz.sh --build-only  # only the build (scripts/test.sh, while the tests run)
#   PLEXUS_FUZZ_OPT_LEVEL=1 bash scripts/fuzz.sh 5   # built less optimised, in less time
#                                                      # (scripts/test.sh's 5-second runs)
#
# Built optimised with debug assertions (overflow checks on) and AddressSanitizer, with the nightly
# toolchain (sanitizers; installed here when missing), as `cargo fuzz build -O --debug-assertions`
# builds them: its flags (libFuzzer's coverage instrumentation, --cfg fuzzing) given to cargo
# here, so that cargo-fuzz need not be compiled first (some 75 CPU seconds on a fresh machine);
# `cargo fuzz run TARGET` works on fuzz/ as ever. The build, the growing corpora and the
# artifacts live outside the clone ($PLEXUS_FUZZ_DIR, default /var/cache/plexus-fuzz): a repeat run
# builds nothing and starts from what earlier runs found.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build_only=
[ "${1:-}" = --build-only ] && { build_only=1; shift; }
secs=${1:-60}
shift || true
dir=${PLEXUS_FUZZ_DIR:-/var/cache/plexus-fuzz}
mkdir -p "$dir"

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
# The fuzz workspace resolves the versions the main workspace pinned.
cp Cargo.lock fuzz/Cargo.lock

mapfile -t all < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^plexus-fuzz$')
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

# cargo-fuzz's flags for libFuzzer with AddressSanitizer on Linux (0.13's `build -O
# --debug-assertions`; the line tables it asks for are fuzz/Cargo.toml's).
triple=$(rustc +nightly -vV | sed -n 's/^host: //p')
fuzzflags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
fuzzflags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
fuzzflags+=" -Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-sanitizer-coverage-stack-depth"
fuzzflags+=" -Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Ccodegen-units=1"
fuzzflags+=" --cfg fuzzing -Zsanitizer=address -Cdebug-assertions"
echo "== the fuzz targets' build (${#all[@]} targets; target dir $dir/target)"
# --target: the flags reach the targets and their dependencies, never build scripts or proc-macros.
(cd fuzz && RUSTFLAGS="$fuzzflags" \
  CARGO_PROFILE_RELEASE_OPT_LEVEL=${PLEXUS_FUZZ_OPT_LEVEL:-3} cargo +nightly build --release --bins \
  --target "$triple" --target-dir "$dir/target") >"$dir/build.log" 2>&1 || { tail -40 "$dir/build.log"; exit 1; }
[ -z "$build_only" ] || exit 0
bin=$dir/target/$triple/release

rm -rf "$dir/seeds"
python3 fuzz/seeds.py "$dir/seeds"

# One target: its regressions replayed, then the fuzzer; its report line (and, on a crash, the
# crash) in $dir/<target>.out, and $dir/<target>.failed when it failed.
fuzz_one() {
  local t=$1 corpus=$dir/corpus/$1 log=$dir/$1.log rc=0 execs rate cov crashes=0
  rm -f "$dir/$t.failed"
  {
    mkdir -p "$corpus" "$dir/artifacts/$t" "$dir/seeds/$t"
    # Crashes found earlier stay fixed.
    if [ -d "fuzz/regressions/$t" ]; then
      for f in "fuzz/regressions/$t"/*; do
        [ -f "$f" ] || continue
        "$bin/$t" "$f" >"$dir/$t.replay.log" 2>&1 || {
          echo "$t: regression $f crashes again"; tail -20 "$dir/$t.replay.log"; touch "$dir/$t.failed"; }
      done
    fi
    limit=(-max_total_time="$secs")
    [ -z "${PLEXUS_FUZZ_RUNS:-}" ] || limit=(-runs="$PLEXUS_FUZZ_RUNS")
    "$bin/$t" "$corpus" "$dir/seeds/$t" "${limit[@]}" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$dir/artifacts/$t/" >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    if [ "$rc" != 0 ]; then
      crashes=1
      touch "$dir/$t.failed"
    fi
    printf '%-14s %12s %10s %8s %8s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "$crashes"
    if [ "$rc" != 0 ]; then
      grep -m1 -A15 -E '^(thread|==[0-9]+==ERROR)' "$log" || tail -20 "$log"
    fi
  } >"$dir/$t.out"
}

# PLEXUS_FUZZ_JOBS targets at a time (default 1; each fuzzer uses one core).
lanes=${PLEXUS_FUZZ_JOBS:-1}
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$lanes" ]; do wait -n || true; done
  fuzz_one "$t" &
done
wait
failed=0
printf '%-14s %12s %10s %8s %8s\n' target executions exec/s cov crashes
for t in "${targets[@]}"; do
  cat "$dir/$t.out"
  [ ! -e "$dir/$t.failed" ] || failed=1
done
exit $failed
