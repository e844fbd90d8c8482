"""The worker: ``Worker`` (``worker``), its loops (one message at a time: ``worker_loop``; N at
once in an ordering: ``concurrent_loop`` with ``handler_runner``) and the handler call both
loops and Spark's chunk caller share (``handler_call``).

It uses ``kafka/`` (the consumer, the retry router, the queue) and ``core/``; it imports neither
``audit/`` nor SQLAlchemy: the breaker it obeys is ``core.breaker.GroupBreaker``, a protocol the
CLI, Dagster and Spark fill with the audit store's shared breaker.
"""
