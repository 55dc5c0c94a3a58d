"""The residual block: one decoder layer, attention then MLP, under the layer's norm placement.

A layer of ``model.layers_without_mlp`` has its token mixer's residual alone
(Nemotron-H's mixer blocks with no MLP block after them).

Its sublayers are ``posenc.model.layers``' ``Attention`` (or multi-head latent
attention, ``posenc.model.latent_attention``, with ``model.mla``; or the
layer's recurrent mixer of ``model.layer_types``, ``posenc.model.mixers``, in
its place: ``Block.attn`` is the layer's token mixer) and ``MLP``;
the residual placements are ``posenc.placements`` and the whole-layer ones
``posenc.hybrid_norm``, ``posenc.layernorm_scaling`` and ``posenc.ngpt``;
hyper-connections ``posenc.model.streams``.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from posenc.model import mixers, streams
from posenc.model import moe as moe_lib
from posenc.model.latent_attention import LatentAttention
from posenc.model.layers import MLP, Attention, Norm
from posenc.norms import hybrid_norm, layernorm_scaling, ngpt, norms, placements


class Block(nnx.Module):
    """One decoder layer: attention then MLP, each wrapped by posenc.placements.residual, or a whole-layer
    placement (``Placement.block``: posenc.hybrid_norm.block, posenc.layernorm_scaling.block)."""

    def __init__(self, spec, encoding, *, layer_index, dtype, rngs):
        n = spec.norm
        mix = {"mixln_fraction": n.mixln_fraction} if n.placement == "mixln" else {}
        self.placement = placements.layer_placement(n.placement, layer_index, spec.num_layers, **mix)
        self.layer_index = layer_index
        deep = self.placement == "deepnorm"
        alpha, beta = norms.deepnorm_constants(spec.num_layers) if deep else (None, None)
        self.alpha = alpha
        # nGPT: the official scales (posenc.ngpt.init_params), step sizes alpha_A, alpha_M per layer
        sphere = ngpt.init_params(spec.d_model, spec.vocab_size, mlp_dim=spec.mlp_hidden) if n.sphere else {}
        mixer = spec.layer_type(layer_index)
        if mixer != "attention":  # a recurrent mixer in attention's place (model.layer_types)
            self.attn = mixers.build(mixer, spec, encoding, dtype=dtype, rngs=rngs, layer_index=layer_index,
                                     out_gain=beta)
        elif spec.mla is None:
            self.attn = Attention(spec, encoding, dtype=dtype, vo_gain=beta, rngs=rngs,
                                  layer_index=layer_index, sqk=sphere.get("sqk"))
        else:  # multi-head latent attention (model.mla): its own projections and cache
            self.attn = LatentAttention(spec, encoding, dtype=dtype, vo_gain=beta, rngs=rngs,
                                        layer_index=layer_index)
        self.parallel = spec.parallel_residual
        self.has_mlp = spec.has_mlp(layer_index)  # model.layers_without_mlp: the mixer's residual alone
        if not self.has_mlp:
            self.mlp = None
        elif moe_lib.is_moe(spec, layer_index):  # model.moe: a router and experts (posenc.model.moe)
            self.mlp = moe_lib.MoEMLP(spec.moe, spec.d_model, gain=beta, rngs=rngs)
        else:
            self.mlp = MLP(spec.mlp, spec.d_model, spec.mlp_hidden, dtype=dtype, gain=beta, rngs=rngs,
                           bias=spec.bias == "all", suv=sphere.get("suv"))
        self.steps = (nnx.Dict({k: nnx.Param(sphere[f"alpha_{k}"]) for k in ("attn", "mlp")}) if sphere
                      else None)
        self.step_scaling = ngpt.base_scale(spec.d_model)
        normless = not placements.PLACEMENTS[self.placement].uses_norm

        def norm():
            return None if normless else Norm.of(n, spec.d_model)

        # HybridNorm's attention reads the stream itself (its q, k, v are normed); HybridNorm*'s
        # first layer is pre-norm.
        hybrid = self.placement in ("hybrid", "hybrid_star")
        self.norm1 = None if hybrid and not (self.placement == "hybrid_star" and layer_index == 0) else norm()
        self.norm2 = norm() if self.has_mlp else None
        sandwich = self.placement == "sandwich"
        self.norm1_out = norm() if sandwich else None
        self.norm2_out = norm() if sandwich and self.has_mlp else None
        # ReZero: one gate per layer, shared by its attention and MLP (the reference's resweight).
        self.gate = nnx.Param(jnp.zeros((), jnp.float32)) if self.placement == "rezero" else None
        self.residual_multiplier = spec.residual_multiplier
        self.dropout = nnx.Dropout(spec.dropout, rngs=rngs)
        # Hyper-connections (model.residual_streams n > 1) of model.hyper_connections' kind around each
        # pre-norm sublayer (posenc.model.streams); dynamic HC reads the streams through a norm of
        # model.norm.kind.
        n_streams, self.hc_kind, self.hc_eps = spec.residual_streams, spec.hyper_connections, n.eps
        self.hc = None if n_streams == 1 else nnx.List([
            streams.sublayer_params(self.hc_kind, n_streams, spec.d_model, sublayer_index=2 * layer_index + j,
                                    rngs=rngs) for j in range(2)])
        self.hc_norms = (nnx.List([Norm.of(n, spec.d_model) for _ in range(2)])
                         if n_streams > 1 and streams.needs_norm(self.hc_kind) else None)

    def _scaled(self, branch):
        """``branch`` times model.residual_multiplier (float32 product; the residual sum casts back)."""
        m = self.residual_multiplier
        if m == 1.0:
            return branch
        return lambda h: branch(h).astype(jnp.float32) * m

    def _residual(self, x, sublayer, norm, norm_out):
        kw = {}
        if self.placement == "sandwich":
            kw["norm_out"] = self._scaled(norm_out)  # the branch ends in N_out
        elif self.placement == "deepnorm":
            kw["alpha"] = self.alpha
        elif self.placement == "rezero":
            kw["gate"] = self.gate[...].astype(x.dtype)
        if self.placement == "reordered":  # the branch is N(F(x))
            norm = self._scaled(norm)
        elif self.placement != "sandwich":
            sublayer = self._scaled(sublayer)
        return placements.residual(self.placement, x, sublayer, norm, **kw)

    def __call__(self, x, attend, *, deterministic):
        """x [B, L, D]; ``attend(h) -> (y, stats)`` runs this layer's attention on h. -> (x, stats): the
        attention's stats, and a MoE MLP's ``routing`` (posenc.model.moe)."""
        stats = {}

        def attn_sub(h):
            y, s = attend(self.attn, h)
            stats.update(s or {})
            return self.dropout(y, deterministic=deterministic)

        def mlp_sub(h):
            y = self.mlp(h)
            if isinstance(y, tuple):  # a MoE MLP also gives its Routing, which the decoder collects
                y, stats["routing"] = y
            return self.dropout(y, deterministic=deterministic)

        if self.parallel:  # GPT-NeoX: both sublayers read the same input
            a, m = self._scaled(attn_sub)(self.norm1(x)), self._scaled(mlp_sub)(self.norm2(x))
            return (x + a + m).astype(x.dtype), stats
        if self.hc is not None:  # x: the streams [B, L, n, D]
            for j, (sub, norm) in enumerate(((attn_sub, self.norm1), (mlp_sub, self.norm2))):
                x = streams.block(self.hc_kind, x, self.hc[j], lambda h, s=sub, nm=norm: self._scaled(s)(nm(h)),
                                  norm=None if self.hc_norms is None else self.hc_norms[j], eps=self.hc_eps)
            return x, stats
        if self.steps is not None:
            return ngpt.block(x, attn_sub, mlp_sub, self.steps["attn"][...], self.steps["mlp"][...],
                              alpha_scaling=self.step_scaling), stats
        if self.placement == "lns":
            return layernorm_scaling.block(x, self._scaled(attn_sub), self._scaled(mlp_sub), self.norm1,
                                           self.norm2, layer_index=self.layer_index), stats
        if self.placement in ("hybrid", "hybrid_star"):
            return hybrid_norm.block(x, self._scaled(attn_sub), self._scaled(mlp_sub), self.norm2,
                                     attention_norm=self.norm1), stats
        x = self._residual(x, attn_sub, self.norm1, self.norm1_out)
        if self.has_mlp:
            x = self._residual(x, mlp_sub, self.norm2, self.norm2_out)
        return x, stats
