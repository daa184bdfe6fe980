#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what is missing, builds with warnings as errors,
# runs unit, integration, system and benchmark smoke tests, then — in one clang build under ASan+UBSan
# (the fuzz preset) — the unit tests again and the fuzz harnesses' smoke and regression inputs.
set -euo pipefail
cd "$(dirname "$0")/.."

packaging/install-deps.sh --all    # the demo's packages and the test tools
cmake --preset ci
cmake --build --preset ci
ctest --preset ci -j2   # only integration.chaos runs beside the system tests (tests/CMakeLists.txt, psfleet_ci_locks)
# the unit tests, and every fuzz harness for a short smoke and over its regression inputs, under
# ASan+UBSan (clang; `cmake --preset asan` is the same for the unit tests with gcc, by hand)
cmake --preset fuzz
cmake --build --preset fuzz
ctest --preset fuzz -j2
