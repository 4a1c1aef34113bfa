"""`python -m locals` runs the CLI."""

from locals.cli import main

main()
