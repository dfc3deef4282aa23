#!/usr/bin/env bash
# Times bench/'s Local benchmarks in separate processes run in rotation,
# and prints each implementation's median ns/op with its range and its
# ratio to hybridlimit-local's median. On a shared machine one process's
# figures move with the load and with what earlier benchmarks left in its
# heap; rotating the implementations through fresh processes, round after
# round, spreads both over all of them.
#
#   bash scripts/rotation.sh                            # 100k keys, 1 rule, procs 1 and 2, 10 rounds
#   ROUNDS=20 CASE='keys=1/rules=1' bash scripts/rotation.sh
#   IMPLS='hybridlimit-local x-time-rate' bash scripts/rotation.sh
#
# Benchmarks of the Local family need no Redis.
set -euo pipefail
cd "$(dirname "$0")/../bench"

ROUNDS=${ROUNDS:-10}
CASE=${CASE:-keys=100k/rules=1}
PROCS=${PROCS:-1 2}
IMPLS=${IMPLS:-hybridlimit-local throttled-memory sethvargo-memory}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hybridlimit-rotation.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/bench.test" .

for _ in $(seq "$ROUNDS"); do
  for impl in $IMPLS; do
    for p in $PROCS; do
      "$tmp/bench.test" -test.run '^$' -test.bench "^BenchmarkLocal\$/^impl=$impl\$/^${CASE//\//\$/^}\$/^procs=$p\$" \
        -test.benchtime 1s 2>/dev/null | grep '^Benchmark' >>"$tmp/out" || true
    done
  done
done

# name N ns/op ...: the median per implementation and procs.
awk -v impls="$IMPLS" -v procslist="$PROCS" '
  {
    split($1, parts, "/")
    impl = parts[2]; sub(/^impl=/, "", impl)
    procs = parts[5]; sub(/^procs=/, "", procs); sub(/-[0-9]+$/, "", procs)
    k = impl SUBSEP procs
    n[k]++; v[k, n[k]] = $3
  }
  function median(k,    i, j, t, m, a) {
    m = n[k]
    for (i = 1; i <= m; i++) a[i] = v[k, i]
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    lo[k] = a[1]; hi[k] = a[m]
    return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  END {
    split(impls, list, " ")
    printf "| procs | impl | runs | median ns/op | range | hybridlimit-local ÷ impl |\n| --- | --- | ---: | ---: | --- | ---: |\n"
    np = split(procslist, plist, " ")
    for (q = 1; q <= np; q++) {
      p = plist[q]
      ref = median("hybridlimit-local" SUBSEP p)
      for (i = 1; i in list; i++) {
        k = list[i] SUBSEP p
        if (!(k in n)) continue
        m = median(k)
        printf "| %s | %s | %d | %.0f | %.0f–%.0f | %.2f× |\n", p, list[i], n[k], m, lo[k], hi[k], ref / m
      }
    }
  }' "$tmp/out"
