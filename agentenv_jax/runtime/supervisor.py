"""A small parent process for each MPI rank, so that a rank that dies is named.

When a rank's process dies (SIGKILL, the OOM killer, a crash inside an env), MPI launchers end
the whole job at once, and MPICH's names only a PID; the surviving ranks are killed before they
can say anything. So under a launcher `agentenv train` runs the rank in a child process and stays
on as its parent. The parent learns at once how the child ended, says which rank died and how,
and exits with the child's status. It also keeps the launcher's PMI socket open, so the launcher
hears of the death only when the parent exits, after the message is out.

The child has the kernel kill it if the parent dies (`PR_SET_PDEATHSIG`), so no rank outlives
the job when the launcher kills the parents. Signals a launcher sends to the parent — SIGTERM
(preemption), SIGINT, SIGHUP, SIGUSR2 (a stop request through Open MPI's `mpirun`), and MPICH's
SIGUSR1 failure notice — are passed on to the child.

A rank that a stop signal ended is not reported: Open MPI's `mpirun` ends a job with SIGTERM
once one rank has exited with an error, which can reach a rank before it takes its signals.

`mpiexec` and `mpirun` end the job when one rank dies; Slurm's `srun` ends the step only with
`--kill-on-bad-exit` (`-K`), and otherwise lets the other ranks wait for the dead one until their
transport timeout. So under `srun` a supervisor whose rank was killed ends the step itself
(`scancel --signal=KILL JOB.STEP`).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys

from agentenv_jax.transport.launcher import detect_launcher, launcher_rank

# Set in the child: it is the rank itself, not its supervisor.
RANK_PROCESS_VARIABLE = "AGENTENV_RANK_PROCESS"
_SUPERVISOR_PID_VARIABLE = "AGENTENV_SUPERVISOR_PID"
_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1


def is_rank_process() -> bool:
    return os.environ.get(RANK_PROCESS_VARIABLE) == "1"


def supervise(argv: list[str]) -> int:
    """Run `agentenv_jax.workflow.cli argv` as this rank's child; return its exit status (128 +
    signal number when a signal killed it, as shells report it), after naming the rank if it
    died."""
    env = dict(os.environ)
    env[RANK_PROCESS_VARIABLE] = "1"
    env[_SUPERVISOR_PID_VARIABLE] = str(os.getpid())
    # MPICH's simple PMI hands each rank an inherited socket; the child needs the same one.
    inherited = [int(env["PMI_FD"])] if env.get("PMI_FD", "").isdigit() else []
    child = subprocess.Popen(
        [sys.executable, "-m", "agentenv_jax.workflow.cli", *argv], env=env, pass_fds=inherited
    )
    for sig in _FORWARDED_SIGNALS:
        signal.signal(sig, lambda signum, frame: child.send_signal(signum))
    status = child.wait()
    if status >= 0:
        return status
    if -status in _FORWARDED_SIGNALS:
        # Asked to stop (a launcher ending the job after another rank's exit, or a stop that
        # came before the rank took its signals): not a death to report.
        return 128 - status
    name = signal.Signals(-status).name
    message = (
        f"agentenv: error: rank {launcher_rank()} (pid {child.pid}) was killed by {name}; "
        "the job stops\n"
    )
    os.write(2, message.encode())  # one write: the launcher may kill us right after
    end_slurm_step()
    return 128 - status


def end_slurm_step() -> None:
    """When `srun` started the ranks, kill every task of this job step now (see the module
    docstring); elsewhere do nothing. Slurm kills the tasks on every node of the step, this
    one's supervisor too.

    NOTE: only a step whose tasks are the ranks. Under `mpiexec` or `mpirun` inside an
    allocation the ranks may still carry the Slurm step of the shell they were started from (an
    interactive `srun --pty bash`, a notebook's step), which is not theirs to end; those
    launchers end the job themselves."""
    launcher = detect_launcher()
    scancel = shutil.which("scancel")
    if launcher.name != "srun" or launcher.slurm_step is None or scancel is None:
        return
    subprocess.run(
        [scancel, "--quiet", "--signal=KILL", launcher.slurm_step],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        timeout=30,
        check=False,
    )


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
