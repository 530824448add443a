#!/usr/bin/env bash
#! Installs what Kiln's wgpu backend needs to find a Vulkan adapter (idempotent).
#
# - When no Vulkan loader or no lavapipe/other ICD is present, installs `mesa-vulkan-drivers` and
#   `libvulkan1` with apt-get (running `apt-get update` only when the install needs it).
# - Prints an `export XDG_RUNTIME_DIR=...` line for a 0700 directory (Mesa complains without one).
#   Use it as: eval "$(scripts/install-gpu-deps.sh)"  (all other output goes to stderr).
set -euo pipefail

log() { echo "install-gpu-deps: $*" >&2; }

have_loader() {
    ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' && return 0
    for d in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib; do
        [ -e "$d/libvulkan.so.1" ] && return 0
    done
    return 1
}

have_icd() {
    for d in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
        compgen -G "$d/*.json" >/dev/null 2>&1 && return 0
    done
    return 1
}

if have_loader && have_icd; then
    log "Vulkan loader and an ICD are present; nothing to install"
else
    if ! command -v apt-get >/dev/null 2>&1; then
        log "no Vulkan driver found and no apt-get to install one; install mesa-vulkan-drivers and libvulkan1 by hand"
        exit 1
    fi
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
            log "need root (or sudo) to install mesa-vulkan-drivers libvulkan1"
            exit 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    # Try without refreshing the package lists first; update only if the install fails.
    if ! $SUDO apt-get install -y --no-install-recommends mesa-vulkan-drivers libvulkan1 >&2; then
        log "running apt-get update"
        $SUDO apt-get update >&2
        $SUDO apt-get install -y --no-install-recommends mesa-vulkan-drivers libvulkan1 >&2
    fi
    have_icd || { log "installed, but still no Vulkan ICD found"; exit 1; }
    log "installed mesa-vulkan-drivers libvulkan1"
fi

# A private runtime directory for Mesa (it wants one with mode 0700).
dir="${XDG_RUNTIME_DIR:-}"
if [ -z "$dir" ] || [ ! -d "$dir" ] || [ "$(stat -c %a "$dir" 2>/dev/null)" != "700" ] || [ ! -O "$dir" ]; then
    dir="/tmp/kiln-xdg-runtime-$(id -u)"
    mkdir -p "$dir"
    chmod 0700 "$dir"
fi
echo "export XDG_RUNTIME_DIR=$dir"
