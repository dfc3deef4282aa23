#!/usr/bin/env bash
# Pins every nested module (prom/, sim/, bench/, ... : each go.mod below the
# top that requires the root module) to the root module at one commit:
#
#   bash scripts/pin-root.sh [REV]
#
# REV defaults to the last commit that changed the root module's files (the
# files outside the nested modules), so that committing the new pins and
# running this again changes nothing. The requirement becomes the version the
# go command gives that commit (v0.0.0-yyyymmddhhmmss-abcdef123456 while the
# repository has no tags), any replace directive for the root module is
# dropped, and `go mod tidy` refreshes go.mod and go.sum against the root
# module served at that version from a local file-system module proxy built
# from git history (scripts/modproxy). See docs/modules.md.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)

case "${1:-}" in
  -h | --help)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac
[ $# -le 1 ] || { echo "usage: bash scripts/pin-root.sh [REV]" >&2; exit 2; }

root=$(GOWORK=off go list -m)

# The directories of the nested modules (every go.mod below the top), as git
# pathspecs that leave them out: what remains is the root module. go.work and
# go.work.sum are left out too: they matter only to local work, and this
# script edits go.work.
not_nested=(":(exclude)go.work" ":(exclude)go.work.sum")
while IFS= read -r -d '' gomod; do
  d=$(dirname "$gomod")
  [ "$d" = . ] || not_nested+=(":(exclude)$d")
done < <(git ls-files -z --cached --others --exclude-standard -- ':(glob)**/go.mod')

if [ $# -eq 1 ]; then
  rev=$1
else
  rev=$(git log -1 --format=%H HEAD -- . "${not_nested[@]}")
  if ! git diff --quiet "$rev" HEAD -- . "${not_nested[@]}"; then
    rev=$(git rev-parse HEAD) # merges: fall back to HEAD itself
  fi
fi
if [ -n "$(git status --porcelain -- . "${not_nested[@]}")" ]; then
  echo "note: the root module has uncommitted changes; the pin is to committed history ($rev)." >&2
  echo "      Commit them first and run this again if the nested modules need them." >&2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

(cd scripts/modproxy && GOWORK=off GOFLAGS=-mod=readonly go build -o "$tmp/modproxy" .)
echo "== serving $root at $(git rev-parse --short=12 "$rev") from a local module proxy"
version=$("$tmp/modproxy" add -repo "$top" -dir "$tmp/proxy" -rev "$rev" -v)

pins=$("$tmp/modproxy" pins -repo "$top")
if [ -z "$pins" ]; then
  echo "no nested module requires $root: nothing to pin"
  exit 0
fi

# The root module comes from the local proxy, everything else from the
# configured proxy; the checksum database cannot know the root module.
upstream=$(go env GOPROXY)
export GOWORK=off GOFLAGS=-mod=mod
export GOPROXY="file://$tmp/proxy${upstream:+,$upstream}"
export GOPRIVATE=$root GONOPROXY=none GONOSUMDB=$root

while read -r dir old replace; do
  echo "== $dir: $root ${old/#-/(none)} -> $version"
  args=(-dropreplace="$root" -require="$root@$version")
  [ "$old" = - ] || args+=(-dropreplace="$root@$old")
  (cd "$dir" && go mod edit "${args[@]}" && go mod tidy)
done <<<"$pins"

# The workspace: go.work replaces the pinned version of the root module with
# the local one. Workspace builds read the go.mod of every required version,
# even of a module that is in the workspace, and no proxy serves the root's.
if [ -f go.work ]; then
  args=()
  while read -r v _; do
    if [ "$v" = - ]; then args+=(-dropreplace="$root"); else args+=(-dropreplace="$root@$v"); fi
  done < <("$tmp/modproxy" work -repo "$top")
  for v in $("$tmp/modproxy" pins -repo "$top" | awk '$2 != "-" {print $2}' | sort -u); do
    args+=(-replace="$root@$v=./")
  done
  go work edit "${args[@]}" go.work
  echo "== go.work: replace $root $version => ./"
fi

# No replace may remain (for example one with a version other than the
# required one on its left side).
left=$("$tmp/modproxy" pins -repo "$top" | awk '$3 != "-"')
if [ -n "$left" ]; then
  echo "error: a replace directive for $root remains in:" >&2
  echo "$left" >&2
  exit 1
fi

echo "== pinned to $version"
git status --short -- go.work $(awk '{print $1"/go.mod", $1"/go.sum"}' <<<"$pins")
echo "Check with: bash scripts/modcheck.sh"
