"""SQL-injection strings every filter test pushes through (they must match nothing and change
nothing)."""

INJECTIONS = [
    "' OR '1'='1",
    "'; DROP TABLE dead_letters; --",
    '" OR ""="',
    "%",
    "_",
    "\\",
    "x' UNION SELECT * FROM actions --",
    "0) OR (1=1",
    "*/ OR 1=1 /*",
]
