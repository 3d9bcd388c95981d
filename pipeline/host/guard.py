"""Run a program so that it dies with the enginectl process that started it (Linux).

    python -I -S guard.py PARENT_PID PROGRAM [ARG ...]

The process runner starts every child (trtllm-build, the quantizer, convert, smoke and `serve`
servers, probes) through this supervisor. Without it, a builder killed with `kill -9` leaves
its child running in the child's own session (the runner gives each child a process group, so
that a timeout or Ctrl-C can stop the whole tree): a builder that takes the lease over then
runs a second build of the same key beside the orphan, on the same GPU, and a smoke server
keeps its port and memory for ever.

Why a supervisor process and not `preexec_fn`: the runner is called from the executor's
threads, and `preexec_fn` is not safe with threads in the parent (the child may deadlock on
a lock another thread held at fork). Why not `PR_SET_PDEATHSIG` on the program alone: it
reaches one process, and stage programs start their own workers (MPI ranks, build workers).
So the guard, single-threaded and stdlib-only, asks Linux for SIGUSR1 when its parent dies
(`prctl(PR_SET_PDEATHSIG)`), forks the program in its own process group (the one the runner
made for the guard), waits, and passes the program's exit status through unchanged: the
same code, or death by the same signal. When the parent dies first, it SIGKILLs the whole
group — the program, its workers and itself. The program in turn asks for SIGKILL when the
guard dies, so a guard killed on its own (a Ray worker's raylet SIGKILLs the dead worker's
direct children) does not leave the program running.

It never imports enginectl (it runs with `-I -S` for a quick start) and never raises: a
program it cannot start is reported on stderr (the run's log) with exit status 127, as the
runner does for a program it cannot start itself. Being stdlib-only, it is also where the
one function that signals a process group lives (`signal_group`), which the runner imports.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported at run time: the guard starts quickly
    from collections.abc import Callable
    from types import FrameType

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_DIED = signal.SIGUSR1
CANNOT_START = 127


def signal_group(pgid: int, signum: int) -> bool:
    """Send *signum* to process group *pgid* (0: this process's own); whether the group is
    there to get it (signal 0 sends nothing: it asks). The one place enginectl signals a
    process group: the runner and the Ray tasks import it, and this guard, which imports
    nothing of enginectl, uses it itself."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _group_dies(parent: int) -> Callable[[int, FrameType | None], None]:
    """The handler of PARENT_DIED: when the parent is gone, stop the whole process group,
    this guard included. The same signal sent to the group by someone else (`serve` passes
    SIGUSR1 on to its server's group) finds the parent alive and is ignored."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        if os.getppid() != parent:
            signal_group(0, signal.SIGKILL)

    return handler


def _exit_like(status: int) -> None:
    """End this process as the program ended: its code, or its signal."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number not in (signal.SIGKILL, signal.SIGSTOP):  # those cannot be caught anyway
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        os._exit(128 + number)  # a signal whose default is not to end the process
    os._exit(os.WEXITSTATUS(status))


def main(argv: list[str]) -> None:
    parent, program = int(argv[1]), argv[2:]
    signal.signal(PARENT_DIED, _group_dies(parent))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(PARENT_DIED), 0, 0, 0) != 0:
        print(f"enginectl guard: prctl failed: {os.strerror(ctypes.get_errno())}",
              file=sys.stderr, flush=True)
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(CANNOT_START)
    guard = os.getpid()
    child = os.fork()
    if child == 0:
        signal.signal(PARENT_DIED, signal.SIG_DFL)
        # A guard killed on its own (Ray SIGKILLs a dead worker's direct children) takes the
        # program with it: it cannot run its handler then, so the kernel does it.
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != guard:  # the guard died before the request took effect
            os._exit(CANNOT_START)
        try:
            os.execvp(program[0], program)  # noqa: S606 - argv, as the runner's
        except OSError as exc:
            print(f"cannot start {program[0]}: {exc}", file=sys.stderr, flush=True)
        os._exit(CANNOT_START)
    # The runner stops a run by signalling the whole group, and `serve` passes the signals it
    # gets on to its server's group: either reaches the program directly. The guard itself
    # waits for the program and reports how it ended.
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                   signal.SIGUSR2):
        signal.signal(number, signal.SIG_IGN)
    _, status = os.waitpid(child, 0)
    _exit_like(status)


if __name__ == "__main__":
    main(sys.argv)
