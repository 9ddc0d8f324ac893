import click
bench = click.Group("bench")
