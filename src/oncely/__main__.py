"""`python -m oncely` is the `oncely` command."""

from .cli import main

main()
