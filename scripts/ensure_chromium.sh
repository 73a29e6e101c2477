#!/usr/bin/env bash
# Make sure a Chromium is installed for the report's browser test, from Debian's `chromium`.
# Idempotent: returns at once when one is on PATH. Prints the browser's path.
set -euo pipefail

for name in chromium chromium-browser google-chrome; do
  if command -v "$name" >/dev/null 2>&1; then
    command -v "$name"
    exit 0
  fi
done

if [ "$(id -u)" -ne 0 ]; then
  echo "error: no Chromium found and installing it needs root (apt-get install chromium)" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: no Chromium found and no apt-get to install it with" >&2
  exit 1
fi
echo "installing chromium from Debian packages..." >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
command -v chromium
