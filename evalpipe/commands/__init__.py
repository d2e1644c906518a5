"""Use cases behind the CLI's verbs that are more than a call into the pipeline: checking a
machine and a config before a run (doctor), calibrating the verdict on the layout
model's fault zoo (calibrate), comparing stored runs again (compare), a run or its dry
run (run), the history's listings (history). The CLI imports them when their verb runs.
"""
