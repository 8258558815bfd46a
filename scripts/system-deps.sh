#!/usr/bin/env bash
# Debian packages the book and its tests use: a CJK font (Chinese plot labels and the browser test's
# screenshot) and headless Chromium (the browser test). Installs them when missing and we are root.
set -u
need=()
fc-list 2>/dev/null | grep -qi "Noto Sans CJK" || need+=(fonts-noto-cjk fontconfig)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >/tmp/kestrel-system-deps.log 2>&1 \
    || { echo "system-deps: apt-get failed, see /tmp/kestrel-system-deps.log"; tail -5 /tmp/kestrel-system-deps.log; exit 1; }
  # matplotlib caches the font list: drop it so the new CJK font is found.
  rm -rf "${MPLCONFIGDIR:-$HOME/.cache/matplotlib}"
else
  echo "system-deps: missing ${need[*]}; install them (e.g. sudo apt-get install ${need[*]}) for CJK plot labels and the browser test"
fi
