#!/usr/bin/env bash
# Install swarmd as a systemd service: system user, virtualenv, unit file, example config.
# Run as root from a checkout (or an unpacked sdist): sudo packaging/install.sh
# Safe to run again to upgrade: it reinstalls the package and the unit, never the config.
set -euo pipefail

readonly DEFAULT_PREFIX=/opt/swarmd
readonly MIN_PYTHON=3.11

PKG_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC_DIR="$(dirname "$PKG_DIR")"
PREFIX="${PREFIX:-$DEFAULT_PREFIX}"
PYTHON="${PYTHON:-}"
ROOT=""
DRY_RUN=0
NO_VENV=0
TORCH="auto"
# The PyTorch wheel indexes for a CPU-only and a ROCm build; a CUDA build is PyPI's own on Linux x86_64.
readonly TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"
readonly TORCH_ROCM_INDEX="https://download.pytorch.org/whl/rocm6.2"

usage() {
    cat <<EOF
Usage: $(basename "$0") [--dry-run] [--root DIR] [--no-venv] [--prefix DIR] [--torch cpu|cuda|rocm]

Installs swarmd as a systemd service (run as root):
  - system user and group 'swarmd' (home /var/lib/swarmd, no login shell)
  - a virtualenv at PREFIX/venv with swarmd pip-installed into it
  - /etc/systemd/system/swarmd.service
  - /etc/swarmd/config.toml from config.example.toml, only if it does not exist yet

Options:
  --dry-run     print what would be done, change nothing
  --root DIR    install under DIR (like DESTDIR, for packagers); skips creating the user
                and groups and running systemctl
  --no-venv     do not create the virtualenv or pip-install swarmd
  --prefix DIR  install prefix (default: \$PREFIX or $DEFAULT_PREFIX)
  --torch KIND  which PyTorch build: cpu (small, no GPU), cuda (NVIDIA, several GB) or
                rocm (AMD); default: what this machine has (nvidia-smi or /dev/nvidia0: cuda;
                /dev/kfd: rocm; else cpu)
  -h, --help    show this help

Environment:
  PREFIX          install prefix, as --prefix (default $DEFAULT_PREFIX)
  PYTHON          interpreter for the virtualenv, Python >= $MIN_PYTHON (default: the first
                  of python3, python3.13, python3.12, python3.11 that is new enough)
  SWARMD_PACKAGE  what to pip-install instead of this source tree (a wheel, sdist or
                  requirement such as 'swarmd==0.1.0')
  TORCH_INDEX_URL the wheel index to take torch from, instead of --torch's (a mirror)
EOF
}

die() {
    echo "install.sh: error: $*" >&2
    exit 1
}

log() {
    echo "==> $*"
}

# Run a command, or only show it under --dry-run.
run() {
    if ((DRY_RUN)); then
        printf '[dry-run]'
        printf ' %q' "$@"
        printf '\n'
    else
        "$@"
    fi
}

parse_args() {
    while (($#)); do
        case "$1" in
            --dry-run) DRY_RUN=1 ;;
            --no-venv) NO_VENV=1 ;;
            --root)
                (($# >= 2)) || die "--root needs a directory"
                ROOT="$2"
                shift
                ;;
            --root=*) ROOT="${1#--root=}" ;;
            --prefix)
                (($# >= 2)) || die "--prefix needs a directory"
                PREFIX="$2"
                shift
                ;;
            --prefix=*) PREFIX="${1#--prefix=}" ;;
            --torch)
                (($# >= 2)) || die "--torch needs cpu, cuda or rocm"
                TORCH="$2"
                shift
                ;;
            --torch=*) TORCH="${1#--torch=}" ;;
            -h | --help)
                usage
                exit 0
                ;;
            *) die "unknown argument '$1' (see --help)" ;;
        esac
        shift
    done
    case "$TORCH" in
        auto | cpu | cuda | rocm) ;;
        *) die "--torch '$TORCH' is not one of cpu, cuda, rocm" ;;
    esac
    # The prefix ends up unquoted in the unit's ExecStart= line and in a sed expression.
    [[ "$PREFIX" =~ ^/[A-Za-z0-9._/+-]*$ ]] ||
        die "PREFIX '$PREFIX' must be an absolute path of letters, digits and ._/+- only"
    PREFIX="${PREFIX%/}"
    if [[ -n "$ROOT" ]]; then
        [[ -d "$ROOT" ]] || ((DRY_RUN)) || die "--root directory '$ROOT' does not exist"
        ROOT="$(cd "$ROOT" 2>/dev/null && pwd || echo "$ROOT")"
    fi
}

