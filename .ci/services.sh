#!/usr/bin/env bash
# Makes sure RabbitMQ and Redis are reachable for agent-reach.
#
# Uses REACH_BROKER_URL / REACH_REDIS_URL when they are set and answer; otherwise installs
# rabbitmq-server and redis-server from apt (when missing) and starts local ones on loopback.
# Safe to run repeatedly. Prints the URLs it settled on as shell assignments on stdout's last lines,
# so callers can `eval "$(bash .ci/services.sh)"`.
set -euo pipefail

log() { echo "[services] $*" >&2; }

broker_url=${REACH_BROKER_URL:-amqp://guest:guest@127.0.0.1:5672//}
redis_url=${REACH_REDIS_URL:-redis://127.0.0.1:6379/0}

# host and port out of a URL like scheme://user:pass@host:port/...
hostport() {
  local rest=${1#*://}
  rest=${rest%%/*}
  rest=${rest##*@}
  local host=${rest%%:*} port=${rest##*:}
  [ "$port" = "$rest" ] && port=$2
  echo "$host $port"
}

reachable() {  # host port
  timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
}

is_local() { case "$1" in localhost|127.0.0.1|::1) return 0;; *) return 1;; esac; }

need_apt=()
read -r bhost bport <<<"$(hostport "$broker_url" 5672)"
read -r rhost rport <<<"$(hostport "$redis_url" 6379)"

if reachable "$bhost" "$bport"; then
  log "RabbitMQ reachable at $bhost:$bport"
  broker_ok=1
else
  broker_ok=0
  is_local "$bhost" || { log "REACH_BROKER_URL points at $bhost:$bport, which does not answer; falling back to a local RabbitMQ"; broker_url=amqp://guest:guest@127.0.0.1:5672//; bhost=127.0.0.1; bport=5672; }
  command -v rabbitmq-server >/dev/null || need_apt+=(rabbitmq-server)
fi
if reachable "$rhost" "$rport"; then
  log "Redis reachable at $rhost:$rport"
  redis_ok=1
else
  redis_ok=0
  is_local "$rhost" || { log "REACH_REDIS_URL points at $rhost:$rport, which does not answer; falling back to a local Redis"; redis_url=redis://127.0.0.1:6379/0; rhost=127.0.0.1; rport=6379; }
  command -v redis-server >/dev/null || need_apt+=(redis-server)
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing ${need_apt[*]} with apt-get (one-time)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  # policy-rc.d stops apt from auto-starting the services: we start them ourselves on loopback.
  apt-get install -y -qq "${need_apt[@]}" >&2
fi

if [ "$redis_ok" = 0 ] && ! reachable 127.0.0.1 6379; then
  log "starting redis-server on 127.0.0.1:6379"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no >&2
fi
if [ "$broker_ok" = 0 ] && ! reachable 127.0.0.1 5672; then
  log "starting rabbitmq-server (detached)"
  # the Debian package may have started it through its init script; -detached is harmless then.
  rabbitmq-server -detached >&2 || true
fi

wait_for() {  # name host port seconds
  local i
  for ((i = 0; i < $4 * 2; i++)); do
    reachable "$2" "$3" && return 0
    sleep 0.5
  done
  log "$1 did not come up on $2:$3 within $4 s"
  return 1
}
wait_for Redis "$rhost" "$rport" 30
wait_for RabbitMQ "$bhost" "$bport" 120
if [ "$broker_ok" = 0 ] && command -v rabbitmqctl >/dev/null; then
  # the port opens before the broker is fully booted; wait for the app itself
  timeout 120 rabbitmqctl await_startup >&2 2>&1 || log "rabbitmqctl await_startup did not confirm start-up"
fi
log "RabbitMQ and Redis are up"
echo "export REACH_BROKER_URL='$broker_url'"
echo "export REACH_REDIS_URL='$redis_url'"
