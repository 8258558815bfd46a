#!/usr/bin/env bash
# make board-smoke: check the board path without a board (issue 16 §6). Needs root; never run by CI.
#
# On a Debian/Ubuntu x86-64 machine: installs qemu-user-static, binfmt-support and debootstrap when
# missing, mounts binfmt_misc and registers qemu-aarch64 when they are not, builds (or reuses) an arm64
# Debian 12 root, and inside it follows book/rerun.md as an operator would — its apt-get line, a clone
# of this checkout from a git bundle, `make env`, `kestrel-lab runner-info`, vocab.bin and its sha256,
# convert + generate + chat on the poem model, bench, `make board-test` (pytest -m board) and
# `kestrel-lab rerun --runner emu-a76 --days 16-18` — under QEMU_CPU=cortex-a76 with
# KESTREL_EMULATED set, so every figure's provenance says it was emulated. Prints one table: step,
# status, seconds. Emulated figures stay inside the root (never in this checkout).
#
# Settings (environment):
#   BOARD_ROOT          the arm64 root (default ~/.cache/kestrel_lab/board-root; reused when complete)
#   BOARD_MIRROR        Debian mirror for debootstrap (default http://deb.debian.org/debian)
#   BOARD_CPU           the emulated core (default cortex-a76: the RK3588's big core)
#   BOARD_TEST_LIMIT_S  time limit of the pinned pytest subset (default 1800)
#   BOARD_ONLY          run only these inner steps (comma-separated first words, e.g. runner-info,generate)
#   BOARD_FRESH=1       rebuild the root from scratch
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
BOARD_ROOT="${BOARD_ROOT:-$HOME/.cache/kestrel_lab/board-root}"
BOARD_MIRROR="${BOARD_MIRROR:-http://deb.debian.org/debian}"
BOARD_SUITE=bookworm
BOARD_CPU="${BOARD_CPU:-cortex-a76}"
BOARD_TEST_LIMIT_S="${BOARD_TEST_LIMIT_S:-1800}"
BOARD_USER=kestrel
MARKER=".kestrel-board-root"
# The root's identity: a change here (suite, base packages) rebuilds it.
ROOT_SPEC="debootstrap --arch=arm64 --variant=minbase --include=sudo,ca-certificates $BOARD_SUITE"

if [ "$(id -u)" != 0 ]; then
  echo "board-smoke: needs root (apt-get, binfmt_misc, chroot): sudo make board-smoke" >&2
  exit 2
fi

STATE="$(mktemp -d -t kestrel-board-smoke.XXXXXX)"
RESULTS="$STATE/results.tsv"
: >"$RESULTS"
MOUNTS="$STATE/mounts"   # mount points to undo, one a line, innermost last
: >"$MOUNTS"

