#!/usr/bin/env bash
# Prepares this host to run codemode's sandboxes, idempotently, as root on Debian:
#   1. Docker Engine from the distribution, started without systemd in a
#      session of its own (signals meant for the caller never reach it),
#      runsc registered;
#      redis-server for the tests (not started: they start their own);
#   2. gVisor's runsc, built static from source through the Go module proxy
#      and the host's huge pages set so that gVisor backs sandboxes with them
#      (CODEMODE_HOST_HUGEPAGES=0 leaves them alone);
#   3. the sandbox image (agent/host/sandbox-packages: python with numpy,
#      pandas, matplotlib, requests; node; curl, git, jq, ...), built locally
#      with debootstrap from this machine's own apt mirror, with
#      agent/host/pyarena.c compiled into it.
# Every step is skipped when its result is already there. Safe to run after an
# unclean stop: stale pid files and a dead containerd are cleared first.
set -euo pipefail

IMAGE="${DOCKER_IMAGE_NAME:-codemode-sandbox:bookworm}"
PACKAGES_FILE="$(dirname "$0")/sandbox-packages"
PYARENA_SRC="$(dirname "$0")/pyarena.c"
RUNSC_VERSION="${RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}"
STATE_DIR="${CODEMODE_STATE_DIR:-/var/lib/codemode}"
DOCKERD_LOG="$STATE_DIR/dockerd.log"

log() { printf 'setup: %s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }
mkdir -p "$STATE_DIR"

apt_updated=
apt_install() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ -z "$apt_updated" ]; then
    log "apt-get update"
    apt-get update -qq
    apt_updated=1
  fi
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# --- 1. packages -----------------------------------------------------------
# systemd: for systemd-analyze, which checks the agent's unit in the tests.
apt_install docker.io debootstrap ca-certificates iproute2 wabt systemd
# redis-server: the tests and make up-cluster start their own on a loopback
# port; prometheus: for promtool, which checks deploy/prometheus in the tests.
# Neither package may start the system's service. Where no policy-rc.d says so
# already, one answering 101 ("not allowed") keeps invoke-rc.d from starting it.
for pkg in redis-server prometheus; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' && continue
  policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d
    policy=1
  fi
  apt_install "$pkg"
  [ -z "$policy" ] || rm -f /usr/sbin/policy-rc.d
done

# --- 2. runsc ----------------------------------------------------------------
runsc_ok() {
  [ -x /usr/local/bin/runsc ] && /usr/local/bin/runsc --version >/dev/null 2>&1 &&
    ! LC_ALL=C file -b /usr/local/bin/runsc 2>/dev/null | grep -q 'dynamically linked'
}
if ! runsc_ok; then
  log "building runsc $RUNSC_VERSION (static; a few minutes on first run)"
  gobin=$(mktemp -d)
  CGO_ENABLED=0 GOBIN="$gobin" go install "gvisor.dev/gvisor/runsc@$RUNSC_VERSION"
  install -m 0755 "$gobin/runsc" /usr/local/bin/runsc
  rm -rf "$gobin"
fi

# --- 2b. huge pages for sandbox memory ---------------------------------------
# gVisor breaks copy-on-write 2 MiB at a time, which a process forked from the
# preloaded parent pays at every first write to one; backed by huge pages the
# copies cost less (a forked matplotlib run: agent/internal/runner/RATIONALE.md).
# runsc's loader gives a sandbox huge pages where the host lets shared memory
# have them: shmem_enabled always, within_size or force, or advise with a defrag
# of always, defer or never. Under advise gVisor commits memory by writing to
# it, and a write past the container's limit makes the host's OOM killer take
# the whole sandbox; under within_size it commits by fallocate(2), which fails
# instead, and gVisor kills only the process (the runner's memory watchdog
# relies on that when a fast allocator gets past it). So never and advise
# become within_size (which still honours madvise(2) as advise does: only
# memfds, shared anonymous and System V memory are concerned, not tmpfs); the
# others are an operator's choice and stay. CODEMODE_HOST_HUGEPAGES=0 leaves
# the host alone. With CODEMODE_INSTALL_AGENT=1 (step 5) the setting lasts
# across reboots.
THP=/sys/kernel/mm/transparent_hugepage
thp() { { grep -o '\[[a-z_+]*\]' "$THP/$1" || true; } | tr -d '[]'; }
if [ "${CODEMODE_HOST_HUGEPAGES:-1}" = 1 ] && [ -w "$THP/shmem_enabled" ]; then
  shmem=$(thp shmem_enabled)
  case "$shmem" in
    never | advise)
      log "huge pages for sandbox memory: shmem_enabled within_size (was $shmem)"
      echo within_size >"$THP/shmem_enabled"
      ;;
  esac
