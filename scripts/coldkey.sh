#!/usr/bin/env bash
# Instructions and L1 data-cache misses of one decision on a cold key:
# bench/'s Local benchmark, 100k keys chosen uniformly, one rule, one
# processor, under valgrind --tool=callgrind --cache-sim=yes (the host's
# L1 geometry). Like scripts/instructions.sh it runs the benchmark with
# -test.benchtime N1x and N2x and divides the difference by N2 − N1; it
# counts the decision's functions, per function, leaving out the garbage
# collector's work (and the scheduler's around it), which the warm-up's
# garbage starts at times that vary from run to run.
#
#   bash scripts/coldkey.sh                                  # hybridlimit-local
#   IMPL=sethvargo-memory bash scripts/coldkey.sh
#   BIN=/tmp/old.test bash scripts/coldkey.sh                # a bench test binary built elsewhere
#
# Go under valgrind needs GODEBUG=cpu.rdtscp=off,asyncpreemptoff=1 (set
# here). A check to read, not a test: it prints and exits 0.
set -euo pipefail
cd "$(dirname "$0")/../bench"

N1=${N1:-200000}
N2=${N2:-400000}
IMPL=${IMPL:-hybridlimit-local}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hybridlimit-cold.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ -z "${BIN:-}" ]; then
  go test -c -o "$tmp/bench.test" .
  BIN=$tmp/bench.test
fi

# run N writes the callgrind profile of N decisions to $tmp/N.out.
run() {
  GODEBUG=cpu.rdtscp=off,asyncpreemptoff=1 valgrind --tool=callgrind --cache-sim=yes \
    --callgrind-out-file="$tmp/$1.out" \
    "$BIN" -test.run '^$' -test.bench "^BenchmarkLocal\$/^impl=$IMPL\$/^keys=100k\$/^rules=1\$/^procs=1\$" \
    -test.benchtime "$1x" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; return 1; }
}

# perfn FILE prints per function (recursion merged): Ir D1mr D1mw.
perfn() {
  callgrind_annotate --inclusive=no --tree=none --auto=no --show=Ir,D1mr,D1mw \
    --sort=Ir --threshold=100 "$1" 2>/dev/null |
    sed -n '/file:function/,$p' | tail -n +2 | grep -v '=>' |
    sed 's/([^)]*)//g; s/ \[[^]]*\]$//' |
    awk 'NF >= 4 {
      for (i = 1; i <= 3; i++) { gsub(/,/, "", $i); if ($i == ".") $i = 0 }
      fn = $4; sub(/.*:/, "", fn); sub(/'"'"'[0-9]+$/, "", fn)
      ir[fn] += $1; d[fn] += $2 + $3
    }
    END { for (f in ir) print f, ir[f], d[f] }'
}

run "$N1"
run "$N2"
# The decision's functions: all but the garbage collector's (its marking,
# scanning, sweeping, write barriers and the allocations' assists).
awk -v n="$((N2 - N1))" '
  FNR == NR { ir1[$1] = $2; d1[$1] = $3; next }
  {
    f = $1
    if (f ~ /^runtime\.(gc|scan|tryDefer|wbBuf|mark|typePointers|extractHeapBits|spanSet|spanInline|findObject|greyobject|heapBits|bgMark|bgsweep|sweep|.*[Ss]weep|mallocgc|memclr|.*[Aa]ssist|atomicwb|.*tryAcquire|.*find$|.*summarize|casgstatus|goschedImpl|findRunnable|unlock2|lock2|.*Work)/) next
    if (f ~ /^(gcWriteBarrier|wbBuf)/) next
    i = ($2 - ir1[f]) / n; d = ($3 - d1[f]) / n
    ti += i; td += d
    if (i >= 0.5 || i <= -0.5 || d >= 0.02 || d <= -0.02) printf "%8.1f %6.2f  %s\n", i, d, f
  }
  END { printf "%8.1f %6.2f  total (instructions, L1 data misses per decision)\n", ti, td }
' <(perfn "$tmp/$N1.out") <(perfn "$tmp/$N2.out") | sort -k1,1 -rn
