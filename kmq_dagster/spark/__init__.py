"""PySpark processing of queue messages with per-message acknowledgement."""
