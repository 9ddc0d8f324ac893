import click
produce = click.Command("produce")
consume = click.Command("consume")
