#!/usr/bin/env bash
# What the page tests need besides Python: Debian's Chromium and its driver (nothing downloads a
# browser build of its own). Run by `make test` (and so by .ci/run); safe to run again.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "scripts/install_browser.sh: no apt-get here; install Chromium and chromedriver yourself" \
       "(/usr/bin/chromium, /usr/bin/chromedriver) for the page tests" >&2
  exit 1
fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium chromium-driver
