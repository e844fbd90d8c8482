"""``kmq demo`` and ``kmq demo --ui``: the whole pipeline on one machine (:mod:`.pipeline`),
the same queue operated from Dagster and the console (:mod:`.ui`), and the sample orders
with the Spark function that prices them (:mod:`.orders`).

Nothing is imported here: Spark executors import :mod:`.orders` alone.
"""
