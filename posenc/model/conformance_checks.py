"""The conformance checks of one encoding unit: a tiny decoder, its inputs and programs, seven properties.

:func:`tiny_specs` builds the decoder of ``posenc.model.check_encoding`` (2
layers, d_model 32, 4 heads over 2 kv heads, float32; dense and blocked
attention, blocks of 4 over 11 tokens, the last one partial) and
:class:`Runner` runs each check of ``posenc.model.conformance.CHECKS`` on it
(``Runner.run(check)`` -> ``(status, detail)``), with parameters perturbed
by N(0, 0.05^2) so that zero-initialised ones take part. Compiles are
shared: one forward-and-gradient program per attention path (called at
every set of positions, and with one cotangent per query for causality),
one for both decodings, one for vmap. Results (and exceptions) are
memoised, so a check that fails does not stop the others.

The ``model`` fields may make the tiny decoder a hybrid (``model.layer_types``,
``posenc.model.mixers``): every check then runs through its recurrent layers
too, whose chunk size, left at its default, becomes :data:`RECURRENT_CHUNK`
(the scans cross chunks, the last one partial; a prefill of 5 starts inside
one), and ``finite gradients`` asks a gradient of every mixer parameter.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.model import config as config_lib
from posenc.model import recurrent_options
from posenc.model.decoder import Decoder
from posenc.model.parity import decode_in_pieces, decode_stepwise, perturb_params
from posenc.model.spec import ModelSpec

B, L, V, BLOCK = 2, 11, 16, 4  # L not a multiple of BLOCK: the last block is partial
MODEL = dict(vocab_size=V, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2)
TRAIN_LENGTH = 64  # fills options that take the training length (a learned table's rows)
PREFILL, CUTS, OFFSET = 5, (4,), 7  # decoding: a prefill then steps; pieces [0, 4) [4, L)
SHIFTS = (4097, 10**6)
RECURRENT_CHUNK = 4  # a recurrent kind's chunk_size left at its default
CHECKED_IMPLS = ("dense", "blocked")
PERTURB = 0.05
TOLERANCE = {  # (rtol, atol) per check
    "dense == blocked": (2e-5, 2e-5),
    "cached decoding": (1e-5, 2e-5),
    "shift invariance": (0.0, 1e-4),
    "jit and vmap": (2e-5, 2e-5),
}


def _axis_positions(positions, key, axes):
    """The named positions on ``axes`` axes: "gappy" with its own gaps per axis; "arange" and
    "decoding" a 2 x 2 grid (the last two axes (row, col), earlier ones its first id) of the first
    ``CUTS[0]`` tokens, then ids continuing after the largest on every axis, as decoding continues
    (``posenc.model.cache.next_positions``)."""
    gaps = jax.random.randint(key, (axes - 1, B, L), 1, 3)
    gappy = jnp.stack([positions["gappy"]] + [positions["gappy"] + jnp.cumsum(g, axis=-1) for g in gaps],
                      axis=-1)
    n = CUTS[0]
    grid = np.zeros((L, axes), np.int32)
    grid[:n, -1] = np.arange(n) % 2
    grid[:n, -2] = np.arange(n) // 2
    grid[n:] = grid[:n].max() + 1 + np.arange(L - n)[:, None]
    arange = jnp.broadcast_to(jnp.asarray(grid), (B, L, axes))
    return {"gappy": gappy.astype(jnp.int32), "arange": arange, "decoding": OFFSET + arange}


def _merge(cfg, fields, prefix="model"):
    for key, value in fields.items():
        if isinstance(value, dict) and key in cfg and hasattr(cfg[key], "keys"):
            _merge(cfg[key], value, f"{prefix}.{key}")
        else:
            cfg[key] = value


def _spec(name, options, model, impl) -> ModelSpec:
    c = config_lib.model_config()
    c.update(MODEL)
    _merge(c, dict(model or {}))
    c.position.kind = name
    if options and name not in c.position:
        raise ValueError(f"encoding {name!r} has no options; got {', '.join(sorted(options))}")
    if options:
        c.position[name].update(options)
    c.update(attention_impl=impl, attention_block=BLOCK)
    _small_chunks(c)
    return ModelSpec.from_config(c, train_length=TRAIN_LENGTH)


def _small_chunks(c) -> None:
    """The chunk size of every recurrent kind in use, left at its default, set to RECURRENT_CHUNK."""
    for kind in dict.fromkeys(c.get("layer_types", ())):
        for section in recurrent_options.SECTIONS.get(kind, ()):
            declared = recurrent_options.options(section).get("chunk_size")
            if declared is not None and c.recurrent[section].chunk_size == declared.default:
                c.recurrent[section].chunk_size = RECURRENT_CHUNK


def tiny_specs(name, options, model) -> dict[str, ModelSpec]:
    """The tiny decoder of encoding ``name`` with its ``options`` and ``model`` fields, per attention
    path of :data:`CHECKED_IMPLS`; ValueError for a bad option or field."""
    return {impl: _spec(name, options, model, impl) for impl in CHECKED_IMPLS}


def _worst(got, want, rtol, atol):
    """(ok, description of the worst element) of ``|got - want| <= atol + rtol |want|`` over trees."""
    got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
    want_leaves = jax.tree.leaves(want)
    worst, where, ok = 0.0, "", True
    for (path, a), b in zip(got_leaves, want_leaves, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        diff = np.abs(a - b)
        bad = ~(diff <= atol + rtol * np.abs(b))  # NaN counts as bad
        d = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff))) if diff.size else 0.0
        if bad.any():
            ok = False
        if d >= worst:
            worst, where = d, jax.tree_util.keystr(path)
    return ok, f"max |difference| {worst:.2g}" + (f" at {where}" if where else "")


def _unit_param_paths(grads):
    """(path, leaf) of the gradients of the encoding units' own parameters."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(grads)[0]:
        keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
        if "encoding" in keys or "input_encoding" in keys:
            out.append((jax.tree_util.keystr(path), leaf))
    return out


