"""`ray` with its node address pinned to the loopback: how evalpipe starts the nodes of a
cluster on this machine (`python -m evalpipe.cluster.ray_cli start ...`, see
:mod:`evalpipe.cluster.loopback`). Any other use of Ray's CLI is Ray's own `ray`."""

from __future__ import annotations

import sys

from evalpipe.cluster.loopback import pin_to_loopback

if __name__ == "__main__":
    pin_to_loopback()
    from ray.scripts.scripts import main

    sys.exit(main())
