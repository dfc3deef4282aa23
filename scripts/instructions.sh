#!/usr/bin/env bash
# Instructions per decision, counted by callgrind: repeatable on a loaded
# machine, where timings are not. Each benchmark runs twice under
# valgrind --tool=callgrind with -test.benchtime N1x and N2x; the
# instructions per operation are (I2 − I1) / (N2 − N1), so that the
# process's start, the benchmark's setup and the one-iteration probe run
# cancel out. Each count is the least of R runs (default 3): the limiter's
# background goroutine (the coarse clock's ticker) runs by wall time,
# which valgrind stretches, and adds a few instructions per operation.
# Decisions also cost a little more once a rule's previous window holds
# counts (the sliding estimate multiplies), which depends on when the run
# crosses a window boundary: with a one-second rule, counts of one
# benchmark vary by about 2 % between runs.
#
#   bash scripts/instructions.sh                  # the default benchmarks
#   bash scripts/instructions.sh 'Floor$' ...     # others (-test.bench patterns)
#   BIN=/tmp/old.test bash scripts/instructions.sh  # a test binary built elsewhere (go test -c)
#   N1=100000 N2=300000 R=5 bash scripts/instructions.sh
#   CACHE=1 bash scripts/instructions.sh ...      # also L1 data-cache misses per operation
#   CACHE=1 PKG=bench bash scripts/instructions.sh \
#     '^BenchmarkLocal$/^impl=hybridlimit-local$/^keys=100k$/^rules=1$/^procs=1$'
#                                                 # a cold key: 100k keys, bench/'s Local family
#
# With CACHE=1, callgrind simulates the caches (--cache-sim=yes, the
# host's L1 geometry) and the script prints, besides instructions, the L1
# data misses (reads + writes) of one operation, computed the same way;
# each column is the least of the R runs. PKG names the package to build
# (default: the root; bench is the nested module of the peers).
#
# It installs valgrind from Debian's packages when missing. Go under
# valgrind needs GODEBUG=cpu.rdtscp=off,asyncpreemptoff=1 (set here).
# A check to read, not a test: it prints and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

N1=${N1:-200000}
N2=${N2:-400000}
R=${R:-3}
CACHE=${CACHE:-}
PKG=${PKG:-.}
# A b.N benchmark's function runs once for -test.benchtime 1x but twice
# (b.N = 1, then N) for Nx with N > 1: with N1 = 1 the difference would
# hold one more setup.
if [ "$N1" -lt 2 ] || [ "$N2" -le "$N1" ]; then
  echo "instructions.sh: want 2 <= N1 < N2, have N1=$N1 N2=$N2" >&2
  exit 2
fi

if ! command -v valgrind >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq valgrind >/dev/null
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hybridlimit-instr.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ -z "${BIN:-}" ]; then
  (cd "$PKG" && go test -c -o "$tmp/hybridlimit.test" .)
  BIN=$tmp/hybridlimit.test
fi

benches=("$@")
if [ ${#benches[@]} -eq 0 ]; then
  benches=(
    'Floor$'
    'Decision/mode=local/rules=1$'
    'Decision/mode=local/rules=4$'
    'Decision/mode=async/rules=1$'
    'Decision/mode=async/rules=4$'
    'Algorithm/keys=1$/algo=bucketed$'
  )
fi

# count1 BENCH N prints the instructions callgrind collected for the whole
# run of the test binary and, with CACHE, the L1 data misses.
count1() {
  local sim=()
  [ -n "$CACHE" ] && sim=(--cache-sim=yes)
  GODEBUG=cpu.rdtscp=off,asyncpreemptoff=1 valgrind --tool=callgrind "${sim[@]}" \
    --callgrind-out-file="$tmp/out.$$.$RANDOM" \
    "$BIN" -test.run '^$' -test.bench "$1" -test.cpu 1 -test.benchtime "$2x" \
    2>"$tmp/err" >/dev/null || { cat "$tmp/err" >&2; return 1; }
  # Events: Ir [Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw]
  sed -n 's/.*Collected : \([0-9 ]*\).*/\1/p' "$tmp/err" | awk '{ print $1, $5 + $6 }'
}

# count BENCH N prints the least count of R runs, per column.
count() {
  for _ in $(seq "$R"); do count1 "$1" "$2"; done |
    awk 'NR == 1 || $1 < i { i = $1 } NR == 1 || $2 < d { d = $2 } END { print i, d }'
}

if [ -n "$CACHE" ]; then
  printf '%-40s %14s %14s\n' benchmark instructions/op L1-misses/op
else
  printf '%-40s %14s\n' benchmark instructions/op
fi
for b in "${benches[@]}"; do
  read -r i1 d1 <<<"$(count "$b" "$N1")"
  read -r i2 d2 <<<"$(count "$b" "$N2")"
  awk -v b="$b" -v i1="$i1" -v i2="$i2" -v d1="$d1" -v d2="$d2" -v n1="$N1" -v n2="$N2" -v cache="$CACHE" \
    'BEGIN {
      if (cache != "") printf "%-40s %14.1f %14.2f\n", b, (i2 - i1) / (n2 - n1), (d2 - d1) / (n2 - n1)
      else printf "%-40s %14.1f\n", b, (i2 - i1) / (n2 - n1)
    }'
done
