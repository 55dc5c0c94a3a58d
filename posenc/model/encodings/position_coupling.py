"""Position coupling: learned tables over the task's coupled position ids (Cho et al. 2024, 2025)."""

import jax
from flax import nnx

from posenc import checks
from posenc.checks import nonnegative_int, positive
from posenc.encodings import position_coupling as coupling
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import register_encoding


def _levels(name, value):
    return checks.integer(name, value, minimum=1, maximum=coupling.MAX_LEVELS)


@register_encoding("position_coupling")
class PositionCoupling(Encoding):
    """Sum over levels of learned rows [levels, max_position + 1, D] at the coupled ids.

    The paper's model (HanseulJo/position-coupling: ``wpe``, one table per
    level, summed). The ids are the model's positions: a task with
    ``coupled=True`` emits them as ``position_ids`` and training feeds them
    to the model; multi-level ids arrive packed (``posenc.position_coupling``).
    A task without coupled ids gives 0 .. L-1: then this is a learned table.
    The layers run the per-layer kinds beside it (NoPE by default, as the
    paper). The random offset at training is the task's (its
    ``max_position``); ids past ``max_position`` have no row (NaN). Init
    N(0, ``init_std``): the scale of the token embeddings (the official
    code initialises token and position tables alike).
    """

    paper = "Cho et al. 2024, 2025"
    pure = "posenc.encodings.position_coupling"
    max_position = Option(0, nonnegative_int, "largest id of a level (rows: max_position + 1; "
                                              "0: the training length)", train_length=True)
    levels = Option(1, _levels, "levels of the ids (1; 2-3: multi-level coupling, Cho et al. 2025)")
    init_std = Option(0.02, positive, "std of the tables' N(0, std) init")

    @classmethod
    def check(cls, options, *, prefix, **_):
        if options["max_position"] < 1:
            raise ValueError(f"{prefix}.max_position must be >= 1 (0 means the task's training length, "
                             "which is only known to a training run); got 0")
        if options["levels"] > 1 and options["max_position"] >= coupling.STRIDE:
            raise ValueError(f"{prefix}.max_position {options['max_position']} does not fit a level of "
                             f"multi-level ids (< {coupling.STRIDE})")

    def setup(self, rngs, first):
        shape = (self.levels, self.max_position + 1, self.d_model)
        self.tables = nnx.Param(self.init_std * jax.random.normal(rngs.params(), shape))

    def embed(self, positions, dim):
        return coupling.embed(self.tables[...], positions)
