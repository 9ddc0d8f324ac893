"""`python -m streamwal ...` is the `streamwal` command."""

from streamwal.cli import main

main()