fi

# --- 3. dockerd --------------------------------------------------------------
mkdir -p /etc/docker
want_daemon_json='{"runtimes": {"runsc": {"path": "/usr/local/bin/runsc"}}, "bridge": "none", "iptables": false}'
daemon_changed=
if [ ! -f /etc/docker/daemon.json ] || [ "$(cat /etc/docker/daemon.json)" != "$want_daemon_json" ]; then
  printf '%s\n' "$want_daemon_json" >/etc/docker/daemon.json
  daemon_changed=1
fi

docker_up() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if docker_up; then
  if [ -n "$daemon_changed" ] || ! docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q runsc; then
    log "reloading dockerd configuration"
    kill -HUP "$(cat /var/run/docker.pid)"
    for _ in $(seq 1 50); do
      docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q runsc && break
      sleep 0.1
    done
  fi
else
  log "starting dockerd"
  # A previous run may have been killed: clear what would stop a new start.
  for pidfile in /var/run/docker.pid /run/docker/containerd/containerd.pid /run/containerd/containerd.pid; do
    if [ -f "$pidfile" ]; then
      pid=$(cat "$pidfile" 2>/dev/null || true)
      if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null || true; sleep 1; kill -9 "$pid" 2>/dev/null || true; fi
      rm -f "$pidfile"
    fi
  done
  pkill -x dockerd 2>/dev/null || true
  pkill -x containerd 2>/dev/null || true
  rm -f /var/run/docker.sock
  # dockerd gets a session of its own: Ctrl-C on `make up` or `make test`
  # signals the whole foreground process group, and a daemon in that group
  # would die with it while the agent still has sandboxes to remove. With
  # no controlling terminal it gets no hang-up from one either.
  setsid -f dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null
  for _ in $(seq 1 300); do
    docker_up && break
    sleep 0.2
  done
  docker_up || { log "dockerd did not come up; see $DOCKERD_LOG"; tail -20 "$DOCKERD_LOG" >&2; exit 1; }
fi
docker info --format '{{json .Runtimes}}' | grep -q runsc || { log "dockerd has no runsc runtime"; exit 1; }

