"""The run directory: its layout and atomic writes (artifacts), the verification of every
artifact against its manifest (integrity), the lock that keeps two writers apart (lock),
and reopening an interrupted run (resume). The documents it holds are typed in
evalpipe.documents.
"""
