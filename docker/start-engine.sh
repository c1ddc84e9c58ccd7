#!/usr/bin/env bash
# Start a Docker engine where none runs (CI, a fresh machine): install docker.io
# and debootstrap (for the base image when no registry answers) if missing,
# then run dockerd in the background without iptables or a bridge (containers
# get no network anyway), on overlay2, falling back to vfs where overlay2
# cannot mount (vfs copies every layer for every container: much slower).
# Exits non-zero when no engine answers. Needs root.
set -euo pipefail
log=${DOCKERD_LOG:-/tmp/dockerd.log}
answers() { docker info >/dev/null 2>&1; }
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null || ! command -v docker >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
fi
answers && { echo "docker: an engine already answers"; exit 0; }
for driver in ${DOCKER_STORAGE_DRIVER:-overlay2 vfs}; do
  dockerd --iptables=false --bridge=none --storage-driver="$driver" >>"$log" 2>&1 &
  pid=$!
  for _ in $(seq 60); do
    answers && { echo "docker: engine started (pid $pid, storage $driver, log $log)"; exit 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
  echo "docker: dockerd with storage $driver did not answer (see $log)" >&2
done
exit 1
