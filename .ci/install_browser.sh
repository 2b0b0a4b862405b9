#!/usr/bin/env bash
# Makes a headless Chromium available for the HTML report tests (tests/report/test_html.py).
# Installs Debian's `chromium` package when no Chromium is on PATH. Always exits 0: without a browser
# those tests skip with a clear reason, and the rest of CI must still run; this script says why.
set -u

for name in chromium chromium-browser google-chrome google-chrome-stable; do
  if command -v "$name" >/dev/null 2>&1; then
    echo "install_browser: found $(command -v "$name"); nothing to install"
    exit 0
  fi
done

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_browser: no chromium on PATH and no apt-get (not a Debian/Ubuntu system); HTML browser tests will skip"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "install_browser: not root and no password-less sudo; cannot apt-get install chromium; HTML browser tests will skip"
    exit 0
  fi
fi

echo "install_browser: installing Debian's chromium package (apt-get, a minute or two)"
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -qq; then
  echo "install_browser: apt-get update failed (offline or no mirror?); HTML browser tests will skip"
  exit 0
fi
if ! $SUDO apt-get install -y -qq chromium; then
  echo "install_browser: apt-get install chromium failed (package not in this distribution's repositories?); HTML browser tests will skip"
  exit 0
fi
if command -v chromium >/dev/null 2>&1; then
  echo "install_browser: installed $(chromium --version 2>/dev/null || echo chromium)"
else
  echo "install_browser: apt-get reported success but no chromium on PATH; HTML browser tests will skip"
fi
exit 0
