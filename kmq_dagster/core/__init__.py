"""Pure logic: standard library only, no I/O, no clock reads.

Adapters read the clock and randomness at the edge and pass ``now_ms`` / ``rng`` inward.
"""
