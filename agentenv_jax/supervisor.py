"""A small parent process for each MPI rank, so that a rank that dies is named.

When a rank's process dies (SIGKILL, the OOM killer, a crash inside an env), MPI launchers end
the whole job at once, and MPICH's names only a PID; the surviving ranks are killed before they
can say anything. So under a launcher `agentenv train` runs the rank in a child process and stays
on as its parent. The parent learns at once how the child ended, says which rank died and how,
and exits with the child's status. It also keeps the launcher's PMI socket open, so the launcher
hears of the death only when the parent exits, after the message is out.

The child has the kernel kill it if the parent dies (`PR_SET_PDEATHSIG`), so no rank outlives
the job when the launcher kills the parents. Signals a launcher sends to the parent — SIGTERM
(preemption), SIGINT, SIGHUP, and MPICH's SIGUSR1 failure notice — are passed on to the child.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

# Set in the child: it is the rank itself, not its supervisor.
RANK_PROCESS_VARIABLE = "AGENTENV_RANK_PROCESS"
_SUPERVISOR_PID_VARIABLE = "AGENTENV_SUPERVISOR_PID"
# How the launchers we know name a process's rank.
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
_PR_SET_PDEATHSIG = 1


def is_rank_process() -> bool:
    return os.environ.get(RANK_PROCESS_VARIABLE) == "1"


def launcher_rank() -> str | None:
    """This process's rank as the launcher set it, if a launcher started it."""
    for name in _RANK_VARIABLES:
        if name in os.environ:
            return os.environ[name]
    return None


def supervise(argv: list[str]) -> int:
    """Run `agentenv_jax.cli argv` as this rank's child; return its exit status (128 + signal
    number when a signal killed it, as shells report it), after naming the rank if it died."""
    env = dict(os.environ)
    env[RANK_PROCESS_VARIABLE] = "1"
    env[_SUPERVISOR_PID_VARIABLE] = str(os.getpid())
    # MPICH's simple PMI hands each rank an inherited socket; the child needs the same one.
    inherited = [int(env["PMI_FD"])] if env.get("PMI_FD", "").isdigit() else []
    child = subprocess.Popen(
        [sys.executable, "-m", "agentenv_jax.cli", *argv], env=env, pass_fds=inherited
    )
    for sig in _FORWARDED_SIGNALS:
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    status = child.wait()
    if status >= 0:
        return status
    name = signal.Signals(-status).name
    message = (
        f"agentenv: error: rank {launcher_rank()} (pid {child.pid}) was killed by {name}; "
        "the job stops\n"
    )
    os.write(2, message.encode())  # one write: the launcher may kill us right after
    return 128 - status


def signal_when_parent_dies(sig: int) -> bool:
    """Ask the kernel to send this process `sig` when its parent process ends (Linux
    `PR_SET_PDEATHSIG`); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    return True


def die_with_supervisor() -> None:
    """In the child: be killed by the kernel when the supervisor goes (Linux; elsewhere the
    launcher's own cleanup has to do)."""
    parent = os.environ.get(_SUPERVISOR_PID_VARIABLE)
    if parent is None or not signal_when_parent_dies(signal.SIGKILL):
        return
    if os.getppid() != int(parent):  # the supervisor died before the request took effect
        os._exit(128 + signal.SIGKILL)