# --- 4. sandbox image --------------------------------------------------------
# The built image is tagged with a digest of its package list and of this
# build step, and $IMAGE points at it: a changed list builds a new image, an
# unchanged one is kept.
packages=$(grep -vE '^\s*(#|$)' "$PACKAGES_FILE" | tr -s ' \n' ' ')
build_digest=$(printf '%s\n%s\n%s\n' "$packages" "$(sed -n '/^# --- 4. sandbox image/,/^# --- end of 4/p' "$0")" "$(cat "$PYARENA_SRC")" | sha256sum | cut -c1-12)
case "$IMAGE" in
codemode-sandbox:*)
  built="${IMAGE%%:*}:${IMAGE#*:}-$build_digest"
  if ! docker image inspect "$built" >/dev/null 2>&1; then
    # The mirror comes from this machine's own apt configuration.
    mirror=$(
      { grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
        grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '{print $2}'
      } | grep -v -- '-security' | grep -E '/debian/?$' | head -1
    ) || true # a missing sources file must not end the script under pipefail
    [ -n "$mirror" ] || { log "no Debian mirror found in /etc/apt sources"; exit 1; }
    root=$(mktemp -d "$STATE_DIR/rootfs.XXXXXX")
    log "building sandbox image $built with debootstrap (several minutes on first run)"
    debootstrap --variant=minbase --include="$(echo $packages | tr ' ' ',')" bookworm "$root" "$mirror" >"$STATE_DIR/debootstrap.log" 2>&1 ||
      { log "debootstrap failed; see $STATE_DIR/debootstrap.log"; tail -20 "$STATE_DIR/debootstrap.log" >&2; rm -rf "$root"; exit 1; }
    # Keep the image small: no package caches, docs or translations are
    # needed to run code, nor the Boost headers that come with scipy's
    # pythran (see sandbox-packages).
    chroot "$root" dpkg --purge --force-depends libboost-dev libboost1.74-dev >>"$STATE_DIR/debootstrap.log" 2>&1 || true
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/locale
    # Debian's sitecustomize looks for apport, which is not installed: the
    # failed import walks sys.path at every interpreter start (~6 ms under gVisor).
    rm -f "$root"/etc/python3*/sitecustomize.py
    # Empty sitecustomize and usercustomize modules in the standard library
    # (compiled: the image is read-only) end the search for them there,
    # instead of listing dist-packages (~90 entries) at every start (~1.4 ms
    # under gVisor). A usercustomize in the user's site directory would be
    # shadowed; PYTHONPATH still comes first.
    # Written inside the chroot: Debian's sitecustomize.py there is a link
    # to /etc, which from outside would name the host's file.
    chroot "$root" sh -c 'for d in /usr/lib/python3.[0-9]*; do
        for m in sitecustomize usercustomize; do
          rm -f "$d/$m.py" && printf "# codemode: nothing to customize (see agent/host/setup.sh)\n" >"$d/$m.py" || exit 1
        done
      done
      python3 -m py_compile /usr/lib/python3.[0-9]*/sitecustomize.py /usr/lib/python3.[0-9]*/usercustomize.py' >>"$STATE_DIR/debootstrap.log" 2>&1 ||
      { log "writing the empty customize modules failed; see $STATE_DIR/debootstrap.log"; rm -rf "$root"; exit 1; }
    # So do .pth files, run by every interpreter start: setuptools' distutils
    # shim (only pip builds want it) and matplotlib's namespace-package
    # shim for mpl_toolkits (Python 3 finds namespace packages itself).
    # Together they cost ~25 ms per start under gVisor.
    rm -f "$root"/usr/lib/python3/dist-packages/distutils-precedence.pth "$root"/usr/lib/python3/dist-packages/matplotlib-*-nspkg.pth
    # Debian's mpl_toolkits/__init__.py declares the namespace through
    # pkg_resources, whose import scans every installed distribution, and
    # matplotlib.pyplot imports mpl_toolkits.mplot3d: ~300 ms of each
    # plotting run under gVisor (2.0 s against 1.7 s). Without it
    # mpl_toolkits is a namespace package Python finds itself.
    rm -f "$root"/usr/lib/python3/dist-packages/mpl_toolkits/__init__.py "$root"/usr/lib/python3/dist-packages/mpl_toolkits/__pycache__/__init__.*
    # pymalloc's arenas from glibc's heap, for the preloaded Python parent
    # (pyarena.c says why; the languages table's ParentEnv loads it):
    # built with the image's own compiler, and checked to load.
    mkdir -p "$root/usr/lib/codemode" && cp "$PYARENA_SRC" "$root/tmp/pyarena.c" &&
      chroot "$root" gcc -O2 -Wall -Wextra -Werror -shared -fPIC -o /usr/lib/codemode/pyarena.so /tmp/pyarena.c >>"$STATE_DIR/debootstrap.log" 2>&1 &&
      rm -f "$root/tmp/pyarena.c" && chmod 0755 "$root/usr/lib/codemode" && chmod 0644 "$root/usr/lib/codemode/pyarena.so" &&
      chroot "$root" env LD_PRELOAD=/usr/lib/codemode/pyarena.so python3 -c 'import json; json.loads(json.dumps([{"k": i} for i in range(200000)]))' >>"$STATE_DIR/debootstrap.log" 2>&1 ||
      { log "building /usr/lib/codemode/pyarena.so failed; see $STATE_DIR/debootstrap.log"; rm -rf "$root"; exit 1; }
    # The image must keep its contract (docs/sandbox.md): check the modules import.
    # The import also writes matplotlib's font list, which the image keeps
    # in /usr/share/codemode/matplotlib: the runner copies it into each
    # sandbox's MPLCONFIGDIR at every reset, so that a plotting run does not
    # search the fonts again (~330 ms under gVisor).
    chroot "$root" env MPLBACKEND=Agg MPLCONFIGDIR=/usr/share/codemode/matplotlib python3 -c 'import requests, numpy, pandas, scipy, matplotlib.pyplot, mpl_toolkits.mplot3d' >>"$STATE_DIR/debootstrap.log" 2>&1 ||
      { log "the new image fails its contract (python modules); see $STATE_DIR/debootstrap.log"; rm -rf "$root"; exit 1; }
    find "$root/usr/share/codemode/matplotlib" -mindepth 1 ! -name 'fontlist-v*.json' -exec rm -rf {} + &&
      chmod 0755 "$root/usr/share/codemode" "$root/usr/share/codemode/matplotlib" &&
      chmod 0644 "$root"/usr/share/codemode/matplotlib/fontlist-v*.json ||
      { log "the new image has no matplotlib font list"; rm -rf "$root"; exit 1; }
    # ... and that the programs of that contract and of the agent's
    # language table are there.
    for prog in python python3 pip curl git jq bc file less ps sqlite3 zip unzip xz node bash gcc g++ ruby perl php lua5.4; do
      chroot "$root" /bin/sh -c "command -v $prog" >/dev/null ||
        { log "the new image fails its contract: no $prog"; rm -rf "$root"; exit 1; }
    done
    tar -C "$root" -c . | docker import \
      -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 MPLBACKEND=Agg' \
      -c "LABEL org.codemode.packages=\"$packages\"" - "$built" >/dev/null
    rm -rf "$root"
  fi
  docker tag "$built" "$IMAGE"
  ;;
