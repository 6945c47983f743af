"""The warm sandbox worker: runs inside the sandbox and forks one child per program.

Started once per sandbox (`python -I worker.py SETTINGS_JSON`), it imports the modules that
programs commonly use, then answers requests, one JSON line each on stdin, with one JSON line
on stdout. Each request runs in a fresh forked child, so no program sees another's state: the
child takes its own session, the sandbox's user id where one is given, resource limits and a
private working folder, and runs Python source (as `__main__`), a command, or one function
call. The worker reads the child's output up to a cap, kills the child at its wall-clock
limit or past that cap, then kills every process the child left behind (the worker is their
subreaper, so even a double-forked `setsid` grandchild comes back to it) and empties the
working folder. This file imports nothing but the standard library: it runs under whatever
interpreter the sandbox has, before anything else is importable.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import json
import os
import resource
import select
import shutil
import signal
import sys
import time
import traceback

_PR_SET_CHILD_SUBREAPER = 36
_READ_CHUNK = 65536
# After the child exits, how long its output pipes may stay open (a grandchild holding them)
# before the sweep kills whatever holds them.
_DRAIN_AFTER_EXIT_S = 0.05
_RESULT_FD = 3  # where a function call's child writes its JSON outcome


def _set_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _children(parent: int) -> list[int]:
    """Processes whose parent is `parent` (zombies included)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(entry))
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep() -> int:
    """Kill every descendant of this worker and reap them; returns how many were killed.
    Orphans are re-parented to the worker (its subreaper flag), so repeating "kill my
    children, reap" until none is left reaches every generation, forks in flight included."""
    me = os.getpid()
    killed = 0
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        _reap()
        children = _children(me)
        if not children:
            return killed
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.002)
    return killed


