#!/usr/bin/env bash
# Redis topologies for the test suite, on free loopback ports, without
# persistence:
#   - one standalone server                      HYBRIDLIMIT_REDIS_ADDR
#   - a Redis Cluster, 3 masters + 3 replicas    HYBRIDLIMIT_CLUSTER_ADDRS
#   - a Sentinel group: a master, a replica and  HYBRIDLIMIT_SENTINEL_ADDRS,
#     three sentinels (quorum 2)                 HYBRIDLIMIT_SENTINEL_MASTER
# Every server has its own directory $HYBRIDLIMIT_REDIS_DIR/<kind>-<port>/
# (kind: standalone, cluster, data, sentinel) holding its config file
# (redis.conf, or sentinel.conf for a sentinel), its pidfile redis.pid, its
# log redis.log and, for a cluster node, nodes.conf. Starting redis-server
# again from the config file brings a killed server back under the same port
# and identity; internal/redistest does that for fault tests.
#
# scripts/test.sh sources this file: rt_start_all starts everything and
# exports the variables, rt_stop_all stops every server (the processes it
# started and every PID found in a pidfile) and deletes the directory.
# Run directly, it serves a developer:
#   eval "$(scripts/redis-topology.sh start)"   # start, print the exports
#   scripts/redis-topology.sh stop "$HYBRIDLIMIT_REDIS_DIR"
# (the servers then belong to PID 1; where PID 1 does not reap orphans,
# killed ones stay zombies until it does: test.sh runs under a subreaper).

RT_MASTER_NAME=hlmaster
RT_NODE_TIMEOUT=1000 # cluster-node-timeout and sentinel down-after-milliseconds
RT_WAIT=20           # seconds to wait for a topology to come up

rt_dir=""
rt_pids=()       # "pid:port" of every server this shell started
rt_reserved=" "  # ports handed out, so two servers never draw the same one
rt_port=""       # result of rt_pick_port

rt_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# rt_pick_port sets rt_port to a free port whose cluster bus port (+10000) is
# free too. Ports lie in 15000-21999 (bus 25000-31999): below Linux's
# ephemeral range, so no outgoing connection can take one while a killed
# server is down.
rt_pick_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((15000 + RANDOM % 7000))
    case "$rt_reserved" in *" $p "*) continue ;; esac
    if rt_in_use "$p" || rt_in_use $((p + 10000)); then continue; fi
    rt_reserved+="$p "
    rt_port=$p
    return 0
  done
  echo "redis-topology: no free port found" >&2
  return 1
}

# rt_fail DIR MESSAGE prints MESSAGE and the tail of the server's log, and
# fails.
rt_fail() {
  echo "redis-topology: $2" >&2
  if [ -f "$1/redis.log" ]; then
    echo "---- last lines of $1/redis.log" >&2
    tail -n 30 "$1/redis.log" >&2
    echo "----" >&2
  fi
  return 1
}

# rt_spawn KIND PORT [MASTER_PORT] writes the config of a server and starts
# it in the background.
rt_spawn() {
  local kind=$1 port=$2 master=${3:-} d="$rt_dir/$1-$2" conf
  [ -d "$rt_dir" ] || { echo "redis-topology: no directory (rt_start_all makes it)" >&2; return 1; }
  mkdir -p "$d"
  conf="$d/redis.conf"
  [ "$kind" = sentinel ] && conf="$d/sentinel.conf"
  {
    echo "port $port"
    echo "bind 127.0.0.1"
    echo "protected-mode no"
    echo "daemonize no"
    echo "dir $d"
    echo "pidfile $d/redis.pid"
    echo "logfile $d/redis.log"
    echo "loglevel notice"
    if [ "$kind" = sentinel ]; then
      echo "sentinel monitor $RT_MASTER_NAME 127.0.0.1 $master 2"
      echo "sentinel down-after-milliseconds $RT_MASTER_NAME $RT_NODE_TIMEOUT"
      echo "sentinel failover-timeout $RT_MASTER_NAME 5000"
      echo "sentinel parallel-syncs $RT_MASTER_NAME 1"
    else
      echo 'save ""'
      echo "appendonly no"
      echo "repl-diskless-sync yes"
      echo "repl-diskless-sync-delay 0"
    fi
    if [ "$kind" = cluster ]; then
      echo "cluster-enabled yes"
      echo "cluster-config-file $d/nodes.conf"
      echo "cluster-node-timeout $RT_NODE_TIMEOUT"
      echo "cluster-replica-validity-factor 0"
    fi
    if [ "$kind" = data ] && [ -n "$master" ]; then
      echo "replicaof 127.0.0.1 $master"
    fi
  } >"$conf"
  if [ "$kind" = sentinel ]; then
    redis-server "$conf" --sentinel >/dev/null 2>&1 &
  else
    redis-server "$conf" >/dev/null 2>&1 &
  fi
  rt_pids+=("$!:$port")
  # Out of the job table: bash still reaps it, without a "Killed" notice
  # when a test or rt_stop_all kills it.
  disown "$!"
}

