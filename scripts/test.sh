#!/usr/bin/env bash
# The whole test suite: gofmt, go vet, staticcheck and go test -race over
# every module of the workspace, against a redis-server that this script
# installs (from Debian's packages, when missing), starts on a free loopback
# port without persistence, and stops at the end.
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

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=""
for _ in $(seq 1 50); do
  p=$((20000 + RANDOM % 20000))
  if ! port_in_use "$p"; then port=$p; break; fi
done
[ -n "$port" ] || { echo "no free port found" >&2; exit 1; }

redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
  --daemonize no --loglevel warning --logfile "" >/dev/null 2>&1 &
redis_pid=$!
trap 'kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  if port_in_use "$port"; then break; fi
  sleep 0.1
done
port_in_use "$port" || { echo "redis-server did not start on port $port" >&2; exit 1; }
export HYBRIDLIMIT_REDIS_ADDR="127.0.0.1:$port"
echo "== redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') on $HYBRIDLIMIT_REDIS_ADDR"

# Every module of the workspace (go.work), as package patterns.
mods=$(go list -m -f '{{.Dir}}')
pkgs=()
for m in $mods; do pkgs+=("$m/..."); done

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change:"; echo "$unformatted"; exit 1; fi

echo "== go vet"
go vet "${pkgs[@]}"

echo "== 32-bit build (GOARCH=386)"
GOARCH=386 go build "${pkgs[@]}"

bash scripts/modcheck.sh # == nested modules build with GOWORK=off against the pinned root

echo "== staticcheck ($STATICCHECK)"
go run "$STATICCHECK" "${pkgs[@]}"

echo "== go test -race"
go test -race -count=1 -timeout 8m "${pkgs[@]}"