cleanup() {
  local rc=$?
  set +e
  local m p
  # Stopped early: end what still runs inside the root (only processes whose root is BOARD_ROOT), or
  # the unmounts below would find it busy.
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$(readlink -f "$BOARD_ROOT")" ] && kill "${p#/proc/}" 2>/dev/null
  done
  while read -r m; do
    [ -n "$m" ] || continue
    umount "$m" 2>/dev/null || { sleep 1; umount "$m" 2>/dev/null; } \
      || umount -l "$m" 2>/dev/null || echo "board-smoke: could not unmount $m" >&2
  done < <(tac "$MOUNTS" 2>/dev/null)
  # debootstrap's second stage mounts /proc and /sys itself; a failed one leaves them behind.
  for m in "$BOARD_ROOT.tmp/proc" "$BOARD_ROOT.tmp/sys"; do
    mountpoint -q "$m" 2>/dev/null && { umount "$m" 2>/dev/null || umount -l "$m"; }
  done
  if [ $rc != 0 ] && ! cut -f2 "$RESULTS" | grep -qv '^ok$'; then
    # Stopped between steps or by a signal: the table must not read "all ok".
    printf 'board-smoke\tFAIL\t0.0\texit %s%s\n' "$rc" "$( [ $rc -ge 128 ] && echo ' (interrupted)')" >>"$RESULTS"
  fi
  if [ -s "$RESULTS" ]; then
    echo
    python3 "$REPO/scripts/board_smoke.py" table "$RESULTS"
    local trc=$?
    [ $rc = 0 ] && rc=$trc
    [ -n "${LOGS:-}" ] && echo "logs: $LOGS"
  fi
  rm -rf "$STATE"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# step NAME COMMAND…: run a host-side step, time it, append its row to the table.
step() {
  local name="$1"; shift
  local t0 t1 rc
  echo "board-smoke: $name …"
  t0=$(date +%s.%N)
  set +e
  ( set -e; "$@" ) >"$STATE/step.log" 2>&1   # a subshell: `set -e` holds inside the step's function
  rc=$?
  set -e
  t1=$(date +%s.%N)
  local secs; secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  if [ $rc = 0 ]; then
    printf '%s\tok\t%s\t%s\n' "$name" "$secs" "$(tail -n 1 "$STATE/step.log" | tr '\t' ' ' | cut -c1-160)" >>"$RESULTS"
  else
    echo "board-smoke: $name failed (exit $rc); its last lines:" >&2
    tail -n 15 "$STATE/step.log" >&2
    printf '%s\tFAIL\t%s\texit %s: %s\n' "$name" "$secs" "$rc" "$(tail -n 1 "$STATE/step.log" | tr '\t' ' ' | cut -c1-160)" >>"$RESULTS"
    exit 1
  fi
}

host_packages() {
  local need=()
  command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
  command -v update-binfmts >/dev/null || need+=(binfmt-support)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  # binfmt_misc first: qemu-user-static's install script registers its handlers only when it is mounted.
  mount_binfmt_misc
  if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}"
    echo "installed ${need[*]}"
  else
    echo "qemu-user-static, binfmt-support and debootstrap already installed"
  fi
}

mount_binfmt_misc() {
  if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  fi
}

register_qemu() {
  mount_binfmt_misc
  local entry=/proc/sys/fs/binfmt_misc/qemu-aarch64
  if [ ! -e "$entry" ]; then
    update-binfmts --enable qemu-aarch64 2>/dev/null || update-binfmts --import qemu-aarch64 2>/dev/null || true
  fi
  if [ ! -e "$entry" ]; then
    # The handler qemu-user-static ships, registered by hand: the ELF header of an aarch64 executable;
    # F opens the interpreter now, so it works inside a chroot that lacks it.
    local qemu; qemu="$(command -v qemu-aarch64-static)"
    printf '%s' ":qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:$qemu:FP" \
      >/proc/sys/fs/binfmt_misc/register
  fi
  grep -q '^enabled' "$entry" || echo 1 >"$entry"
  grep -q '^flags: .*F' "$entry" || { echo "qemu-aarch64 is registered without the F flag: a chroot cannot find its interpreter" >&2; return 1; }
  echo "qemu-aarch64: $(sed -n 's/^interpreter //p' "$entry") ($(sed -n 's/^flags: //p' "$entry"))"
}

build_root() {
  if [ "${BOARD_FRESH:-0}" = 1 ]; then rm -rf "$BOARD_ROOT"; fi
  if [ -f "$BOARD_ROOT/$MARKER" ] && [ "$(cat "$BOARD_ROOT/$MARKER")" = "$ROOT_SPEC" ]; then
    echo "reusing $BOARD_ROOT ($ROOT_SPEC)"
    return 0
  fi
  rm -rf "$BOARD_ROOT" "$BOARD_ROOT.tmp"
  mkdir -p "$(dirname "$BOARD_ROOT")"
  debootstrap --arch=arm64 --variant=minbase --include=sudo,ca-certificates --foreign \
    "$BOARD_SUITE" "$BOARD_ROOT.tmp" "$BOARD_MIRROR"
  chroot "$BOARD_ROOT.tmp" /debootstrap/debootstrap --second-stage
  for m in "$BOARD_ROOT.tmp/proc" "$BOARD_ROOT.tmp/sys"; do
    if mountpoint -q "$m"; then umount "$m" || { sleep 2; umount "$m"; } || umount -l "$m"; fi
  done
  chroot "$BOARD_ROOT.tmp" useradd -m -s /bin/bash "$BOARD_USER"
  # A board image's first user may use sudo; the page's `sudo apt-get …` lines need it.
  echo "$BOARD_USER ALL=(ALL) NOPASSWD:ALL" >"$BOARD_ROOT.tmp/etc/sudoers.d/$BOARD_USER"
  chmod 0440 "$BOARD_ROOT.tmp/etc/sudoers.d/$BOARD_USER"
  echo "$ROOT_SPEC" >"$BOARD_ROOT.tmp/$MARKER"
  mv "$BOARD_ROOT.tmp" "$BOARD_ROOT"
  echo "built $BOARD_ROOT: $(chroot "$BOARD_ROOT" uname -m), Debian $(cat "$BOARD_ROOT/etc/debian_version")"
}

mount_root() {
  # Fresh instances, never binds of the host's: a bind of /dev would put the root's mounts (shm, pts)
  # on the host's own /dev. debootstrap made the device nodes the root needs (null, zero, urandom, tty…).
  local m
  for m in proc sys dev/shm dev/pts; do
    mountpoint -q "$BOARD_ROOT/$m" && continue
    case $m in
      proc) mount -t proc proc "$BOARD_ROOT/proc" ;;
      sys) mount -t sysfs sysfs "$BOARD_ROOT/sys" ;;
      dev/shm) mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$BOARD_ROOT/dev/shm" ;;
      dev/pts) mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$BOARD_ROOT/dev/pts" ;;
    esac
    echo "$BOARD_ROOT/$m" >>"$MOUNTS"
  done
  cp -L /etc/resolv.conf "$BOARD_ROOT/etc/resolv.conf"
  # The network the host is on: a TLS-inspecting proxy's CA that the host trusts (a local certificate
  # under /usr/local/share/ca-certificates), the root must trust too, or pip cannot reach PyPI.
  local extra=0 crt
  for crt in /usr/local/share/ca-certificates/*.crt; do
    [ -f "$crt" ] || continue
    install -D -m 0644 "$crt" "$BOARD_ROOT/usr/local/share/ca-certificates/$(basename "$crt")"
    extra=$((extra + 1))
  done
  if [ $extra -gt 0 ]; then
    as_root "update-ca-certificates >/dev/null"
    echo "$extra local CA certificate(s) of the host trusted in the root" >"$STATE/trust"
  fi
  echo "mounted proc, sys, dev/shm, dev/pts in $BOARD_ROOT"
}

# as_user COMMAND: run a shell command in the root as the operator, in a clean login environment
# (plus the host's proxy settings and, when the host trusts local CAs, the bundle pip must use).
as_user() {
  local net=() v
  for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    [ -n "${!v:-}" ] && net+=("$v=${!v}")
  done
  [ -f "$STATE/trust" ] && net+=(PIP_CERT=/etc/ssl/certs/ca-certificates.crt)
  chroot "$BOARD_ROOT" /usr/sbin/runuser -u "$BOARD_USER" -- env -i HOME="/home/$BOARD_USER" \
    USER="$BOARD_USER" LOGNAME="$BOARD_USER" PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
    LANG=C.UTF-8 TERM=dumb QEMU_CPU="$BOARD_CPU" NUMBA_CPU_NAME="$BOARD_CPU" \
    KESTREL_EMULATED="qemu-aarch64-$BOARD_CPU" "${net[@]}" bash -c "$1"
}

# as_root COMMAND: what the page runs with sudo. (sudo itself cannot work here: binfmt_misc runs a
# set-uid program through qemu without raising its privileges, unless qemu were registered with the
# C flag, which would change how the host runs every foreign binary.)
as_root() {
  chroot "$BOARD_ROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
    LANG=C.UTF-8 TERM=dumb DEBIAN_FRONTEND=noninteractive QEMU_CPU="$BOARD_CPU" bash -c "$1"
}

# The operator page's `sudo apt-get install` line, taken from the page itself so the two cannot drift.
page_packages() {
  local line
  line="$(grep -m1 -E '^sudo apt-get install -y ' "$REPO/book/rerun.md")" \
    || { echo "book/rerun.md has no 'sudo apt-get install -y …' line" >&2; return 1; }
  as_root "apt-get update -qq && ${line#sudo }"
  echo "page §2: ${line#sudo apt-get install -y }"
}

# The instructor's side of page §3: this checkout (with any uncommitted changes, as one extra commit
# made in a scratch clone, never here) as a git bundle; the board's side: `git clone` of it.
clone_checkout() {
  local scratch="$STATE/clone"
  git clone -q --no-hardlinks "$REPO" "$scratch"
  (cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
    | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$scratch"
  (cd "$REPO" && git ls-files -z --deleted) | (cd "$scratch" && xargs -0 -r rm -f --)
  local note="HEAD $(git -C "$REPO" rev-parse --short=12 HEAD)"
  if [ -n "$(git -C "$scratch" status --porcelain)" ]; then
    git -C "$scratch" add -A
    git -C "$scratch" -c user.name=board-smoke -c user.email=board-smoke@localhost \
      commit -q -m "board-smoke: uncommitted changes of the host checkout"
    note="$note + uncommitted changes (one scratch commit)"
  fi
  git -C "$scratch" bundle create -q "$STATE/kestrel-lab.bundle" --branches HEAD   # as page §3 says
  install -m 0644 "$STATE/kestrel-lab.bundle" "$BOARD_ROOT/home/$BOARD_USER/kestrel-lab.bundle"
  # A reused root keeps .venv (and numba's cache) from the last run; the code is cloned anew.
  as_user "cd ~ && if [ -d kestrel-lab/.venv ]; then mv kestrel-lab/.venv venv.keep; fi; rm -rf kestrel-lab && \
           git clone -q kestrel-lab.bundle kestrel-lab && if [ -d venv.keep ]; then mv venv.keep kestrel-lab/.venv; fi"
  echo "cloned $note"
}

LOGS=""
step "host packages" host_packages
step "binfmt qemu-aarch64" register_qemu
step "arm64 Debian 12 root" build_root
step "mount /proc /sys /dev" mount_root
step "apt-get (page §2)" page_packages
step "git clone (page §3)" clone_checkout

LOGS="$BOARD_ROOT/home/$BOARD_USER/board-smoke"
IN_RESULTS="/home/$BOARD_USER/board-smoke/results.tsv"
as_user "rm -rf ~/board-smoke && mkdir -p ~/board-smoke"
echo "board-smoke: inside the root (QEMU_CPU=$BOARD_CPU; logs in $LOGS) …"
set +e
as_user "cd ~/kestrel-lab && python3 scripts/board_smoke.py run --results $IN_RESULTS \
         --log-dir ~/board-smoke --out-dir ~/board-smoke/out --test-limit $BOARD_TEST_LIMIT_S \
         ${BOARD_ONLY:+--only $BOARD_ONLY}"
inner=$?
set -e
cat "$BOARD_ROOT$IN_RESULTS" >>"$RESULTS" 2>/dev/null || true
exit $inner
