"""``python -m harness``: the ``labs`` command (``harness.cli``), as the Gradescope autograder runs it."""
from .cli import main

main(prog_name="labs")