# rt_wait_up KIND PORT waits until the server on PORT has logged that it is
# ready and its port is open; it fails early when the
# process started for PORT has exited.
rt_wait_up() {
  local log="$rt_dir/$1-$2/redis.log" pid="" e
  for e in "${rt_pids[@]}"; do [ "${e#*:}" = "$2" ] && pid=${e%%:*}; done
  for _ in $(seq 1 $((RT_WAIT * 50))); do
    if [ -f "$log" ] && [[ "$(<"$log")" == *@("Ready to accept connections"|"Sentinel ID is")* ]] && rt_in_use "$2"; then
      return 0
    fi
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then return 1; fi
    sleep 0.02
  done
  return 1
}

# rt_spawn_many KIND COUNT [MASTER_PORT] starts COUNT servers without
# waiting and appends "KIND:PORT:MASTER_PORT" to rt_spawned.
rt_spawned=()
rt_spawn_many() {
  for _ in $(seq 1 "$2"); do
    rt_pick_port || return 1
    rt_spawn "$1" "$rt_port" "${3:-}"
    rt_spawned+=("$1:$rt_port:${3:-}")
  done
}

# rt_wait_spawned waits for every server in rt_spawned, empties it and sets
# rt_ports to their ports, in order. A server that cannot bind its port is
# started again on another one.
rt_wait_spawned() {
  local e kind p master attempt d
  rt_ports=()
  for e in "${rt_spawned[@]}"; do
    IFS=: read -r kind p master <<<"$e"
    for attempt in 1 2 3 4 5; do
      d="$rt_dir/$kind-$p"
      if rt_wait_up "$kind" "$p"; then break; fi
      if [ "$attempt" -lt 5 ] && grep -q "Address already in use" "$d/redis.log" 2>/dev/null; then
        echo "   port $p is taken, trying another" >&2
        rm -rf "$d"
        rt_pick_port || return 1
        p=$rt_port
        rt_spawn "$kind" "$p" "$master"
        continue
      fi
      rt_fail "$d" "$kind server on port $p did not come up" || return 1
    done
    rt_ports+=("$p")
  done
  rt_spawned=()
}

# rt_poll SECONDS COMMAND... runs COMMAND every 50 ms until it succeeds.
rt_poll() {
  local n=$(($1 * 20))
  shift
  for _ in $(seq 1 "$n"); do
    "$@" && return 0
    sleep 0.05
  done
  return 1
}

rt_info() { redis-cli -p "$1" "${@:2}" 2>/dev/null | tr -d '\r'; }

