"""Operations that need both Kafka and the audit store: dead-letter ingest (ours and foreign
formats), replay, the reads that list and show dead letters, and queue status.

A floor above ``kafka/`` (the clients and the queue protocol, no SQL) and ``audit/`` (the store,
no Kafka): the worker, the tracker and the producers never import it.
"""
