"""`python -m streamwal.testing.sim`: run simulator seeds; a failure prints its seed."""

from __future__ import annotations

import json
import sys
import time

import click

from streamwal.testing.sim.cluster import run_seed


@click.command()
@click.option("--seed", type=int, help="Run this one seed (replay a failure).")
@click.option("--seeds", default=200, show_default=True, help="How many seeds to run.")
@click.option("--first", default=1, show_default=True, help="The first seed of --seeds.")
@click.option("-v", "--verbose", is_flag=True, help="Print every seed's line and the log.")
@click.option("--scale", type=int, help="Instead: N pchannels, one node lost (scale.py).")
@click.option("--scale-nodes", default=100, show_default=True, help="Nodes of --scale.")
def main(
    seed: int | None,
    seeds: int,
    first: int,
    verbose: bool,
    scale: int | None,
    scale_nodes: int,
) -> None:
    """Deterministic simulation of nodes, coord and clients under faults (see
    streamwal.testing.sim.cluster); exits 1 if any seed breaks a promise."""
    if scale is not None:
        from streamwal.testing.sim.scale import run_scale

        click.echo(json.dumps(run_scale(scale_nodes, scale, seed=seed or 1)))
        return
    chosen = [seed] if seed is not None else list(range(first, first + seeds))
    started = time.perf_counter()
    failed = []
    for s in chosen:
        outcome = run_seed(s, verbose=verbose)
        if verbose or not outcome.ok:
            click.echo(outcome.report())
            if verbose:
                click.echo("\n".join(outcome.log))
        if not outcome.ok:
            failed.append(s)
    took = time.perf_counter() - started
    click.echo(f"{len(chosen)} seeds in {took:.1f}s, {len(failed)} failed: {failed}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
