"""The course server: students without a GPU submit a lab, a pool of runners grades it.

``db`` (the record: the validated module of each submission, the typed record of each
result), ``service`` (intake, queue, leases, results: no HTTP); the web side: ``app``
(``create_app``) over ``routes`` (one router per resource) and ``deps`` (the session
and the account), ``pages`` (rendering); the runners: ``jobs`` (the one job loop:
grade the stored module with ``grading.grade_one`` under a lease, then complete or
fail), ``runner`` (the embedded dispatchers), ``pool`` (Celery workers on GPU hosts).
docs/server.md says how a course runs it; docs/architecture.md shows the rooms.
"""
