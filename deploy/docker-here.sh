#!/usr/bin/env bash
# Docker on a machine that reaches Debian's and PyPI's package archives but no container registry (this
# project's development and CI machines). Idempotent; every step says what it does.
#
#   deploy/docker-here.sh install   # Debian's docker.io engine + CLI, docker-compose 1.29, mmdebstrap, and
#                                   # the Compose v2 CLI plugin (the literal `docker compose`) taken from
#                                   # Debian 13's docker-compose package (a static Go binary)
#   deploy/docker-here.sh base      # image capc-base:bookworm (Python 3.11 + venv) from Debian packages
#   deploy/docker-here.sh wheels    # deploy/wheels/: torch (CPU) + every runtime dependency, for an offline
#                                   # image build, resolved by this machine's pip configuration
#
# Starting the engine is left to the caller (root): `dockerd --iptables=false >/tmp/dockerd.log 2>&1 &`; the
# container tests (tests/deploy) start and stop one themselves when none is running.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
BASE_TAG=${CAPC_BASE_TAG:-capc-base:bookworm}
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
# The torch pin of scripts/bootstrap.sh and deploy/Dockerfile (tests/services/test_compose.py checks all three).
TORCH_VERSION=2.13.0

say() { echo "==> $*" >&2; }
die() { echo "error: $*" >&2; exit 2; }

need_root_apt() {
  [ "$(id -u)" = 0 ] || die "installing packages needs root (run as root, or install docker.io yourself)"
  command -v apt-get >/dev/null 2>&1 || die "no apt-get here: install a Docker engine and Compose v2 yourself"
}

# The machine's own Debian mirror (from its apt sources), so no host name is hard-coded here.
debian_mirror() {
  local mirror=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    mirror=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list)
  fi
  [ -n "$mirror" ] || die "cannot find this machine's Debian mirror in /etc/apt/sources*"
  echo "$mirror"
}

# Debian 12 packages Compose only as docker-compose 1.29 (Python, `docker-compose`); Debian 13's
# docker-compose package is Compose v2, a static binary whose only dependency is libc6 >= 2.34 (Debian 12 has
# 2.36). Its plugin is extracted, not installed as a package, so it does not replace docker-compose 1.29.
install_compose_plugin() {
  if docker compose version >/dev/null 2>&1; then
    say "Compose v2 plugin present: $(docker compose version)"
    return
  fi
  local state=/var/cache/capc-docker-here/apt tmp
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial"
  echo "deb $(debian_mirror) trixie main" >"$state/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$state/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache")
  say "fetching Compose v2 from Debian 13's docker-compose package"
  apt-get "${opts[@]}" update -qq
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get "${opts[@]}" download -qq docker-compose 2>/dev/null)
  dpkg-deb -x "$tmp"/docker-compose_*.deb "$tmp/root"
  mkdir -p "$PLUGIN_DIR"
  install -m 755 "$tmp/root/usr/libexec/docker/cli-plugins/docker-compose" "$PLUGIN_DIR/docker-compose"
  rm -rf "$tmp"
  say "installed $PLUGIN_DIR/docker-compose: $(docker compose version)"
}

cmd_install() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
  command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
  if [ ${#missing[@]} -gt 0 ]; then
    need_root_apt
    # An install killed half-way (a machine stopped mid-run) leaves dpkg "interrupted", and every later
    # apt-get refuses until it is finished; finishing it is a no-op when nothing is pending.
    DEBIAN_FRONTEND=noninteractive dpkg --configure -a
    say "installing ${missing[*]} (Debian packages)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  if ! docker compose version >/dev/null 2>&1; then
    need_root_apt
    install_compose_plugin
  fi
  say "docker: $(docker --version); compose: $(docker compose version 2>/dev/null || docker-compose version --short)"
}

cmd_base() {
  if docker image inspect "$BASE_TAG" >/dev/null 2>&1; then
    say "base image $BASE_TAG present"
    return
  fi
  command -v mmdebstrap >/dev/null 2>&1 || die "mmdebstrap is missing: deploy/docker-here.sh install"
  local tar
  tar=$(mktemp --suffix=.tar)
  say "building $BASE_TAG from Debian 12 packages (python3, python3-venv, ca-certificates)"
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$tar"
  docker import "$tar" "$BASE_TAG" >/dev/null
  rm -f "$tar"
  say "base image $BASE_TAG: $(docker image inspect -f '{{.Size}}' "$BASE_TAG") bytes"
}

cmd_wheels() {
  local dir="$REPO/deploy/wheels" python=${PYTHON:-$REPO/.venv/bin/python}
  if compgen -G "$dir/torch-$TORCH_VERSION*.whl" >/dev/null; then
    say "wheelhouse $dir present"
    return
  fi
  [ -x "$python" ] || python=python3
  local requirements
  requirements=$(mktemp)
  "$python" -c "import tomllib, sys; print('\n'.join(tomllib.load(open(sys.argv[1], 'rb'))['project']['dependencies']))" \
    "$REPO/pyproject.toml" >"$requirements"
  # Only where the CPU build of torch is on local disk (pip's find-links, as on this project's machines):
  # elsewhere PyPI's torch is the multi-GB CUDA build, and the Dockerfile fetches the CPU build itself.
  if ! "$python" -m pip download -q --no-index --no-deps -d "$dir" "torch==$TORCH_VERSION" >/dev/null 2>&1 ||
    ! compgen -G "$dir/torch-$TORCH_VERSION+cpu*.whl" >/dev/null; then
    rm -f "$dir"/torch-*.whl "$requirements"
    say "no local CPU wheel of torch==$TORCH_VERSION: no wheelhouse (the image build downloads torch itself)"
    return
  fi
  say "downloading the runtime dependencies of diet-capc into $dir"
  "$python" -m pip download -q --only-binary=:all: --find-links "$dir" -d "$dir" "torch==$TORCH_VERSION" \
    "setuptools>=77" wheel -r "$requirements" 2>&1 | grep -v "is ignored" || true
  rm -f "$requirements"
}

case "${1:-}" in
  install) cmd_install ;;
  base) cmd_base ;;
  wheels) cmd_wheels ;;
  *) echo "usage: $0 install|base|wheels" >&2; exit 2 ;;
esac
