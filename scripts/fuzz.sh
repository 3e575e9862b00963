#!/usr/bin/env bash
# The fuzzing campaign: finds every FuzzXxx target of the module (go test -list,
# so new targets join without editing this file), fuzzes each one alone for a
# set time, keeps going past a failing target, and ends with a table of
# package, target, time, execs, new interesting inputs and result. Exits
# non-zero when any target failed; a crasher is written by go under the
# package's testdata/fuzz/FuzzXxx/, where it then runs as a seed in the suite.
# Go's own spurious failure at the deadline (go.dev/issue/75804) is told apart
# and is not counted as one.
#
#   ./scripts/fuzz.sh                    every target, 60s each
#   ./scripts/fuzz.sh 45s                every target, 45s each
#   ./scripts/fuzz.sh 45s 'SSE|Identity' targets whose name matches the regexp
#   FUZZTIME=2s ./scripts/fuzz.sh Identity
#
# FUZZTIME (or a first argument that reads as a go duration, or Nx for N
# execs) is the time per target, 60s by default; FUZZ_PARALLEL is the number of
# fuzzing processes per target, 1 by default so the campaign leaves the other
# core alone. FUZZ_MINIMIZETIME caps each minimization, 5s by default: go's own
# 60s is longer than a whole target's turn, and while the only worker shrinks a
# new kilobyte-long input (a pass over every pair of offsets) it fuzzes nothing.
# (A crasher is written all the same, shrunk as far as 5s got.) Each turn starts
# by replaying what earlier runs found (go's cache, $(go env GOCACHE)/fuzz), and
# that counts against FUZZTIME. The filter is a bash regular expression on
# target names. The run takes targets x FUZZTIME plus compile time. It is a
# separate command: scripts/test.sh runs only the checked-in seeds, as tests.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '== %s\n' "$*" >&2; }

fuzztime=${FUZZTIME:-60s}
if [ $# -gt 0 ] && [[ $1 =~ ^([0-9]+(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+$|^[0-9]+x$ ]]; then
  fuzztime=$1
  shift
fi
filter=${1:-.}
parallel=${FUZZ_PARALLEL:-1}
minimizetime=${FUZZ_MINIMIZETIME:-5s}

work=$(mktemp -d "${TMPDIR:-/tmp}/codex-relay-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

# --- The targets: go test -list prints each package's matching names, then
# its "ok  <import path>" line. A package that does not build stops the
# campaign, since none of its targets could run.
log "listing fuzz targets"
if ! go test -vet=off -list '^Fuzz' ./... >"$work/list" 2>&1; then
  cat "$work/list" >&2
  echo "go test -list failed: fix the build first" >&2
  exit 1
fi
module=$(go list -m)
targets=()
pending=()
while IFS= read -r line; do
  if [[ $line =~ ^Fuzz[A-Za-z0-9_]*$ ]]; then
    pending+=("$line")
  elif [[ $line =~ ^ok[[:space:]]+([^[:space:]]+) ]]; then
    pkg=${BASH_REMATCH[1]}
    dir=.${pkg#"$module"}
    for name in ${pending[@]+"${pending[@]}"}; do
      if [[ $name =~ $filter ]]; then
        targets+=("$dir $name")
      fi
    done
    pending=()
  fi
done <"$work/list"
if [ ${#targets[@]} -eq 0 ]; then
  echo "no fuzz target matches '$filter'" >&2
  exit 1
fi
log "${#targets[@]} targets, $fuzztime each, -parallel $parallel, -fuzzminimizetime $minimizetime"

# deadline_race reports whether a run's only failure is Go's own at the end of
# -fuzztime (go.dev/issue/75804, still in go1.26's internal/fuzz): the
# coordinator sees the deadline before its workers' context is cancelled and
# reports the bare "context deadline exceeded" as the target's failure, with
# no input failing.
# A target's own failure carries a file:line or a crasher and never matches.
deadline_race() {
  local name=$1 out=$2
  [ "$(grep -c '^--- FAIL: ' "$out")" -eq 1 ] &&
    ! grep -q 'Failing input written to' "$out" &&
    grep -A1 "^--- FAIL: ${name} (" "$out" | tail -n 1 | grep -qx '    context deadline exceeded'
}

# --- One target at a time; go's output goes through unchanged so a log of the
# run holds everything, and a copy per target is read for the summary.
rows=()
failed=0
races=0
total_execs=0
start=$SECONDS
i=0
for target in "${targets[@]}"; do
  dir=${target% *}
  name=${target#* }
  i=$((i + 1))
  out="$work/$i.log"
  log "[$i/${#targets[@]}] $dir $name"
  t0=$SECONDS
  status=0
  go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimizetime" -parallel "$parallel" "$dir" 2>&1 |
    tee "$out" || status=$?
  wall=$((SECONDS - t0))

  # The last progress line carries the totals:
  # "fuzz: elapsed: 45s, execs: 123456 (2743/sec), new interesting: 3 (total: 52)".
  # A run that spent its whole time on the baseline (replaying the cached
  # corpus) has no execs line: its execs are 0.
  last=$(grep -E '^fuzz: elapsed: ' "$out" | tail -n 1 || true)
  execs=0
  elapsed=-
  interesting=-
  [[ $last =~ elapsed:\ ([^,]+), ]] && elapsed=${BASH_REMATCH[1]}
  [[ $last =~ execs:\ ([0-9]+) ]] && execs=${BASH_REMATCH[1]} && total_execs=$((total_execs + execs))
  [[ $last =~ new\ interesting:\ ([0-9]+\ \(total:\ [0-9]+\)) ]] && interesting=${BASH_REMATCH[1]}

  if [ "$status" -eq 0 ]; then
    result=ok
  elif deadline_race "$name" "$out"; then
    result="ok (go.dev/issue/75804 at the deadline)"
    races=$((races + 1))
  else
    failed=$((failed + 1))
    crasher=$(sed -n 's/^[[:space:]]*Failing input written to //p' "$out" | tail -n 1)
    if [ -n "$crasher" ]; then
      result="FAILED ${dir#./}/$crasher"
    elif grep -q 'failure while testing seed corpus entry' "$out"; then
      result="FAILED on a seed (see the log)"
    else
      result="FAILED (exit $status, see the log)"
    fi
  fi
  rows+=("$dir"$'\t'"$name"$'\t'"$elapsed (${wall}s wall)"$'\t'"$execs"$'\t'"$interesting"$'\t'"$result")
done

# --- The summary.
echo
echo "fuzz summary: ${#targets[@]} targets, $fuzztime each, -parallel $parallel, -fuzzminimizetime $minimizetime, $(go version | cut -d' ' -f3), $(nproc 2>/dev/null || echo '?') cores"
{
  printf 'PACKAGE\tTARGET\tTIME\tEXECS\tNEW INTERESTING\tRESULT\n'
  printf '%s\n' "${rows[@]}"
} | column -t -s $'\t'
echo "total: $total_execs execs in $((SECONDS - start))s, $failed failed, $races ended by Go's deadline race (not a finding)"
[ "$failed" -eq 0 ]
