# SPDX-License-Identifier: BSD-3-Clause
"""What every GPU test module needs first: a CUDA device visible to torch
and a loadable libattngen.so (with a given entry point, for a pattern a
library may predate); the module is skipped with the reason otherwise."""
import pytest


def need_gpu_and_lib(torch, attngen, entry=None, predates=None):
    """Skip the calling module unless torch sees a GPU and the library loads
    (and exports `entry`: else "libattngen.so predates <predates>")."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    try:
        attngen._lib.lib()
    except attngen.LibraryNotFoundError as e:
        pytest.skip(str(e))
    if entry is not None and not attngen._lib.has(entry):
        pytest.skip("libattngen.so predates %s" % predates)
