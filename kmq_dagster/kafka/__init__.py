"""Kafka adapters: the only package that imports confluent_kafka."""
