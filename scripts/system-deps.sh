#!/usr/bin/env bash
# Debian packages the book and its tests use: a CJK font (Chinese plot labels and the browser test's
# screenshot), headless Chromium (the browser test) and fortunes-zh (day25's evaluation text: the Tang and
# Song poems the poem model was trained on, and modern prose; the lessons record its version from
# /usr/share/doc/fortunes-zh/changelog.gz). Installs them when missing and we are root.
set -u
need=()
fc-list 2>/dev/null | grep -qi "Noto Sans CJK" || need+=(fonts-noto-cjk fontconfig)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ -f /usr/share/games/fortunes/tang300 ] || need+=(fortunes-zh)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >/tmp/kestrel-system-deps.log 2>&1 \
    || { echo "system-deps: apt-get failed, see /tmp/kestrel-system-deps.log"; tail -5 /tmp/kestrel-system-deps.log; exit 1; }
  # matplotlib caches the font list: drop it so the new CJK font is found.
  rm -rf "${MPLCONFIGDIR:-$HOME/.cache/matplotlib}"
else
  echo "system-deps: missing ${need[*]}; install them (e.g. sudo apt-get install ${need[*]}) for CJK plot labels, the browser test and day25's texts"
fi
