import click
node = click.Command("node")
