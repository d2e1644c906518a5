"""Ray as the place a run's variants execute: connecting to a cluster, placing each variant
in a placement group of its own resources, moving a variant's directory between a node
and the driver, and a cluster of several Ray nodes on this machine's loopback (tests,
benchmarks, a laptop). evalpipe schedules nothing itself: Ray places and runs."""
