"""Where the norm sits around a residual sublayer: pure combinators.

A sublayer is any function ``F: x -> F(x)`` (attention or MLP), a norm any
function ``N: x -> N(x)`` (e.g. ``functools.partial(posenc.norms.normalize,
"rms", params=p)``). :func:`residual` combines them per placement:

    pre        x + F(N(x))              final norm   (Xiong et al. 2020; GPT-2, Llama)
    post       N(x + F(x))              no final norm (Vaswani et al. 2017, BERT)
    sandwich   x + N_out(F(N_in(x)))    final norm   (Gemma 2/3, CogView, Peri-LN)
    reordered  x + N(F(x))              final norm   (OLMo 2, Swin v2)
    deepnorm   N(alpha x + F(x))        no final norm (Wang et al. 2022)
    rezero     x + a F(x), a init 0     no norm      (Bachlechner et al. 2020)
    mixln      post in the first floor(fraction * L) layers, pre after
               (Li et al. 2024); resolve per layer with :func:`layer_placement`.

Three placements act on a whole layer (attention and MLP together) and are
pure functions of their own modules; :func:`residual` refuses them and names
the function (``Placement.block``):

    hybrid       X + Attn(X) with q, k, v RMS-normalised per head, then
                 N(Y) + FFN(N(Y)); final norm       (HybridNorm, Zhuo et al. 2025)
    hybrid_star  hybrid with a pre-norm first layer: X + Attn(N_a(X)), then
                 Y + FFN(N(Y))                      (HybridNorm*)
    lns          x + F(N(x) / sqrt(l + 1)) in layer l (0-based); final norm
                 (LayerNorm Scaling, Sun et al. 2025)
    ngpt         h <- norm(h + alpha (norm(F(h)) - h)) per sublayer, hidden
                 states and weights on the unit sphere; no norm layers
                 (nGPT, Loshchilov et al. 2025; posenc.ngpt)

Shapes: ``x`` is ``[..., D]``; the result has the shape and dtype of ``x``.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from posenc import checks
from posenc.norms import norms


@dataclasses.dataclass(frozen=True)
class Placement:
    """A residual placement: what it is, whether the decoder ends with a norm, what it takes."""

    description: str
    final_norm: bool  # the decoder normalises after its last layer
    keywords: tuple[str, ...] = ()  # keywords of `residual` it uses (beyond x, sublayer, norm)
    uses_norm: bool = True
    block: str = ""  # a whole-layer placement: the pure function of one layer (not `residual`)
    qkv_norm: bool = False  # attention RMS-normalises q, k and v per head (posenc.hybrid_norm.qkv_norm)
    sphere: bool = False  # nGPT: unit-norm hidden states and weight rows, scaled q, k, MLP and logits


# Mix-LN ends in pre-norm layers, whose residual stream is unnormalised, so it
# keeps the final norm (the Mix-LN code keeps Llama's final RMSNorm).
PLACEMENTS: dict[str, Placement] = {
    "pre": Placement("x + F(N(x)), final norm (GPT-2, Llama)", True),
    "post": Placement("N(x + F(x)), no final norm (Vaswani, BERT)", False),
    "sandwich": Placement("x + N_out(F(N_in(x))), final norm (Gemma 2/3, Peri-LN)", True,
                          ("norm_out",)),
    "reordered": Placement("x + N(F(x)), final norm (OLMo 2, Swin v2)", True),
    "deepnorm": Placement("N(alpha x + F(x)) with beta init scaling (Wang et al. 2022)", False,
                          ("alpha",)),
    "mixln": Placement("post-norm in the first fraction of layers, pre-norm after (Li et al. 2024)",
                       True),
    "rezero": Placement("x + a F(x), a init 0 shared by the layer's sublayers, no norm "
                        "(Bachlechner et al. 2020)", False, ("gate",), uses_norm=False),
    "hybrid": Placement("X + Attn(X) with q, k, v normed per head, then N(Y) + FFN(N(Y)), final norm "
                        "(HybridNorm, Zhuo et al. 2025)", True, block="posenc.hybrid_norm.block",
                        qkv_norm=True),
    "hybrid_star": Placement("hybrid with a pre-norm first layer (HybridNorm*, Zhuo et al. 2025)", True,
                             block="posenc.hybrid_norm.block", qkv_norm=True),
    "lns": Placement("x + F(N(x) / sqrt(l + 1)) in layer l, final norm (LayerNorm Scaling, Sun et al. "
                     "2025)", True, block="posenc.layernorm_scaling.block"),
    "ngpt": Placement("h <- norm(h + alpha (norm(F(h)) - h)), hidden states and weights on the unit sphere, "
                      "no norm layers (nGPT, Loshchilov et al. 2025)", False, uses_norm=False,
                      block="posenc.ngpt.block", sphere=True),
}


def _placement(name) -> Placement:
    return PLACEMENTS[checks.choice("norm placement", name, PLACEMENTS)]


def residual(placement, x, sublayer, norm=None, *, norm_out=None, alpha=None, gate=None):
    """One residual block ``x -> x'`` with the norm(s) placed per ``placement``.

    Args:
      placement: pre, post, sandwich, reordered, deepnorm or rezero (``mixln``
        must first be resolved with :func:`layer_placement`).
      x: ``[..., D]`` residual stream.
      sublayer: ``F``, maps ``[..., D]`` to ``[..., D]``.
      norm: ``N`` (``N_in`` for sandwich); rezero takes none.
      norm_out: ``N_out``, sandwich only (required there).
      alpha: DeepNorm residual scale ``(2L)^(1/4)`` (see
        ``posenc.norms.deepnorm_constants``), deepnorm only (required there).
      gate: ReZero scalar ``a`` (a parameter initialised to 0), rezero only
        (required there).
    A keyword the placement does not use is a ValueError.
    Returns:
      ``[..., D]`` in ``x.dtype`` (the sum is cast back so that a float32
      sublayer output or gate does not promote a bf16 residual stream).
    """
    spec = _placement(placement)
    if spec.block:
        raise ValueError(f"placement {placement!r} acts on a whole layer: use {spec.block}")
    if placement == "mixln":
        raise ValueError(
            "placement 'mixln' is per layer: resolve it with "
            "layer_placement('mixln', layer_index, num_layers) to 'post' or 'pre' first"
        )
    given = {k: v for k, v in (("norm_out", norm_out), ("alpha", alpha), ("gate", gate))
             if v is not None}
    checks.no_extra(f"placement {placement!r}", given, allowed=spec.keywords)
    for name in spec.keywords:
        if name not in given:
            raise ValueError(f"placement {placement!r} needs {name}=; got None")
    if spec.uses_norm and norm is None:
        raise ValueError(f"placement {placement!r} needs a norm function; got None")
    if not spec.uses_norm and norm is not None:
        raise ValueError(f"placement {placement!r} uses no norm; got norm={norm!r}")
    if placement == "rezero":
        if jnp.shape(gate) != ():
            raise ValueError(f"rezero gate must be a scalar (shape ()); got shape {jnp.shape(gate)}")
        y = x + gate * sublayer(x)
    elif placement == "pre":
        y = x + sublayer(norm(x))
    elif placement == "post":
        y = norm(x + sublayer(x))
    elif placement == "sandwich":
        y = x + norm_out(sublayer(norm(x)))
    elif placement == "reordered":
        y = x + norm(sublayer(x))
    else:  # deepnorm
        y = norm(alpha * x + sublayer(x))
    return jnp.asarray(y).astype(x.dtype)


def _check_fraction(fraction) -> float:
    try:
        f = float(fraction)
    except (TypeError, ValueError):
        raise ValueError(f"mixln_fraction must be a number in [0, 1]; got {fraction!r}") from None
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"mixln_fraction must be in [0, 1]; got {fraction!r}")
    return f


def num_post_layers(num_layers, *, mixln_fraction=0.25):
    """Number of leading post-norm layers in Mix-LN: ``floor(fraction * L)``.

    Li et al. 2024 use Post-LN in the first ``floor(alpha L)`` layers (their
    code compares ``layer_index < POST_NUM``; alpha = 0.25 gives 3 of 12 and 6
    of 24 layers). A 1e-9 slack keeps float products such as 0.29 * 100 from
    rounding down a whole layer.
    """
    checks.integer("num_layers", num_layers, minimum=1)
    f = _check_fraction(mixln_fraction)
    return min(num_layers, math.floor(f * num_layers + 1e-9))


def layer_placement(placement, layer_index, num_layers, *, mixln_fraction=None):
    """The concrete placement of layer ``layer_index`` (0-based) of ``num_layers``.

    ``mixln`` resolves to ``"post"`` for ``layer_index < floor(mixln_fraction *
    num_layers)`` (default fraction 0.25) and ``"pre"`` after (Li et al. 2024);
    every other placement is returned unchanged (``mixln_fraction`` with
    another placement is a ValueError).
    """
    _placement(placement)
    if placement != "mixln" and mixln_fraction is not None:
        raise ValueError(f"placement {placement!r} does not use mixln_fraction; "
                         f"got mixln_fraction={mixln_fraction!r} (only 'mixln' takes it)")
    n_post = num_post_layers(num_layers, mixln_fraction=0.25 if mixln_fraction is None else mixln_fraction)
    if (
        isinstance(layer_index, bool)
        or not isinstance(layer_index, int)
        or not 0 <= layer_index < num_layers
    ):
        raise ValueError(
            f"layer_index must be an integer in [0, {num_layers}); got {layer_index!r}"
        )
    if placement != "mixln":
        return placement
    return "post" if layer_index < n_post else "pre"


def has_final_norm(placement):
    """Whether a decoder with this placement normalises after the last layer.

    pre, sandwich, reordered, mixln, hybrid, hybrid_star, lns: True; post,
    deepnorm, rezero, ngpt: False.
    """
    return _placement(placement).final_norm


def deepnorm_init_gain(num_layers):
    """Xavier-normal gain ``beta = (8L)^(-1/4)`` for DeepNorm (Wang et al. 2022).

    Applies to the value, output and both MLP matrices; the query and key
    projections keep gain 1. L = 12 gives 0.3195.
    """
    return norms.deepnorm_constants(num_layers)[1]
