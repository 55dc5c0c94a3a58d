"""The earlier name of :mod:`posenc.norm_names` (names of norms, placements, QK-norms); this module is that module."""

import sys

from posenc import norm_names

sys.modules[__name__] = norm_names
