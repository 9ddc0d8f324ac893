"""Run a streamwal command whose coord SIGKILLs itself right after a named saga step.

    python -m streamwal.testing.crash --at assign [--pchannel PREFIX] -- coord --listen ...

The coord's production code only carries the seam (`coord.executor.installed_hooks`, run
after every step with the step's name and pchannel); this wrapper installs a hook there
and then runs the `streamwal` command line as usual. Process tests use it to crash the
coord at every step of a reassignment or a replicated term change (step names:
`state_machine.Step`); the crash is logged ("crash injected") before the SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import click

from streamwal.coord import executor
from streamwal.coord.state_machine import Step

log = logging.getLogger("streamwal.coord")


def kill_after(step: str, prefix: str = "") -> executor.StepHook:
    """A step hook that SIGKILLs this process right after `step` ran on a pchannel
    whose name starts with `prefix`."""

    def hook(done: str, pchannel: str) -> None:
        if done == step and pchannel.startswith(prefix):
            log.warning("crash injected", extra={"step": done, "pchannel": pchannel})
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--at", "step", required=True, type=click.Choice([s.value for s in Step]))
@click.option("--pchannel", default="", help="Only steps on pchannels with this prefix.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def main(step: str, pchannel: str, command: tuple[str, ...]) -> None:
    """Run `streamwal COMMAND...` with its coord killed right after STEP."""
    executor.installed_hooks.append(kill_after(step, pchannel))
    from streamwal.cli import main as streamwal

    streamwal(args=list(command), prog_name="streamwal")


if __name__ == "__main__":
    sys.exit(main())
