"""The earlier home of the training-stability tools, under their old names.

QK-norm is :mod:`posenc.qk_norm`, the z-loss :mod:`posenc.z_loss`, the
embedding scale :func:`posenc.norms.embed_scale` and the diagnostics
:mod:`posenc.diagnostics`; ``posenc.stability.<name>`` keeps working.
"""

from posenc.diagnostics import attention_entropy, logit_stats, lr_sensitivity, max_attention_logit  # noqa: F401
from posenc.norms import embed_scale  # noqa: F401
from posenc.qk_norm import QK_NORMS, qk_norm, qk_norm_init  # noqa: F401
from posenc.z_loss import z_loss  # noqa: F401
