"""``python -m harness.server.pool``: one Celery worker process of the pool (``main``).

Apart from the package so that the worker runs the package's own Celery app and task,
not a second copy made by running it as ``__main__`` (and the package never imports
itself)."""
from . import main

raise SystemExit(main())