# rt_cluster_ok PORT... succeeds when every node reports the cluster ok,
# knows all the others, and half of them are replicas in sync.
rt_cluster_ok() {
  local p info replicas=0
  for p in "$@"; do
    info=$'\n'$(printf 'cluster info\ninfo replication\n' | redis-cli -p "$p" 2>/dev/null | tr -d '\r')$'\n'
    [[ "$info" == *$'\ncluster_state:ok\n'* ]] || return 1
    [[ "$info" == *$'\ncluster_slots_ok:16384\n'* ]] || return 1
    [[ "$info" == *$'\ncluster_known_nodes:'"$#"$'\n'* ]] || return 1
    [[ "$info" != *$'\nmaster_link_status:up\n'* ]] || replicas=$((replicas + 1))
  done
  [ "$replicas" = $(($# / 2)) ]
}

rt_link_up() { rt_info "$1" info replication | grep -qx 'master_link_status:up'; }

# rt_sentinel_ok PORT... succeeds when every sentinel sees the master
# healthy, one replica and the other sentinels.
rt_sentinel_ok() {
  local p m
  for p in "$@"; do
    m=$(rt_info "$p" sentinel master "$RT_MASTER_NAME" | paste - - | tr '\t' '=')
    grep -qx 'flags=master' <<<"$m" || return 1
    grep -qx 'num-slaves=1' <<<"$m" || return 1
    grep -qx "num-other-sentinels=$(($# - 1))" <<<"$m" || return 1
  done
}

rt_join() { local IFS=,; echo "$*"; }

# rt_mark NAME notes in rt_timing how long rt_start_all took to get there.
rt_mark() {
  local now=${EPOCHREALTIME/[.,]/}
  rt_timing+="${rt_timing:+, }$1 $(((now - rt_t0) / 1000))ms"
}

# rt_start_all starts the three topologies and exports their variables.
rt_start_all() {
  local standalone cluster master replica sentinels create_pid p
  rt_t0=${EPOCHREALTIME/[.,]/} rt_timing=""
  rt_dir=$(mktemp -d "${TMPDIR:-/tmp}/hybridlimit-redis.XXXXXX") || return 1
  export HYBRIDLIMIT_REDIS_DIR=$rt_dir

  rt_spawn_many standalone 1 && rt_spawn_many cluster 6 && rt_spawn_many data 1 || return 1
  rt_wait_spawned || return 1
  standalone=${rt_ports[0]}
  cluster=("${rt_ports[@]:1:6}")
  master=${rt_ports[7]}
  rt_mark "8 servers up"

  timeout "$RT_WAIT" redis-cli --cluster create $(printf '127.0.0.1:%s ' "${cluster[@]}") \
    --cluster-replicas 1 --cluster-yes >"$rt_dir/cluster-create.log" 2>&1 &
  create_pid=$!

  # The sentinels learn the replica from the master's INFO, which they
  # read when they connect and then every 10 s: start them once it is in.
  rt_spawn_many data 1 "$master" && rt_wait_spawned || return 1
  replica=${rt_ports[0]}
  rt_poll "$RT_WAIT" rt_link_up "$replica" ||
    rt_fail "$rt_dir/data-$replica" "replica $replica did not sync with master $master" || return 1
  rt_mark "replica synced"
  rt_spawn_many sentinel 3 "$master" && rt_wait_spawned || return 1
  sentinels=("${rt_ports[@]}")
  rt_mark "sentinels up"

  if ! wait "$create_pid"; then
    cat "$rt_dir/cluster-create.log" >&2
    rt_fail "$rt_dir/cluster-${cluster[0]}" "redis-cli --cluster create failed" || return 1
  fi
  if ! rt_poll "$RT_WAIT" rt_cluster_ok "${cluster[@]}"; then
    for p in "${cluster[@]}"; do echo "node $p: $(rt_info "$p" cluster info | head -n 3 | tr '\n' ' ')" >&2; done
    rt_fail "$rt_dir/cluster-${cluster[0]}" "the cluster is not ok after ${RT_WAIT}s" || return 1
  fi
  rt_mark "cluster ok"
  if ! rt_poll "$RT_WAIT" rt_sentinel_ok "${sentinels[@]}"; then
    for p in "${sentinels[@]}"; do echo "sentinel $p: $(rt_info "$p" sentinel master "$RT_MASTER_NAME" | paste -sd ' ')" >&2; done
    rt_fail "$rt_dir/sentinel-${sentinels[0]}" "the sentinels do not agree after ${RT_WAIT}s" || return 1
  fi
  rt_mark "sentinels agree"

  export HYBRIDLIMIT_REDIS_ADDR="127.0.0.1:$standalone"
  export HYBRIDLIMIT_CLUSTER_ADDRS=$(rt_join $(printf '127.0.0.1:%s ' "${cluster[@]}"))
  export HYBRIDLIMIT_SENTINEL_ADDRS=$(rt_join $(printf '127.0.0.1:%s ' "${sentinels[@]}"))
  export HYBRIDLIMIT_SENTINEL_MASTER=$RT_MASTER_NAME
}

# rt_is_redis PID PORT succeeds when PID is a live (not zombie) redis-server
# serving PORT, so that a stale pidfile never makes us signal a stranger.
rt_is_redis() {
  local pid=$1 port=$2 stat
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = redis-server ] || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q ":$port\( \|\$\)"
}

# rt_live_pids DIR prints the PIDs of the live servers of DIR: those this
# shell started and those named in the pidfiles.
rt_live_pids() {
  local e f d
  for e in "${rt_pids[@]}"; do
    rt_is_redis "${e%%:*}" "${e#*:}" && echo "${e%%:*}"
  done
  for f in "$1"/*/redis.pid; do
    [ -f "$f" ] || continue
    d=${f%/redis.pid}
    rt_is_redis "$(cat "$f")" "${d##*-}" && cat "$f"
  done
}

# rt_stop_all [DIR] kills every server of DIR (default: the one
# rt_start_all made), stopped ones included, and deletes DIR.
rt_stop_all() {
  set +e # runs in an EXIT trap: never give up half way
  local dir=${1:-$rt_dir} pids e i
  [ -n "$dir" ] && [ -d "$dir" ] || return 0
  for i in 1 2; do # twice: a server restarted during the first round
    pids=$(rt_live_pids "$dir" | sort -u)
    [ -n "$pids" ] || break
    # Nothing to save: SIGKILL, which also ends stopped processes (on
    # SIGTERM a master would wait up to 10 s for its replicas).
    kill -KILL $pids 2>/dev/null
    for _ in $(seq 1 50); do
      [ -n "$(rt_live_pids "$dir")" ] || break
      sleep 0.05
    done
  done
  pids=$(rt_live_pids "$dir" | sort -u)
  if [ -n "$pids" ]; then
    echo "redis-topology: still running: $pids" >&2
    return 1
  fi
  rm -rf "$dir"
  [ "$dir" != "$rt_dir" ] || rt_dir=""
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  case "${1:-}" in
  start)
    rt_start_all || { rt_stop_all; exit 1; }
    echo "# redis topologies up ($rt_timing); stop with: $0 stop $rt_dir" >&2
    for v in HYBRIDLIMIT_REDIS_DIR HYBRIDLIMIT_REDIS_ADDR HYBRIDLIMIT_CLUSTER_ADDRS \
      HYBRIDLIMIT_SENTINEL_ADDRS HYBRIDLIMIT_SENTINEL_MASTER; do
      echo "export $v=${!v}"
    done
    ;;
  stop)
    [ -n "${2:-}" ] || { echo "usage: $0 stop DIR" >&2; exit 2; }
    rt_stop_all "$2"
    ;;
  *)
    echo "usage: $0 start | stop DIR" >&2
    exit 2
    ;;
  esac
fi
