#!/usr/bin/env bash
# Headless Chromium for the UI test: prints the browser's path, installing Debian's `chromium` with
# apt-get when it is missing (the same way pg.sh installs PostgreSQL).
#   export AUTORESEARCH_CHROMIUM="$(bash scripts/browser.sh)"
set -euo pipefail

die() { echo "browser.sh: $*" >&2; exit 1; }

find_browser() { command -v chromium || command -v chromium-browser || true; }

bin=$(find_browser)
if [ -z "$bin" ]; then
  command -v apt-get >/dev/null || die "chromium is not installed and apt-get is unavailable"
  echo "browser.sh: installing chromium with apt-get" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >&2 \
    || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >&2; } \
    || die "apt-get install chromium failed"
  bin=$(find_browser)
  [ -n "$bin" ] || die "chromium installed but not on PATH"
fi
echo "$bin"