check_root() {
    # With --root a packager builds a tree as any user; --dry-run changes nothing.
    if [[ -z "$ROOT" ]] && ((!DRY_RUN)) && ((EUID != 0)); then
        die "run as root (e.g. sudo $0), or use --root DIR to install into a directory"
    fi
}

# An old distro's python3 may be 3.10 while python3.11 is installed beside it.
pick_python() {
    local candidate
    for candidate in python3 python3.13 python3.12 python3.11; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c "import sys; sys.exit(sys.version_info < (${MIN_PYTHON/./, }))" 2>/dev/null; then
            PYTHON="$candidate"
            return
        fi
    done
    PYTHON=python3 # not new enough or missing: check_python says which
}

check_python() {
    [[ -n "$PYTHON" ]] || pick_python
    command -v "$PYTHON" >/dev/null 2>&1 ||
        die "'$PYTHON' not found; install Python >= $MIN_PYTHON or set PYTHON=/path/to/python3.11"
    local version
    version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" ||
        die "'$PYTHON' does not run; install Python >= $MIN_PYTHON or set PYTHON=/path/to/python3.11"
    "$PYTHON" -c "import sys; sys.exit(sys.version_info < (${MIN_PYTHON/./, }))" ||
        die "swarmd needs Python >= $MIN_PYTHON, but '$PYTHON' is $version;" \
            "install a newer one and rerun with PYTHON=/path/to/python3.11"
    # Debian and Ubuntu ship the venv module separately.
    "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null ||
        die "'$PYTHON' ($version) lacks the venv module; install python3-venv (Debian/Ubuntu)"
    log "using $PYTHON (Python $version)"
}

ensure_group() {
    local group="$1"
    if getent group "$group" >/dev/null; then
        return
    fi
    log "creating system group $group"
    run groupadd --system "$group"
}

ensure_user() {
    # The unit's SupplementaryGroups= names video and render; systemd refuses to start the
    # service if either is missing, and minimal hosts (containers, servers) may lack render.
    ensure_group video
    ensure_group render
    if getent passwd swarmd >/dev/null; then
        log "system user swarmd exists"
        return
    fi
    local nologin
    nologin="$(command -v nologin || echo /usr/sbin/nologin)"
    log "creating system user swarmd"
    # No home is created here: the unit's StateDirectory= makes /var/lib/swarmd with the
    # right owner and mode at first start.
    run useradd --system --user-group --home-dir /var/lib/swarmd --no-create-home \
        --shell "$nologin" --comment "swarmd volunteer-computing daemon" swarmd
}

install_venv() {
    local venv="$ROOT$PREFIX/venv"
    local package="${SWARMD_PACKAGE:-$SRC_DIR}"
    check_python
    if [[ -x "$venv/bin/python" ]]; then
        log "reusing virtualenv $venv"
    else
        log "creating virtualenv $venv"
        run mkdir -p "$(dirname "$venv")"
        run "$PYTHON" -m venv "$venv"
    fi
    install_torch "$venv"
    log "installing swarmd from $package"
    # --upgrade so that rerunning the script upgrades an installed swarmd.
    run "$venv/bin/pip" install --disable-pip-version-check --upgrade "$package"
    # The command on PATH, so that 'swarmd status' works for the admin as the next steps say.
    run mkdir -p "$ROOT/usr/local/bin"
    run ln -sf "$PREFIX/venv/bin/swarmd" "$ROOT/usr/local/bin/swarmd"
}