def _apply_limits(limits: dict) -> None:
    cpu = max(1, int(limits["cpu_s"] + 0.999))
    # SIGXCPU at the soft limit, SIGKILL a second later for a program that catches it.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _drop_user(uid: int | None) -> None:
    if uid is None:
        return
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _run_source(source: str, history: list[str]) -> None:
    """`history`'s cells, their output discarded, then `source`, as one `__main__`."""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    sys.argv = ["<program>"]
    if history:
        saved = os.dup(1), os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        for cell in history:
            try:
                exec(compile(cell, "<earlier cell>", "exec"), namespace)
            except Exception:  # an earlier cell's failure was reported when it ran
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
    try:
        exec(compile(source, "<program>", "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as err:
        # The program's own frames only: the first frame is this function's.
        traceback.print_exception(type(err), err, err.__traceback__.tb_next)
        sys.stderr.flush()
        os._exit(1)


def _run_call(function: str, kwargs: dict, modules: dict) -> None:
    module_name, _, name = function.partition(":")
    try:
        module = modules.get(module_name) or importlib.import_module(module_name)
        value = getattr(module, name)(**kwargs)
        outcome = {"ok": True, "value": str(value)}
    except BaseException as err:
        outcome = {"ok": False, "error": type(err).__name__, "message": str(err)}
    sys.stdout.flush()
    with os.fdopen(_RESULT_FD, "w") as result:
        json.dump(outcome, result)


def _child(request: dict, settings: dict, modules: dict, fds: dict) -> None:
    """In the forked child: become the program. Never returns."""
    code = 0
    try:
        os.setsid()
        os.dup2(fds["stdin"], 0)
        os.dup2(fds["stdout"], 1)
        os.dup2(fds["stderr"], 2)
        os.dup2(fds["result"], _RESULT_FD)
        os.closerange(_RESULT_FD + 1, 1 << 16)
        workdir = settings["workdir"]
        os.chdir(workdir)
        _drop_user(settings.get("child_uid"))
        _apply_limits(request["limits"])
        # Python ignores SIGXFSZ, and a command would inherit its ignored SIGPIPE: a file past
        # the size limit ends the program, and a command gets the default SIGPIPE it expects.
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        if request["kind"] == "command":
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        environment = dict(settings["environment"], HOME=workdir, TMPDIR=workdir)
        if request["kind"] == "command":
            os.execvpe(request["argv"][0], request["argv"], environment)
        os.environ.clear()
        os.environ.update(environment)
        if request["kind"] == "source":
            _run_source(request["source"], request.get("history", []))
        else:
            _run_call(request["function"], request.get("kwargs", {}), modules)
    except SystemExit as exit_request:
        # As Python exits: no code is 0, a number is the status, anything else is printed
        # and the status is 1.
        code = exit_request.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 127 if request["kind"] == "command" else 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _empty(folder: str, uid: int | None) -> None:
    """Remove everything in `folder`, as the programs' user `uid` where one is set: the worker
    has no right to delete their files in a sticky /tmp, and needs none. Most programs leave
    nothing, and then no process is forked for it."""
    if not os.listdir(folder):
        return
    if uid is not None:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _drop_user(uid)
                _empty(folder, None)
            except BaseException:
                code = 1
            os._exit(code)
        os.waitpid(pid, 0)
        return
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass


def run(request: dict, settings: dict, modules: dict) -> dict:
    """Run one request in a forked child; the outcome as the JSON-ready dict the host reads."""
    limits = request["limits"]
    pipes = {name: os.pipe() for name in ("stdin", "stdout", "stderr", "result")}
    sys.stdout.flush()
    sys.stderr.flush()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(
            request,
            settings,
            modules,
            {name: pipes[name][1 if name != "stdin" else 0] for name in pipes},
        )
    for name, (read_end, write_end) in pipes.items():
        os.close(read_end if name == "stdin" else write_end)
    stdin_fd = pipes["stdin"][1]
    pending_stdin = request.get("stdin", "").encode()
    if not pending_stdin:
        os.close(stdin_fd)
        stdin_fd = None
    else:
        os.set_blocking(stdin_fd, False)
    readers = {pipes[name][0]: name for name in ("stdout", "stderr", "result")}
    captured = {"stdout": bytearray(), "stderr": bytearray(), "result": bytearray()}
    cap = limits["output_bytes"]
    deadline = started + limits["wall_s"]
    timed_out = output_exceeded = False
    status = rusage = None
    exited_at = None
    while True:
        if status is None:
            waited, wait_status, wait_rusage = os.wait4(pid, os.WNOHANG)
            if waited == pid:
                status, rusage, exited_at = wait_status, wait_rusage, time.monotonic()
        now = time.monotonic()
        if not readers or (exited_at is not None and now - exited_at > _DRAIN_AFTER_EXIT_S):
            break
        if now >= deadline:
            timed_out = status is None
            break
        writers = [stdin_fd] if stdin_fd is not None else []
        ready_read, ready_write, _ = select.select(
            list(readers), writers, [], min(0.01, deadline - now)
        )
        if ready_write:
            try:
                sent = os.write(stdin_fd, pending_stdin[:_READ_CHUNK])
                pending_stdin = pending_stdin[sent:]
            except (BrokenPipeError, BlockingIOError):
                pending_stdin = b""
            if not pending_stdin:
                os.close(stdin_fd)
                stdin_fd = None
        for fd in ready_read:
            chunk = os.read(fd, _READ_CHUNK)
            if not chunk:
                del readers[fd]
                os.close(fd)
                continue
            captured[readers[fd]] += chunk
        if sum(map(len, captured.values())) > cap:
            output_exceeded = True
            break
    wall_s = time.monotonic() - started
    if status is None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _, status, rusage = os.wait4(pid, 0)
    left_behind = sweep()
    for fd in readers:
        os.close(fd)
    if stdin_fd is not None:
        os.close(stdin_fd)
    if not request.get("keep_files"):
        _empty(settings["workdir"], settings.get("child_uid"))
    stdout = bytes(captured["stdout"])
    stderr = bytes(captured["stderr"])
    if output_exceeded:
        stderr = stderr[: max(0, cap - len(stdout))]
        stdout = stdout[:cap]
    outcome = {
        "stdout": stdout.decode("utf-8", "replace"),
        "stderr": stderr.decode("utf-8", "replace"),
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "timed_out": timed_out,
        "output_exceeded": output_exceeded,
        "wall_s": wall_s,
        "cpu_s": rusage.ru_utime + rusage.ru_stime,
        "left_behind": left_behind,
    }
    if captured["result"]:
        try:
            outcome["value"] = json.loads(captured["result"].decode("utf-8", "replace"))
        except ValueError:
            pass
    return outcome


def _load_modules(settings: dict) -> dict:
    sys.path[:0] = settings.get("sys_path", [])
    modules = {}
    for name in settings.get("preload", []):
        try:
            importlib.import_module(name)
        except Exception:  # a module this interpreter lacks is imported (and fails) on use
            pass
    for alias, path in settings.get("preload_files", {}).items():
        spec = importlib.util.spec_from_file_location(alias, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[alias] = module
    return modules


def main() -> None:
    settings = json.loads(sys.argv[1])
    _set_subreaper()
    os.makedirs(settings["workdir"], exist_ok=True)
    if settings.get("child_uid") is not None:
        os.chown(settings["workdir"], settings["child_uid"], settings["child_uid"])
    modules = _load_modules(settings)
    protocol_out = os.fdopen(os.dup(1), "w")
    # Anything else printing to the worker's own stdout must not corrupt the protocol.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    protocol_out.write(json.dumps({"ready": True, "pid": os.getpid(), "uid": os.getuid()}) + "\n")
    protocol_out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        protocol_out.write(json.dumps(run(request, settings, modules)) + "\n")
        protocol_out.flush()


if __name__ == "__main__":
    main()