*)
  if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "image $IMAGE is not present locally; pulling it"
    docker pull "$IMAGE" || { log "pull of $IMAGE failed; with no registry, unset DOCKER_IMAGE_NAME to build codemode-sandbox:bookworm locally"; exit 1; }
  fi
  ;;
esac
# --- end of 4 -----------------------------------------------------------------
# Earlier builds are no longer needed (one still in use stays).
case "$IMAGE" in
codemode-sandbox:*)
  docker images --format '{{.Repository}}:{{.Tag}}' "${IMAGE%%:*}" | grep -F "$IMAGE-" | grep -vxF "$built" |
    xargs -r docker rmi >/dev/null 2>&1 || true
  ;;
esac
log "ready: dockerd $(docker version --format '{{.Server.Version}}'), runsc at /usr/local/bin/runsc (built from $RUNSC_VERSION), image $IMAGE"

# --- 5. the agent as a systemd service (only when asked) -----------------------
# CODEMODE_INSTALL_AGENT=1 with CODEMODE_AGENT_BIN and CODEMODE_RUNNER_BIN (the
# binaries of a release archive, `make dist`) installs them, the unit
# codemode-agent.service and, if missing, /etc/codemode/agent.env; with systemd
# running it enables and starts the unit. Where dockerd runs under systemd, the
# unit's Requires=docker.service orders the agent after it.
if [ "${CODEMODE_INSTALL_AGENT:-}" = 1 ]; then
  : "${CODEMODE_AGENT_BIN:?set CODEMODE_AGENT_BIN to the agent binary to install}"
  : "${CODEMODE_RUNNER_BIN:?set CODEMODE_RUNNER_BIN to the runner binary to install}"
  install -D -m 0755 "$CODEMODE_AGENT_BIN" /usr/local/bin/codemode-agent
  install -D -m 0755 "$CODEMODE_RUNNER_BIN" /usr/local/lib/codemode/runner
  install -D -m 0644 "$(dirname "$0")/codemode-agent.service" /etc/systemd/system/codemode-agent.service
  if [ "${CODEMODE_HOST_HUGEPAGES:-1}" = 1 ]; then
    # The setting step 2b left, applied again at every boot by systemd-tmpfiles.
    [ -r "$THP/shmem_enabled" ] && install -D -m 0644 /dev/stdin /etc/tmpfiles.d/codemode-hugepages.conf <<CONF
# codemode: huge pages for gVisor's sandbox memory (agent/host/setup.sh, step 2b).
w $THP/shmem_enabled - - - - $(thp shmem_enabled)
CONF
  fi
  if [ ! -e /etc/codemode/agent.env ]; then
    install -d -m 0755 /etc/codemode
    install -m 0600 /dev/null /etc/codemode/agent.env
    printf '# Settings of codemode-agent.service: VARIABLE=value lines (agent --help names them).\n' >/etc/codemode/agent.env
  fi
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable --now codemode-agent.service
    log "codemode-agent.service enabled and started"
  else
    log "installed codemode-agent.service; systemd is not running here, so it is not started"
  fi
fi
