#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is missing, builds with warnings as errors,
# runs unit, integration, system and benchmark smoke tests, then the unit tests again under ASan+UBSan,
# then the fuzz harnesses' smoke and regression inputs (tests/fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."

packaging/install-deps.sh --all    # the demo's packages and the test tools
cmake --preset ci
cmake --build --preset ci
ctest --preset ci
cmake --preset asan
cmake --build --preset asan
ctest --preset asan
# every fuzz harness for a short smoke and over its regression inputs, under ASan+UBSan (clang)
cmake --preset fuzz
cmake --build --preset fuzz
ctest --preset fuzz
