#!/usr/bin/env bash
# Build a local Debian bookworm base image (python3 + venv) for the Dockerfile's BASE_IMAGE, for machines
# whose Docker cannot pull python:3.11-slim from a registry but can reach a Debian mirror.
#
#   scripts/container-base.sh [TAG]      (default TAG: keda-gpu-scaler-base:bookworm)
#
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian); EXTRA_CA_DIR (default
# /usr/local/share/ca-certificates, Debian's place for locally added CAs). Needs root (debootstrap
# chroots) and a running Docker engine. Skips the work when TAG already exists with the same recipe.
#
# The image also trusts the machine's locally added CAs, as a company's base image trusts the company's
# TLS-inspecting proxy: where PyPI is reached through such a proxy, pip in the build stage needs them.
# It is an image for building and testing on this machine, not one to publish.
set -euo pipefail

TAG="${1:-keda-gpu-scaler-base:bookworm}"
SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# python3-venv brings ensurepip's wheels, so `python3 -m venv` gives a venv with pip; ca-certificates
# lets that pip reach PyPI over HTTPS in the build stage. Bookworm's python3 is 3.11, as the package needs.
PACKAGES=python3,python3-venv,ca-certificates
EXTRA_CA_DIR="${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}"
extra_cas=()
if [ -d "$EXTRA_CA_DIR" ]; then
  mapfile -t extra_cas < <(find "$EXTRA_CA_DIR" -maxdepth 1 -type f -name '*.crt' | sort)
fi
ca_digest=none
if [ "${#extra_cas[@]}" -gt 0 ]; then
  ca_digest="$(cat "${extra_cas[@]}" | sha256sum | cut -c1-16)"
fi
# The recipe is stored as a label: a changed package list, suite or set of local CAs rebuilds the image.
RECIPE="debootstrap --variant=minbase --include=$PACKAGES $SUITE, without manuals and translations, local CAs $ca_digest"
LABEL=io.github.keda-gpu-scaler.base-recipe

existing="$(docker image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$TAG" 2>/dev/null || true)"
if [ "$existing" = "$RECIPE" ]; then
  echo "base image $TAG is cached ($RECIPE)"
  exit 0
fi
# An outdated image of the same tag is removed once the new one replaces it, not left dangling.
previous="$(docker image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)"

if [ "$(id -u)" != 0 ]; then
  echo "building $TAG needs root (debootstrap creates device nodes and chroots)" >&2
  exit 1
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  echo "installing debootstrap (Debian package)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

workdir="$(mktemp -d /var/tmp/keda-gpu-scaler-base.XXXXXX)"
rootfs="$workdir/rootfs"
log="$workdir/debootstrap.log"
# debootstrap may leave /proc or /sys mounted inside the tree when it fails half-way: unmount those
# before deleting, so rm never walks into the host's /proc.
cleanup() {
  for mount in proc sys dev/pts; do
    if mountpoint -q "$rootfs/$mount" 2>/dev/null; then umount -l "$rootfs/$mount" || true; fi
  done
  rm -rf --one-file-system "$workdir"
}
trap cleanup EXIT

echo "debootstrap $SUITE from $MIRROR into $rootfs ($PACKAGES)"
if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$MIRROR" >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  exit 1
fi

# Downloaded .debs and package lists are only needed to install, and manuals and translations are never
# read in a container: about 60 MB the image does not carry. The packages' copyright files stay.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log \
  "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/*
find "$rootfs/usr/share/doc" -type f ! -name copyright -delete

if [ "${#extra_cas[@]}" -gt 0 ]; then
  echo "adding ${#extra_cas[@]} locally added CA certificate(s) from $EXTRA_CA_DIR"
  cp "${extra_cas[@]}" "$rootfs/usr/local/share/ca-certificates/"
  chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
fi

# docker import takes the tree as it is; --change gives it the little config a base image carries.
tar --numeric-owner -C "$rootfs" -c . | docker import \
  --change "LABEL $LABEL=\"$RECIPE\"" \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  - "$TAG" >/dev/null
echo "built base image $TAG ($(docker image inspect --format '{{.Size}}' "$TAG" | numfmt --to=iec-i --suffix=B))"
if [ -n "$previous" ]; then
  docker rmi "$previous" >/dev/null 2>&1 || echo "note: the previous $TAG ($previous) is still in use and was kept"
fi
