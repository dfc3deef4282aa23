#!/usr/bin/env bash
# Instructions redis-server runs for a benchmark of bench/, counted by
# callgrind: what a change to the Redis store's calls or scripts costs the
# server, repeatable on a loaded machine where its CPU time is not. It
# starts a redis-server under valgrind --tool=callgrind on a free loopback
# port, and for each of N1 and N2 iterations (-test.benchtime N1x, N2x)
# empties it (FLUSHALL), zeroes the counts, runs the benchmark and dumps
# them; the instructions per operation are (I2 − I1) / (N2 − N1), so that
# the benchmark's setup and its one-iteration probe cancel out. Each count
# is the least of R runs (default 2). PER divides it again (the keys of one
# sync cycle, for example). A run of the sync cycle that crosses the
# benchmark's one-minute window also creates counters and counts a few per
# cent more: compare small changes with R=4.
#
#   bash scripts/server-instructions.sh                      # one sync cycle of 10k keys, per key
#   BIN=/tmp/old.test bash scripts/server-instructions.sh    # a bench test binary built elsewhere
#   PER=1 N1=5120 N2=15360 bash scripts/server-instructions.sh \
#     '^BenchmarkTakeScript$/^impl=take-script$/^keys=1k$/^rules=1$/^batch=512$/^inflight=1$'
#
# N1 must be at least 2, and a pattern must match one benchmark: go test
# runs a b.N benchmark's function once for -test.benchtime 1x (the probe
# is the run) but twice for Nx with N > 1 (the probe with b.N = 1, then
# b.N = N), so with N1 = 1 the difference would hold one more setup (for
# BenchmarkTakeScript, its warm-up Take of 1000 decisions); and the
# counts of several matching benchmarks add up.
#
# It installs valgrind and redis-server from Debian's packages when
# missing. A check to read, not a test: it prints and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

BENCH=${1:-'^BenchmarkSync$/^impl=hybridlimit-async$/^keys=10k$'}
N1=${N1:-2}
N2=${N2:-6}
R=${R:-2}
PER=${PER:-10000}
if [ "$N1" -lt 2 ] || [ "$N2" -le "$N1" ]; then
  echo "server-instructions.sh: want 2 <= N1 < N2, have N1=$N1 N2=$N2 (see the header)" >&2
  exit 2
fi

missing=()
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hybridlimit-server-instr.XXXXXX")
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
if [ -z "${BIN:-}" ]; then
  (cd bench && go test -c -o "$tmp/bench.test" .)
  BIN=$tmp/bench.test
fi

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.%p" \
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$tmp/server.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.3
done
redis-cli -p "$port" ping >/dev/null

# count N: the server's instructions over one run of N iterations.
count() {
  redis-cli -p "$port" flushall >/dev/null
  callgrind_control -z "$pid" >/dev/null 2>&1
  HYBRIDLIMIT_REDIS_ADDR=127.0.0.1:$port "$BIN" -test.run '^$' -test.bench "$BENCH" -test.benchtime "${1}x" >"$tmp/bench.out" 2>&1 ||
    { cat "$tmp/bench.out" >&2; exit 1; }
  grep -q '^Benchmark' "$tmp/bench.out" || { echo "no benchmark matches $BENCH" >&2; exit 1; }
  rm -f "$tmp"/cg.*.[0-9]*
  callgrind_control -d "$pid" >/dev/null 2>&1
  callgrind_annotate "$(ls -t "$tmp"/cg.*.[0-9]* | head -1)" 2>/dev/null |
    awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }'
}

least() { sort -n | head -1; }
i1=$(for _ in $(seq "$R"); do count "$N1"; done | least)
i2=$(for _ in $(seq "$R"); do count "$N2"; done | least)
awk -v a="$i1" -v b="$i2" -v n1="$N1" -v n2="$N2" -v per="$PER" -v bench="$BENCH" 'BEGIN {
  op = (b - a) / (n2 - n1)
  printf "%s\t%.0f server instructions per op\t%.1f per %d\n", bench, op, op / per, per
}'
