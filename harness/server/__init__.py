"""The course server: students without a GPU submit a lab, a pool of runners grades it.

``db`` (the record), ``service`` (intake, queue, leases, results: no HTTP), ``app``
(FastAPI: the API and the server-rendered pages), ``runner`` (grades one job with the
same pipeline as ``labs grade``; the embedded dispatchers), ``pool`` (Celery workers on
GPU hosts). docs/server.md says how a course runs it.
"""
