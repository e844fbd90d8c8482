"""Entry script for ``streamlit run ui/app.py``: the DLQ console of ``kmq_dagster/console``.

``kmq console`` runs the same app from the installed package, checks its options first and
passes them in ``KMQ_*`` variables; with ``streamlit run``, set them yourself (README, Console),
e.g. ``KMQ_CONSOLE_AUTH=none streamlit run ui/app.py --server.address 127.0.0.1``.
"""

from kmq_dagster.console.app import main

main()
