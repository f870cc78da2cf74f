#!/usr/bin/env bash
# Install Debian's chromium for tests/test_trace_html_browser.py (headless),
# unless a chromium or chrome binary is already on PATH.
set -euo pipefail
for b in chromium chromium-browser google-chrome google-chrome-stable; do
    if command -v "$b" >/dev/null 2>&1; then
        echo "chromium: $(command -v "$b") already installed"
        exit 0
    fi
done
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq chromium
command -v chromium
