"""The earlier name of :mod:`posenc.path` (PaTH attention); this module is that module."""

import sys

from posenc import path

sys.modules[__name__] = path
