"""How a sandbox is isolated: the command line that starts its worker under bubblewrap, under
`unshare`, or (only when a config asks for it in so many words) under no isolation at all.

Bubblewrap gives the worker new PID, network, IPC, UTS and mount namespaces: a file system
that holds only the system's read-only folders, the Python installation, a size-capped private
`/tmp` and whatever read-only paths the caller names (never the run folder or the home folder
as a whole), an empty environment, and no way back to the terminal. Started by root, it keeps
only the capabilities the worker needs to hand each program its own unprivileged user id
(the per-user process limit does not apply to root); started by anyone else, it adds a user
namespace. `unshare` gives the same namespaces but leaves the file system as it is.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

ISOLATIONS = ("auto", "bubblewrap", "unshare", "none")
WORKER_FILE = Path(__file__).with_name("worker.py")
# agentenv_jax's own folder, readable in the sandbox: the worker, the built-in tools, and the
# package for a user's tool that imports it (an editable install's source is not under the
# Python folders).
PACKAGE_FOLDER = Path(__file__).resolve().parents[2]
# Where the sandbox's private folder is, inside the sandbox (bubblewrap mounts a tmpfs there).
SANDBOX_TMP = "/tmp"
# System folders a program may read. Merged-/usr systems have /bin, /lib, ... as links.
_SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
# The few files of /etc that programs read; /etc as a whole (with /etc/shadow) stays out.
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/ssl/certs",
)
# The first uid handed to programs when the sandbox starts as root; each worker of each
# process on a host gets its own, so the per-user process limit counts one program's processes.
_FIRST_CHILD_UID = 2**31
_WORKERS_PER_PROCESS = 512


def child_uid(slot: int, pid: int | None = None) -> int:
    """The unprivileged user id that worker `slot` of process `pid` (this one by default)
    runs programs as when the sandbox starts as root."""
    pid = os.getpid() if pid is None else pid
    return _FIRST_CHILD_UID + (pid % (2**22 - 1)) * _WORKERS_PER_PROCESS + slot


def python_paths() -> list[str]:
    """The folders this interpreter and its packages live in: what a sandboxed Python needs
    to read."""
    return [sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent.parent)]


def _within(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or inside it."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _outermost(paths: Sequence[str]) -> list[str]:
    """`paths` without those inside another one (or inside a system folder)."""
    chosen: list[str] = []
    for path in sorted({str(Path(p)) for p in paths}, key=len):
        if not any(_within(path, c) for c in chosen):
            chosen.append(path)
    return [p for p in chosen if not any(_within(p, s) and p != s for s in _SYSTEM_FOLDERS)]


def bubblewrap_command(
    worker_settings: str,
    read_only: Sequence[str],
    tmp_bytes: int,
    as_root: bool,
) -> list[str]:
    """The bwrap argv that starts the worker (`worker_settings`: its JSON argument) with
    `read_only` paths visible and a `tmp_bytes` tmpfs as its private folder."""
    argv = [
        shutil.which("bwrap") or "bwrap",
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
    ]
    if as_root:
        # Only what the worker needs to hand each program its own uid and to kill it there.
        argv += ["--cap-drop", "ALL"]
        for capability in ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN"):
            argv += ["--cap-add", capability]
    else:
        argv += ["--unshare-user"]
    for folder in _SYSTEM_FOLDERS:
        if os.path.islink(folder):
            argv += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            argv += ["--ro-bind", folder, folder]
    for path in _ETC_FILES:
        argv += ["--ro-bind-try", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "01777", "--size", str(tmp_bytes), "--tmpfs", SANDBOX_TMP]
    bound = _outermost([*python_paths(), *read_only, str(PACKAGE_FOLDER)])
    # The folders above each bound path, made as plain empty folders: bubblewrap would copy
    # their modes (a home folder's 0700 would hide the interpreter from a program's user id).
    above = {str(parent) for path in bound for parent in Path(path).parents if parent != Path("/")}
    for folder in sorted(above, key=lambda f: (f.count("/"), f)):
        if not any(_within(folder, s) for s in _SYSTEM_FOLDERS):
            argv += ["--perms", "0755", "--dir", folder]
    for path in bound:
        argv += ["--ro-bind", path, path]
    argv += ["--clearenv", "--chdir", SANDBOX_TMP]
    return [*argv, "--", *plain_command(worker_settings)]


def unshare_command(worker_settings: str, as_root: bool) -> list[str]:
    """The `unshare` argv: new PID (the worker is its init), network, IPC, UTS and mount
    namespaces; the host's file system."""
    argv = [shutil.which("unshare") or "unshare"]
    if not as_root:
        argv += ["--user", "--map-root-user"]
    argv += ["--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--ipc", "--uts"]
    return [*argv, "--", *plain_command(worker_settings)]


def plain_command(worker_settings: str) -> list[str]:
    """No isolation: the worker as a plain child process."""
    return [sys.executable, "-I", str(WORKER_FILE), worker_settings]


def available(isolation: str) -> str | None:
    """Why `isolation` cannot be tried here (None: it can be tried)."""
    if isolation == "bubblewrap" and shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian/Ubuntu: apt install bubblewrap)"
    if isolation == "unshare" and shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    if isolation in ("bubblewrap", "unshare") and not sys.platform.startswith("linux"):
        return f"Linux namespaces are not available on {sys.platform}"
    return None


def isolation_order(requested: str) -> tuple[str, ...]:
    """The isolations to try, best first, for a config's `isolation` setting."""
    if requested not in ISOLATIONS:
        raise ValueError(f"isolation {requested!r}: expected one of {', '.join(ISOLATIONS)}")
    return ("bubblewrap", "unshare") if requested == "auto" else (requested,)


DESCRIPTIONS = {
    "bubblewrap": "bubblewrap: no network; own PID, IPC and mount namespaces; read-only system "
    "and Python folders; a private size-capped /tmp; an empty environment",
    "unshare": "unshare: no network; own PID and IPC namespaces; the host's file system, "
    "a private working folder",
    "none": "none: no isolation (resource limits and the wall-clock kill only)",
}
