"""The parent's side of the path probes (the probes themselves, evalpipe.probes, run inside
the engine's processes with the standard library only): looking up the probed names in a
variant's interpreter before any engine starts (names), and gathering the processes'
records into the variant's probes.json and manifest (records).
"""
