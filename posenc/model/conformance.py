"""Conformance of an encoding unit: ``check_encoding(name_or_class, **options)``.

Builds a tiny decoder of the unit (2 layers, d_model 32, 4 heads over 2 kv
heads, float32, parameters perturbed by N(0, 0.05^2) so that
zero-initialised ones take part) and runs it through the properties every
encoding has:

- ``dense == blocked``: logits and gradients (parameters and input
  embeddings) of dense and blocked attention (blocks of 4 over 11 tokens:
  the last one partial) agree, at positions with gaps;
- ``cached decoding, token by token`` and ``cached decoding, in pieces``:
  a prefill then one token per call, and two prefills of several tokens,
  give the logits of the full forward pass (and a cache of every token);
- ``shift invariance`` (units that declare ``relative = True``; not under nGPT,
  whose per-dimension s_qk after the rotation is not relative): logits at
  positions moved by 4097 and by 10^6 equal those at 0..L-1 within 1e-4,
  dense and blocked;
- ``causality``: d logits_i / d x_j is 0 for every j > i and not 0 for
  j <= i (through the input embeddings; dense and blocked attention);
- ``finite gradients``: the loss and every parameter gradient are finite,
  and each of the unit's own parameters gets a gradient;
- ``jit and vmap``: every check runs compiled (``jax.jit``); the forward
  vmapped over the examples equals the batched one.

Each check runs even when another fails; failures are collected into one
:class:`EncodingCheckError` whose message lists every check. The tiny
decoder, its inputs and the checks themselves live in
``posenc.model.conformance_checks``; a call takes seconds on a laptop CPU.
Its building blocks are public for tests of single units:
``posenc.model.parity`` (``decode_stepwise``, ``decode_in_pieces``,
``perturb_params``) and ``posenc.model.registry.registered``.
"""

from __future__ import annotations

from posenc.model import conformance_checks, registry

CHECKS = ("dense == blocked", "cached decoding, token by token", "cached decoding, in pieces",
          "shift invariance", "causality", "finite gradients", "jit and vmap")


class EncodingCheckError(AssertionError):
    """Some conformance checks failed; ``failures``: check -> what failed, ``results``: every check."""

    def __init__(self, name: str, results: dict[str, tuple[str, str]]):
        self.name, self.results = name, results
        self.failures = {c: d for c, (status, d) in results.items() if status == "FAIL"}
        lines = [f"encoding {name!r} failed {len(self.failures)} of {len(results)} conformance "
                 "checks (posenc.model.check_encoding):"]
        width = max(len(c) for c in results)
        for check, (status, detail) in results.items():
            lines.append(f"  {status:<6} {check:<{width}}  {detail}")
        super().__init__("\n".join(lines))


def check_encoding(name_or_class, *, model: dict | None = None, seed: int = 0,
                   **options) -> dict[str, str]:
    """Run an encoding (a registered name, or an Encoding subclass) through :data:`CHECKS`.

    ``options``: the unit's options (``model.position.<name>.<option>``);
    ``model``: other ``config.model`` fields of the tiny decoder (e.g.
    ``{"norm": {"placement": "post"}}``); ``seed``: parameters and inputs.
    An unregistered class is registered for the call only. A bad option is a
    ValueError (before anything runs). Returns ``{check: "passed: ..." |
    "skipped: ..."}``; raises :class:`EncodingCheckError` listing every
    check when any fails.
    """
    with registry.registered(name_or_class) as name:
        cls = registry.get(name)
        runner = conformance_checks.Runner(cls, conformance_checks.tiny_specs(name, options, model), seed)
        results = {}
        for check in CHECKS:
            try:
                results[check] = runner.run(check)
            except Exception as e:  # noqa: BLE001  (a check that raises has failed)
                results[check] = ("FAIL", f"raised {type(e).__name__}: {_first_line(e)}")
    if any(status == "FAIL" for status, _ in results.values()):
        raise EncodingCheckError(name, results)
    return {c: f"{status.lower()}: {detail}" for c, (status, detail) in results.items()}


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else repr(e)

