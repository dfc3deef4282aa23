#!/usr/bin/env bash
# Checks that every nested module (prom/, sim/, bench/, ...) works as a
# dependency would see it: outside the workspace (GOWORK=off), in an empty
# module cache, against the root module at the version its go.mod pins,
# served from a local file-system module proxy built from git history
# (scripts/modproxy). For each nested module:
#   - no replace directive for the root module (it would be ignored for users);
#   - the pinned version names a commit of this repository;
#   - go build ./... and go vet ./... pass against it (a failure here usually
#     means the module uses root API newer than the pin: a stale pin);
#   - go.mod and go.sum are exactly what go mod tidy makes of them;
# and that the workspace (go.work) loads without fetching the pinned root
# versions, which only this repository has.
# It changes nothing in the work tree (-mod=readonly, go mod tidy -diff) and
# needs only committed files. Third-party modules come from the normal module
# cache used as a read-only proxy (offline when it is warm), then from the
# configured GOPROXY (proxy.golang.org). To fix a failure: bash scripts/pin-root.sh. See
# docs/modules.md.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)

echo "== nested modules build with GOWORK=off against the pinned root"

root=$(GOWORK=off go list -m)
cache=$(go env GOMODCACHE)
upstream=$(go env GOPROXY) # https://proxy.golang.org,direct unless configured

tmp=$(mktemp -d)
cleanup() {
  chmod -R u+w "$tmp" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# The tool that serves the root module from git history: a module of its own,
# outside the workspace, so it is vetted and tested here.
(
  cd scripts/modproxy
  export GOWORK=off GOFLAGS=-mod=readonly
  go build -o "$tmp/modproxy" .
  go vet ./...
  go test ./... >/dev/null || go test ./... # quiet unless it fails
)
pins=$("$tmp/modproxy" pins -repo "$top")
if [ -z "$pins" ]; then
  echo "no nested module requires $root"
  exit 0
fi

# run runs a command in the nested module $dir as a user of it would: no
# workspace, an empty module cache, the root module from the local proxy.
run() {
  (cd "$dir" && env GOWORK=off GOMODCACHE="$tmp/modcache" GOFLAGS="-mod=readonly -modcacherw -buildvcs=false -trimpath" \
    GOPROXY="file://$tmp/proxy,file://$cache/cache/download${upstream:+,$upstream}" \
    GOPRIVATE="$root" GONOPROXY=none GONOSUMDB="$root" "$@")
}

failed=()
fail() { # dir, first line, further lines...
  failed+=("$1")
  printf 'FAIL %s\n' "$2" >&2
  shift 2
  [ $# -eq 0 ] || printf '     %s\n' "$@" >&2
}

while read -r dir version replace; do
  if [ "$replace" != - ]; then
    fail "$dir" "$dir/go.mod: replace $root => $replace" \
      "A replace directive is ignored when $dir is used as a dependency, so users" \
      "would not get the root module it builds against. Pin a version instead:" \
      "bash scripts/pin-root.sh"
    continue
  fi
  if [ "$version" = - ]; then
    continue # mentions the root only in a replace: handled above
  fi
  if ! out=$("$tmp/modproxy" add -repo "$top" -dir "$tmp/proxy" -version "$version" 2>&1 >/dev/null); then
    fail "$dir" "$dir/go.mod requires $root $version, which this repository cannot serve:" \
      "$out" \
      "(A pin made on a branch that was then rebased or squashed names a commit that is gone.)" \
      "Pin a commit of this history: bash scripts/pin-root.sh"
    continue
  fi
  rev=$(git log -1 --format='commit %h of %cs' "${version##*-}" 2>/dev/null || echo "commit ?")
  echo "-- $dir: $root $version ($rev)"

  if ! out=$(run go build -o /dev/null ./... 2>&1) || ! out=$(run go vet ./... 2>&1); then
    grep -v '^go: downloading ' <<<"$out" >&2 || true
    if grep -qE 'missing go.sum entry|checksum mismatch|SECURITY ERROR|updates to go.mod needed|no required module provides|go: inconsistent vendoring|invalid version|unknown revision' <<<"$out"; then
      fail "$dir" "$dir: go.mod/go.sum do not fit $root $version (see above)." \
        "Refresh them: bash scripts/pin-root.sh"
    else
      fail "$dir" "$dir does not build against $root $version (see above)." \
        "If it uses root API added after commit ${version##*-} (or not committed yet), its pin is stale:" \
        "commit the root change, run bash scripts/pin-root.sh, commit $dir/go.mod, $dir/go.sum and go.work."
    fi
    continue
  fi
  if ! out=$(run go mod tidy -diff 2>&1); then
    grep -v '^go: downloading ' <<<"$out" >&2 || true
    fail "$dir" "$dir: go.mod/go.sum are not what go mod tidy makes of them against $root $version (diff above)." \
      "Refresh them: bash scripts/pin-root.sh"
    continue
  fi
done <<<"$pins"

# The workspace must load on a machine whose module cache has never seen the
# pinned root versions: go.work replaces each of them with ./ (workspace
# builds read the go.mod of every required version, even of a module that is
# in the workspace, and no proxy serves the root's).
if [ -f go.work ]; then
  echo "-- go.work: loads without fetching $root"
  # A copy with absolute paths: the go command may add to go.work.sum.
  "$tmp/modproxy" workcopy -repo "$top" -out "$tmp/work"
  if ! out=$(env GOWORK="$tmp/work/go.work" GOMODCACHE="$tmp/workcache" GOFLAGS="-mod=readonly -modcacherw" \
    GOPROXY="file://$cache/cache/download${upstream:+,$upstream}" GOPRIVATE="$root" GONOPROXY="$root" GONOSUMDB="$root" \
    GOVCS="*:off" go list -m all 2>&1 >/dev/null); then
    printf '%s\n' "$out" >&2
    fail go.work "go.work: the workspace needs a version of $root that no proxy serves (see above)." \
      "go.work must replace each version the nested modules pin with ./ : bash scripts/pin-root.sh"
  fi
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "modcheck: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "modcheck: every nested module builds, vets and is tidy against its pinned root; go.work loads"
