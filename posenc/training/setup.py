"""The earlier name of :mod:`posenc.training.prepare` (this module is that module)."""

import sys

from posenc.training import prepare

sys.modules[__name__] = prepare
