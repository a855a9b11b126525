# SPDX-License-Identifier: BSD-3-Clause
"""The implementations the benchmark compares, by name. Each lives in its
own module, imported only inside the worker process that runs it."""

import importlib

# name -> (module, attribute), in the order the harness runs them.
REGISTRY = {
    "attngen": ("attngen_peer", "PEER"),
    "attngen_jagged": ("attngen_jagged_route", "PEER"),
    "varlen_fa2": ("varlen", "PEERS", "varlen_fa2"),
    "sdpa_flash": ("sdpa", "PEERS", "sdpa_flash"),
    "sdpa_cudnn": ("sdpa", "PEERS", "sdpa_cudnn"),
    "sdpa_efficient": ("sdpa", "PEERS", "sdpa_efficient"),
    "triton": ("triton_block", "PEER"),
    "flex": ("flex", "PEER"),
    "varlen_fa3": ("varlen", "PEERS", "varlen_fa3"),
}
ORDER = list(REGISTRY)
# Run only when --peers names them: attngen's own alternatives, shown beside
# attngen in the tables but never counted as the fastest peer.
OPT_IN = {"attngen_jagged"}


def load(name):
    """A new instance of the named peer."""
    entry = REGISTRY[name]
    mod = importlib.import_module("." + entry[0], __name__)
    obj = getattr(mod, entry[1])
    if len(entry) > 2:
        obj = obj[entry[2]]
    return obj()
