#!/usr/bin/env bash
#! Installs what `kiln-dist`'s `mpi` feature needs to build and run (idempotent).
#
# - Open MPI (`openmpi-bin`: `mpirun`; `libopenmpi-dev`: headers and `mpicc`, which rsmpi's build
#   script asks for the flags) and what rsmpi's bindgen needs (`clang`, `libclang-dev`), with
#   apt-get, running `apt-get update` only when the install needs it.
# - Does nothing when `mpirun`, `mpicc` and libclang are already present.
set -euo pipefail

log() { echo "install-mpi-deps: $*" >&2; }

have_libclang() {
    ldconfig -p 2>/dev/null | grep -q 'libclang.*\.so' && return 0
    compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null 2>&1
}

if command -v mpirun >/dev/null 2>&1 && command -v mpicc >/dev/null 2>&1 && have_libclang; then
    log "mpirun, mpicc and libclang are present; nothing to install"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    log "Open MPI or libclang is missing and there is no apt-get; install openmpi-bin libopenmpi-dev clang libclang-dev by hand"
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        log "need root (or sudo) to install openmpi-bin libopenmpi-dev clang libclang-dev"
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
packages=(openmpi-bin libopenmpi-dev clang libclang-dev)
# Try without refreshing the package lists first; update only if the install fails.
if ! $SUDO apt-get install -y --no-install-recommends "${packages[@]}" >&2; then
    log "running apt-get update"
    $SUDO apt-get update >&2
    $SUDO apt-get install -y --no-install-recommends "${packages[@]}" >&2
fi
command -v mpirun >/dev/null 2>&1 || { log "installed, but mpirun is still not on PATH"; exit 1; }
log "installed ${packages[*]}"
