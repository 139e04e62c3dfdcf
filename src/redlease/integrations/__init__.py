"""Adapters between redlease and the schedulers and task queues Python services run.

- ``redlease.integrations.celery``: ``FencedTask``, a Celery task that runs
  only while it holds its lease, and ``LeaderScheduler``, a ``celery beat``
  scheduler of which any number may run and one sends (``pip install
  'redlease[celery]'``).
- ``redlease.integrations.apscheduler``: ``LeaderGate``, an APScheduler 3.x
  scheduler that processes its jobs only while its process leads (``pip
  install 'redlease[apscheduler]'``).

Each module imports its host library, and nothing imports these modules but
the application: ``import redlease`` never imports Celery or APScheduler.
They are built on the public API only (``redlease.Elector``,
``redlease.RedisLocker``). The details: ``docs/integrations.md``.
"""
