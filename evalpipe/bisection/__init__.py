"""`evalpipe bisect`: candidate builds from git, and the search over their verdicts."""
