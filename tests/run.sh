#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is missing, builds with warnings as errors,
# runs unit, integration, system and benchmark smoke tests, then the unit tests again under ASan+UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."

packaging/install-deps.sh --all    # the demo's packages and the test tools
cmake --preset ci
cmake --build --preset ci
ctest --preset ci
cmake --preset asan
cmake --build --preset asan
ctest --preset asan
