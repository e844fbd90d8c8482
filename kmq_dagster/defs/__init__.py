"""Dagster definitions: resources, jobs, and later assets, sensors and schedules."""
