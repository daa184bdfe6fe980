#!/usr/bin/env bash
# Runs the libFuzzer harnesses of tests/fuzz (built by `cmake --preset fuzz && cmake --build --preset
# fuzz`): each from its seeds (corpus/NAME) with its dictionary (dict/NAME.dict, if any), then over
# every regression input (regress/NAME: each a crash that was found, and fixed). CTest's smoke is
# `--runs 2000`; a campaign is e.g. `nice -n 19 tests/fuzz/run.sh --runs 1000000 ps`.
#   --runs N       executions per harness (default 2000)
#   --time S       or stop after S seconds (libFuzzer's -max_total_time)
#   --build DIR    the build directory (default build-fuzz)
#   --keep         grow the working corpus in DIR/fuzz-corpus/NAME across runs (default: afresh)
# Harnesses: the names after the options (default: all built). A crash leaves its input in
# DIR/fuzz-artifacts/NAME/ and the exit status non-zero.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build="$here/../../build-fuzz" runs=2000 time=0 keep=false
names=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --time) time=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --keep) keep=true; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    *) names+=("$1"); shift ;;
  esac
done
bin="$build/tests/fuzz"
if [ ${#names[@]} -eq 0 ]; then
  for f in "$bin"/fuzz_*; do
    case "$f" in *_broken) continue ;; esac   # a test's deliberately broken build (CMakeLists.txt)
    [ -x "$f" ] && names+=("${f##*/fuzz_}")
  done
fi
[ ${#names[@]} -gt 0 ] || { echo "run.sh: no harness built in $bin (cmake --build --preset fuzz)" >&2; exit 2; }
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

status=0
for n in "${names[@]}"; do
  exe="$bin/fuzz_$n"
  [ -x "$exe" ] || { echo "run.sh: $exe is not built" >&2; exit 2; }
  work="$build/fuzz-corpus/$n" art="$build/fuzz-artifacts/$n/"
  $keep || rm -rf "$work"
  mkdir -p "$work" "$art"
  # a hostile input that makes psfleet allocate over 512 MiB is a finding too (a 16-byte file did)
  opts=(-runs="$runs" -seed=1 -artifact_prefix="$art" -print_final_stats=1 -rss_limit_mb=4096
        -malloc_limit_mb=512 -timeout=25)
  [ "$time" -gt 0 ] && opts+=(-max_total_time="$time")
  # A daemon on threads holds memory across inputs, and LeakSanitizer's check after an input that
  # allocated more than it freed stops every thread (gRPC's too) mid-call: for these the leaks are
  # looked for once, at exit.
  case "$n" in ps|chief|worker) opts+=(-detect_leaks=0) ;; esac
  [ -f "$here/dict/$n.dict" ] && opts+=(-dict="$here/dict/$n.dict")
  seeds=() max=4096
  if [ -d "$here/corpus/$n" ]; then
    seeds=("$here/corpus/$n")
    # room to grow the largest seed (a whole push of the ps harness is several KiB)
    big=$(find "$here/corpus/$n" -type f -printf '%s\n' | sort -n | tail -1)
    [ -n "$big" ] && [ $((big * 2)) -gt $max ] && max=$((big * 2))
  fi
  opts+=(-max_len="$max")
  echo "== fuzz_$n: ${opts[*]}"
  if ! "$exe" "${opts[@]}" "$work" "${seeds[@]}" 2>"$build/fuzz-$n.log"; then
    tail -n 60 "$build/fuzz-$n.log" >&2
    echo "run.sh: fuzz_$n failed (input in $art)" >&2
    status=1
    continue
  fi
  grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units|Done )' "$build/fuzz-$n.log" || true
  if [ -d "$here/regress/$n" ] && [ -n "$(ls -A "$here/regress/$n")" ]; then
    if ! "$exe" -malloc_limit_mb=512 "$here/regress/$n"/* >"$build/fuzz-$n-regress.log" 2>&1; then
      tail -n 60 "$build/fuzz-$n-regress.log" >&2
      echo "run.sh: fuzz_$n fails a regression input" >&2
      status=1
    else
      echo "   regression inputs: $(ls "$here/regress/$n" | wc -l) passed"
    fi
  fi
done
exit $status
