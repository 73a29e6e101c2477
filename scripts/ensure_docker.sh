#!/usr/bin/env bash
# Make sure a Docker daemon answers, installing and starting Debian's docker.io when missing.
# Idempotent: returns at once when `docker info` already works.
set -euo pipefail

if docker info >/dev/null 2>&1; then
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: Docker is not running and installing it needs root (apt-get install docker.io debootstrap)" >&2
    exit 1
  fi
  echo "installing docker.io and debootstrap from Debian packages..." >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
  echo "starting dockerd..." >&2
  # setsid: the daemon outlives this script and the make that ran it.
  setsid nohup dockerd >/var/log/mathagent-dockerd.log 2>&1 < /dev/null &
fi

for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
echo "error: dockerd did not answer within 60 s; see /var/log/mathagent-dockerd.log" >&2
exit 1