# What this machine can run: an NVIDIA GPU (driver present), an AMD GPU (the ROCm kernel
# driver's device), else the CPU.
detect_torch() {
    if command -v nvidia-smi >/dev/null 2>&1 || [[ -e /dev/nvidia0 ]]; then
        echo cuda
    elif [[ -e /dev/kfd ]]; then
        echo rocm
    else
        echo cpu
    fi
}

# torch first, from the build's index, so that installing swarmd finds it satisfied instead of
# pulling PyPI's default (a multi-GB CUDA build on x86_64, whatever the machine has).
install_torch() {
    local venv="$1" kind="$TORCH" index
    [[ "$kind" != auto ]] || kind="$(detect_torch)"
    case "$kind" in
        cpu) index="$TORCH_CPU_INDEX" ;;
        rocm) index="$TORCH_ROCM_INDEX" ;;
        cuda) index="" ;;
    esac
    index="${TORCH_INDEX_URL:-$index}"
    log "installing torch ($kind build${index:+, from $index})"
    if [[ -n "$index" ]]; then
        run "$venv/bin/pip" install --disable-pip-version-check --upgrade torch --index-url "$index" \
            --extra-index-url https://pypi.org/simple
    else
        run "$venv/bin/pip" install --disable-pip-version-check --upgrade torch
    fi
}

install_unit() {
    local src="$PKG_DIR/swarmd.service"
    local dest="$ROOT/etc/systemd/system/swarmd.service"
    local exec_path="$PREFIX/venv/bin/swarmd"
    [[ -f "$src" ]] || die "unit file $src is missing"
    log "installing $dest (ExecStart=$exec_path)"
    if ((DRY_RUN)); then
        run install -D -m 0644 "$src" "$dest"
        return
    fi
    local tmp
    tmp="$(mktemp)"
    # The unit is written for the default prefix; only ExecStart= depends on PREFIX.
    sed "s#^ExecStart=$DEFAULT_PREFIX/venv/bin/swarmd #ExecStart=$exec_path #" "$src" >"$tmp"
    grep -q "^ExecStart=$exec_path " "$tmp" || {
        rm -f "$tmp"
        die "could not set ExecStart= in $src (does it still start with $DEFAULT_PREFIX?)"
    }
    install -D -m 0644 "$tmp" "$dest"
    rm -f "$tmp"
}

install_config() {
    local src="$PKG_DIR/config.example.toml"
    local dest="$ROOT/etc/swarmd/config.toml"
    [[ -f "$src" ]] || die "example config $src is missing"
    if [[ -e "$dest" ]]; then
        log "keeping existing $dest"
        return
    fi
    log "installing $dest"
    run install -D -m 0644 "$src" "$dest"
}

reload_systemd() {
    # /run/systemd/system exists only when systemd is PID 1 (sd_booted(3)); in a chroot or
    # container without systemd, systemctl would fail.
    if [[ ! -d /run/systemd/system ]]; then
        log "systemd is not running here; skipping systemctl daemon-reload"
        return
    fi
    run systemctl daemon-reload
    if systemctl is-active --quiet swarmd 2>/dev/null; then
        log "swarmd is running the old version; restart it with: systemctl restart swarmd"
    fi
}

next_steps() {
    local done="swarmd is installed."
    ((DRY_RUN)) && done="Dry run finished; nothing was changed."
    cat <<EOF

$done Next steps:
  1. Set run_id (and initial_peers, if the run's organiser gave any) in $ROOT/etc/swarmd/config.toml
  2. Start it now and at every boot:  systemctl enable --now swarmd
  3. Check on it:                      sudo swarmd status   (logs: journalctl -u swarmd -f)
EOF
}

main() {
    parse_args "$@"
    check_root
    ((DRY_RUN)) && log "dry run: nothing will be changed"
    [[ -n "$ROOT" ]] && log "installing under $ROOT"
    if [[ -z "$ROOT" ]]; then
        ensure_user
    fi
    if ((NO_VENV)); then
        log "skipping the virtualenv (--no-venv)"
    else
        install_venv
    fi
    install_unit
    install_config
    if [[ -z "$ROOT" ]]; then
        reload_systemd
    fi
    next_steps
}

main "$@"
