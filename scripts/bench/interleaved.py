#!/usr/bin/env python3
"""Two CNI ADDs timed in alternation, run after run, so that a drift of the machine's speed falls
on both alike (the hyperfine runs of bench.sh time one command's runs, then the other's).

  interleaved.py OUT.json RUNS PREPARE NAME=ENV_FILE:CONFIG:BINARY NAME=ENV_FILE:CONFIG:BINARY

Each run of a command: PREPARE (a shell command, untimed; its failure ends the benchmark), then the binary started with its
environment (KEY=VALUE lines in ENV_FILE, over this process's) and CONFIG on its stdin, timed from
posix_spawn to its exit. The order of the two alternates every run; 10 warm-up runs are dropped.
Writes the medians and the median of the paired differences (second minus first). Figures only.
"""
import json
import os
import statistics
import subprocess
import sys
import time

out, runs, prepare = sys.argv[1], int(sys.argv[2]), sys.argv[3]
commands = []
for spec in sys.argv[4:6]:
    name, rest = spec.split("=", 1)
    env_file, config, binary = rest.split(":", 2)
    env = dict(os.environ)
    with open(env_file) as f:
        env.update(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    commands.append((name, env, config, binary))


def once(env, config, binary):
    if subprocess.run(["sh", "-c", prepare]).returncode != 0:
        sys.exit(f"interleaved.py: the preparation failed: {prepare}")
    stdin = os.open(config, os.O_RDONLY)
    null = os.open("/dev/null", os.O_WRONLY)
    try:
        start = time.perf_counter_ns()
        pid = os.posix_spawn(binary, [binary], env, file_actions=[(os.POSIX_SPAWN_DUP2, stdin, 0),
                                                                   (os.POSIX_SPAWN_DUP2, null, 1)])
        _, status = os.waitpid(pid, 0)
        took = (time.perf_counter_ns() - start) / 1e6
    finally:
        os.close(stdin)
        os.close(null)
    if status != 0:
        sys.exit(f"interleaved.py: {binary} failed (wait status {status})")
    return took


times = {name: [] for name, *_ in commands}
for i in range(runs + 10):
    order = commands if i % 2 == 0 else commands[::-1]
    for name, env, config, binary in order:
        took = once(env, config, binary)
        if i >= 10:
            times[name].append(took)
first, second = (c[0] for c in commands)
result = {
    "runs": runs,
    "median_ms": {name: statistics.median(t) for name, t in times.items()},
    "paired_difference_ms": statistics.median(b - a for a, b in zip(times[first], times[second])),
}
with open(out, "w") as f:
    json.dump(result, f)
print(json.dumps(result))
