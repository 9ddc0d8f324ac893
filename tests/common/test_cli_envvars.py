"""Every option of every `streamwal` command reads STREAMWAL_<COMMAND>_<OPTION> named after
its long flag (`--from` of `consume`: STREAMWAL_CONSUME_FROM, not the Python parameter's
name), and `--help` shows it."""

from __future__ import annotations

import click

from streamwal.cli import main


def _commands(group: click.Group, ctx: click.Context, path: tuple[str, ...]):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            yield from _commands(command, ctx, (*path, name))
        else:
            yield (*path, name), command


def test_every_option_variable_is_named_after_its_flag() -> None:
    ctx = click.Context(main, info_name="streamwal", auto_envvar_prefix="STREAMWAL")
    admin = main.resolve_command(ctx, ["node", "list"])[1]
    commands = [*_commands(main, ctx, ()), *_commands(admin, ctx, ("node",))]
    assert (("node", "list") in dict(commands)) and (("channel", "list") in dict(commands))
    wrong = []
    for path, command in commands:
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            flag = next(o for o in param.opts if o.startswith("--"))
            if param.name != flag[2:].replace("-", "_") or not param.show_envvar:
                wrong.append(f"{' '.join(path)} {flag}: STREAMWAL_..._{param.name.upper()}")
    assert not wrong, wrong
