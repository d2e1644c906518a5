"""The documents that cross a process or file boundary, as versioned pydantic models with
one writer and one reader each: what evalpipe writes in one place is read in another by
field, never by key from raw JSON, and a document of another version is refused (or
migrated) in one sentence.

Importable on both sides of the worker boundary (pydantic and the standard library only):
the parent writes a worker's job, the worker inside the variant's interpreter reads it.
run.json and nightly.json (run_doc, nightly_doc) are the parent's alone, and may use its
config models.
"""
