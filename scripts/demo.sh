#!/usr/bin/env bash
# The main job: a pod-like namespace gets a RoCE-style secondary interface through `plexus`.
# Placeholder until the meta-plugin (issue #6) and the runtime/demo work (issue #7) land.
echo "scripts/demo.sh: the plexus main job arrives with issue #6 (meta-plugin) and issue #7 (demo command)."
echo "Today: 'bash scripts/test.sh' builds the CNI library and runs its tests against the reference plugins."
