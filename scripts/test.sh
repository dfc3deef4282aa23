#!/usr/bin/env bash
# The whole test suite: gofmt, go vet, staticcheck and go test -race over
# every module of the workspace, against Redis servers that this script
# installs (from Debian's packages, when missing), starts on free loopback
# ports without persistence (a standalone server, a Redis Cluster and a
# Sentinel group: scripts/redis-topology.sh), and stops at the end, also
# when a step fails or the run is interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK=honnef.co/go/tools/cmd/staticcheck@v0.6.1 # release 2025.1.1

if ! command -v redis-server >/dev/null 2>&1; then
  echo "== installing redis-server from Debian's packages"
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi

# Run under a child subreaper (Linux), so that a server a test restarted
# (daemonized, hence orphaned) and then killed is reaped even when PID 1 does
# not reap orphans, as in many containers.
if [ -z "${HYBRIDLIMIT_UNDER_SUBREAPER:-}" ] && [ "$(uname -s)" = Linux ]; then
  reaper_dir=$(mktemp -d "${TMPDIR:-/tmp}/hybridlimit-subreaper.XXXXXX")
  go build -o "$reaper_dir/subreaper" ./internal/redistest/subreaper
  HYBRIDLIMIT_UNDER_SUBREAPER=$reaper_dir exec "$reaper_dir/subreaper" bash scripts/test.sh "$@"
fi
case "${HYBRIDLIMIT_UNDER_SUBREAPER:-}" in
*/hybridlimit-subreaper.*) rm -rf "$HYBRIDLIMIT_UNDER_SUBREAPER" ;; # a running binary can go
esac
export HYBRIDLIMIT_UNDER_SUBREAPER=done

# phase names a step of the run and the seconds the run took before it.
phase() { echo "== $* [${SECONDS}s]"; }

# shellcheck source=scripts/redis-topology.sh
. scripts/redis-topology.sh
trap 'rt_stop_all' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
echo "== redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'): standalone, cluster, sentinel"
rt_start_all
echo "   $rt_timing; servers in $HYBRIDLIMIT_REDIS_DIR"
echo "   HYBRIDLIMIT_REDIS_ADDR=$HYBRIDLIMIT_REDIS_ADDR"
echo "   HYBRIDLIMIT_CLUSTER_ADDRS=$HYBRIDLIMIT_CLUSTER_ADDRS"
echo "   HYBRIDLIMIT_SENTINEL_ADDRS=$HYBRIDLIMIT_SENTINEL_ADDRS (master $HYBRIDLIMIT_SENTINEL_MASTER)"

# Every module of the workspace (go.work), as package patterns.
mods=$(go list -m -f '{{.Dir}}')
pkgs=()
for m in $mods; do pkgs+=("$m/..."); done

phase "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change:"; echo "$unformatted"; exit 1; fi

phase "go vet"
go vet "${pkgs[@]}"

phase "32-bit build (GOARCH=386)"
GOARCH=386 go build "${pkgs[@]}"

phase "modcheck"
bash scripts/modcheck.sh # == nested modules build with GOWORK=off against the pinned root

phase "staticcheck ($STATICCHECK)"
go run "$STATICCHECK" "${pkgs[@]}"

phase "go test -race"
go test -race -count=1 -timeout 8m "${pkgs[@]}"

# The simulation's accuracy tests replay millions of decisions in virtual
# time on one goroutine: deterministic, and minutes long under the race
# detector, so they build only without it (//go:build !race) and run here.
phase "go test (simulation accuracy, without -race)"
go test -count=1 -timeout 5m -run 'Accuracy|SmallLimit' ./sim/

# The tests that read raceOn run fewer cases or rounds under the race
# detector (ten to fifty times slower there); here they run whole. The
# mid-burst fault tests (RaceOn) check their per-window bounds only here:
# under -race, beside the other packages, their nodes starve. A test that
# starts reading raceOn or RaceOn is added to this list.
phase "go test (the cases -race leaves out, without -race)"
go test -count=1 -timeout 5m -run '^(TestAsyncConservesIncrements|TestAsyncOvershootWithinTheStatedBound|TestAsyncOvershootWithinTheStatedBoundRandom|TestFaultStandaloneStopMidBurst|TestFaultClusterStopMidBurst|TestFaultClusterFailoverMidBurst|TestFaultSentinelStopMidBurst)$' .
go test -count=1 -timeout 5m -run '^TestEvictionRacingADecisionLosesNothing$' ./local/
phase "all passed"
