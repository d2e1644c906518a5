"""The history of runs and nights (SQLite or PostgreSQL through SQLAlchemy): its schema,
migrations, queries and export (store), and what a run directory contributes to it
(records).
"""

from evalpipe.errors import UserError


class HistoryError(UserError):
    """A history problem the user can fix, in one sentence."""
