"""Nightly: a night runs the config, records it in the history and is judged against the
baseline night and the nights before it (night); simulate builds nights with a known
fault, to show the judging at work without waiting for real nights.
"""
