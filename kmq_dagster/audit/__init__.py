"""The SQL audit log: dead letters, operator actions, breaker transitions, alerts, snapshots."""