def _mixer_param_paths(grads, spec):
    """(path, leaf) of the gradients of the recurrent mixers' parameters (``model.layer_types``)."""
    if spec.recurrent is None:
        return []
    layers = {i for i, t in enumerate(spec.recurrent.layer_types) if t != recurrent_options.ATTENTION}
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(grads)[0]:
        keys = [getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path]
        if len(keys) > 2 and keys[0] == "blocks" and keys[1] in layers and keys[2] == "attn":
            if not (len(keys) > 3 and keys[3] == "attention"):  # Falcon-H1's attention branch: not the mixer's
                out.append((jax.tree_util.keystr(path), leaf))
    return out


class Runner:
    """Shared models, inputs and compiled programs of one check_encoding call."""

    def __init__(self, cls, specs, seed):
        self.cls = cls
        self.sphere = specs["dense"].norm.sphere
        self.spec = specs["dense"]
        models = {impl: Decoder(s, rngs=nnx.Rngs(seed)) for impl, s in specs.items()}
        perturb_params(models["dense"], jax.random.key(seed + 1000), PERTURB)
        self.graphdefs = {impl: nnx.split(m, nnx.Param, ...)[0] for impl, m in models.items()}
        _, self.params, self.rest = nnx.split(models["dense"], nnx.Param, ...)
        keys = jax.random.split(jax.random.key(seed), 3)
        self.tokens = jax.random.randint(keys[0], (B, L), 0, V, jnp.int32)
        # gaps, an offset and a different start per example: positions need not be arange
        gappy = 3 + jnp.cumsum(jax.random.randint(keys[1], (B, L), 1, 3), axis=-1)
        self.positions = {"gappy": (gappy + jnp.arange(B)[:, None]).astype(jnp.int32),
                          "arange": jnp.tile(jnp.arange(L, dtype=jnp.int32), (B, 1))}
        self.positions["decoding"] = OFFSET + self.positions["arange"]
        axes = models["dense"].position_axes
        if axes > 1:  # positions [B, L, A] that differ by axis (a model of M-RoPE, 2D RoPE)
            self.positions = _axis_positions(self.positions, keys[1], axes)
        self.cot = jax.random.normal(keys[2], (B, L, V))
        self.dx = jnp.zeros((B, L, specs["dense"].d_model), jnp.float32)
        self._memo, self._programs = {}, {}

    # -- shared results (memoised, exceptions included) --------------------------------

    def _get(self, key, compute):
        if key not in self._memo:
            try:
                self._memo[key] = ("ok", compute())
            except Exception as e:  # noqa: BLE001
                self._memo[key] = ("error", e)
        status, value = self._memo[key]
        if status == "error":
            raise value
        return value

    def program(self, impl):
        """jit (params, tokens, dx, positions, cot) -> (loss, logits, d params, d dx) of impl's
        model, loss = sum(logits * cot) with dx added to the token embeddings; one per impl."""
        def compile_():
            g, rest = self.graphdefs[impl], self.rest

            @jax.jit
            def program(params, tokens, dx, positions, cot):
                def loss(p, dx):
                    m = nnx.merge(g, p, rest)
                    x = m.embed_tokens(tokens)
                    logits = m.forward_embeddings(x + dx.astype(x.dtype), positions, tokens=tokens)
                    return jnp.sum(logits * cot), logits

                (value, logits), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
                    params, dx)
                return value, logits, grads

            return program
        return self._get(("program", impl), compile_)

    def forward(self, impl, positions="gappy", shift=0):
        """(loss, logits, (d params, d embeddings)) at the named positions (+ shift)."""
        def compute():
            pos = self.positions[positions] + shift
            return jax.device_get(self.program(impl)(self.params, self.tokens, self.dx, pos,
                                                     self.cot))
        return self._get(("forward", impl, positions, shift), compute)

    def decoded(self):
        """((logits, cache length, cache positions) token by token, the same in pieces)."""
        def compute():
            g, rest = self.graphdefs["dense"], self.rest
            max_length = L + 3  # unused slots after the last token

            @jax.jit
            def program(params, tokens, positions):
                m = nnx.merge(g, params, rest)
                out = []
                for logits, cache in (decode_stepwise(m, tokens, PREFILL, max_length, positions),
                                      decode_in_pieces(m, tokens, CUTS, max_length, positions)):
                    out.append((logits, cache["length"], cache["positions"]))
                return out

            return jax.device_get(program(self.params, self.tokens, self.positions["decoding"]))
        return self._get("decoded", compute)

    # -- the checks: each returns (status, detail) -------------------------------------

    def run(self, check):
        return getattr(self, "check_" + re.sub(r"\W+", "_", check).strip("_"))()

    def check_dense_blocked(self):
        rtol, atol = TOLERANCE["dense == blocked"]
        _, want, grads = self.forward("dense")
        _, got, g = self.forward("blocked")
        problems, details = [], []
        for what, a, b in (("logits", got, want), ("parameter gradients", g[0], grads[0]),
                           ("input gradients", g[1], grads[1])):
            ok, detail = _worst(a, b, rtol, atol)
            (details if ok else problems).append(f"{what}: {detail}")
        if problems:
            return "FAIL", (f"blocked attention differs from dense beyond rtol {rtol:g}, "
                            f"atol {atol:g}: " + "; ".join(problems))
        return "passed", "; ".join(details)

    def _check_decoding(self, index, label):
        rtol, atol = TOLERANCE["cached decoding"]
        got, length, cached_positions = self.decoded()[index]
        _, want, _ = self.forward("dense", "decoding")
        ok, detail = _worst(got, want, rtol, atol)
        if not ok:
            return "FAIL", (f"{label}: logits differ from the full forward pass beyond rtol {rtol:g}, "
                            f"atol {atol:g} ({detail})")
        if int(length) != L or not np.array_equal(np.asarray(cached_positions)[:, :L],
                                                  np.asarray(self.positions["decoding"])):
            return "FAIL", f"{label}: the cache holds {int(length)} tokens or other positions"
        return "passed", detail

    def check_cached_decoding_token_by_token(self):
        return self._check_decoding(0, f"a prefill of {PREFILL} then one token per call")

    def check_cached_decoding_in_pieces(self):
        return self._check_decoding(1, f"pieces cut at {', '.join(map(str, CUTS))}")

    def check_shift_invariance(self):
        if not self.cls.relative:
            return "skipped", "the unit does not declare relative = True"
        if self.sphere:
            return "skipped", ("nGPT (placement 'ngpt') scales the rotated q and k per dimension (s_qk, after "
                               "the rotation as NVIDIA/ngpt): its logits are not shift invariant")
        rtol, atol = TOLERANCE["shift invariance"]
        problems, worst = [], []
        for impl in CHECKED_IMPLS:
            _, base, _ = self.forward(impl, "arange")
            if not np.isfinite(base).all():
                problems.append(f"{impl}: logits at positions 0..{L - 1} are not finite")
                continue
            for c in SHIFTS:
                _, moved, _ = self.forward(impl, "arange", c)
                ok, detail = _worst(moved, base, rtol, atol)
                (worst if ok else problems).append(f"{impl} + {c}: {detail}")
        if problems:
            return "FAIL", (f"declares relative = True, but logits at positions moved by "
                            f"{' and '.join(map(str, SHIFTS))} differ from those at 0..{L - 1} "
                            f"beyond {atol:g}: " + "; ".join(problems))
        return "passed", "; ".join(worst)

    def check_causality(self):
        later = np.triu(np.ones((L, L), bool), 1)
        for impl in CHECKED_IMPLS:
            program = self.program(impl)
            rows = []
            for i in range(L):  # |d logits_i / d x_j| summed over batch and features: [L] over j
                cot = jnp.zeros((B, L, V)).at[:, i].set(1.0)
                dx = program(self.params, self.tokens, self.dx, self.positions["gappy"], cot)[2][1]
                rows.append(np.abs(np.asarray(dx)).sum(axis=(0, 2)))
            n = np.stack(rows)  # [i, j]
            if (n[later] != 0).any():
                i, j = np.argwhere(later & (n != 0))[0]
                return "FAIL", f"{impl}: the output at {i} depends on the input at {j} > {i}"
            if not (n[~later] > 0).all():
                i, j = np.argwhere(~later & ~(n > 0))[0]
                return "FAIL", f"{impl}: the output at {i} does not depend on the input at {j} <= {i}"
        return "passed", "d logits_i / d x_j = 0 exactly for j > i, != 0 for j <= i (dense, blocked)"

    def check_finite_gradients(self):
        problems = []
        for impl in CHECKED_IMPLS:
            value, _, grads = self.forward(impl)
            if not np.isfinite(value):
                problems.append(f"{impl}: the loss is {value}")
            for path, leaf in jax.tree_util.tree_flatten_with_path(grads)[0]:
                if not np.isfinite(np.asarray(leaf)).all():
                    what = "the input" if path[0].idx == 1 else jax.tree_util.keystr(path[1:])
                    problems.append(f"{impl}: the gradient of {what} is not finite")
        own = _unit_param_paths(self.forward("dense")[2][0])
        for path, leaf in own:
            if not np.abs(np.asarray(leaf)).max() > 0:
                problems.append(f"the unit's parameter {path} gets no gradient")
        mixer = _mixer_param_paths(self.forward("dense")[2][0], self.spec)
        for path, leaf in mixer:
            if not np.abs(np.asarray(leaf)).max() > 0:
                problems.append(f"the recurrent mixer's parameter {path} gets no gradient")
        if problems:
            return "FAIL", "; ".join(problems)
        return "passed", (f"{len(own)} parameter(s) of the unit" + (f" and {len(mixer)} of the recurrent mixers"
                                                                    if mixer else "")
                          + " get finite, non-zero gradients")

    def check_jit_and_vmap(self):
        rtol, atol = TOLERANCE["jit and vmap"]
        _, want, _ = self.forward("dense")
        g, rest = self.graphdefs["dense"], self.rest

        @jax.jit
        def mapped(params, tokens, positions):  # one example [L] at a time, as a batch of 1
            one = lambda t, p: nnx.merge(g, params, rest)(t[None], p[None])[0]  # noqa: E731
            return jax.vmap(one)(tokens, positions)

        got = mapped(self.params, self.tokens, self.positions["gappy"])
        ok, detail = _worst(got, want, rtol, atol)
        if not ok:
            return "FAIL", (f"the forward vmapped over the examples differs from the jitted batched "
                            f"forward beyond rtol {rtol:g}, atol {atol:g} ({detail})")
        return "passed", f"under jit, and vmapped over the examples: {detail}"
