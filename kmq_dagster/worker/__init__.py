"""The worker: ``Worker`` (``worker``), its one loop for every concurrency (``loop``,
its types in ``loop_types``; calls run by ``handler_runner``: on the loop's own thread at 1, on
threads or an event loop above) and the handler call it and Spark's chunk caller share
(``handler_call``), and the garbage collector's pace while it runs (``garbage_collection``).

It uses ``kafka/`` (the consumer, the retry router, the queue) and ``core/``; it imports neither
``audit/`` nor SQLAlchemy: the breaker it obeys is ``core.breaker.GroupBreaker``, a protocol the
CLI, Dagster and Spark fill with the audit store's shared breaker.
"""
