#!/usr/bin/env bash
# The demo on a fresh machine: installs what is missing, builds, and trains the Fashion-MNIST MLP with
# one parameter server and two workers on this machine (psfleet local), printing the result as JSON.
set -euo pipefail
cd "$(dirname "$0")"
# only what building and running the demo takes (the README lists it); tests/run.sh adds the test tools
packaging/install-deps.sh --demo
cmake --preset default -DBUILD_TESTING=OFF >/dev/null
cmake --build --preset default
exec ./build/services/cli/psfleet local examples/fmnist-mlp.json "$@"
