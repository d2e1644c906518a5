"""The history of runs and nights (SQLite or PostgreSQL through SQLAlchemy): its schema
and migrations, what a run directory contributes to it, queries and export (store).
"""
