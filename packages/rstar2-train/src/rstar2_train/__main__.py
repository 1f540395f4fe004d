"""``python -m rstar2_train``: the same command line as ``rstar2-train``."""

from rstar2_train.cli import app

app()
