"""Small models for tests: configs of one encoding kind, specs with the training length filled in."""

import os

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.model import ENCODINGS, Decoder, ModelSpec, model_config, parity

# The library's parity drivers (posenc.model.parity), shared by the tests.
decode_stepwise = parity.decode_stepwise
perturb_params = parity.perturb_params

TRAIN_LENGTH = 16  # fills options that take the training length (RoPE original_length, table rows)


def model_cfg(kind="rope", *, position=None, norm=None, **model):
    """``config.model`` with ``kind`` and small sizes; ``position`` sets options of ``kind``'s section.

    iRoPE layers default to a NoPE layer every 2nd layer so that 2-layer models have one.
    """
    c = model_config()
    c.update(vocab_size=16, d_model=32, num_layers=2, num_heads=4)
    c.position.kind = kind
    opts = dict(position or {})
    if kind == "irope":
        opts.setdefault("nope_every", 2)
    if opts:
        c.position[kind].update(opts)
    if norm:
        c.norm.update(norm)
    c.update(model)
    return c


def spec(kind="rope", *, train_length=TRAIN_LENGTH, **kw) -> ModelSpec:
    return ModelSpec.from_config(model_cfg(kind, **kw), train_length=train_length)


def decoder(kind="rope", *, seed=0, train_length=TRAIN_LENGTH, perturb=0.0, **kw) -> Decoder:
    """A Decoder of ``kind``; ``perturb`` > 0 adds N(0, perturb^2) noise to every parameter, so that
    zero-initialised position parameters (CoPE embeddings, ReZero gates) take part in tests."""
    model = Decoder(spec(kind, train_length=train_length, **kw), rngs=nnx.Rngs(seed))
    if perturb:
        perturb_params(model, jax.random.key(seed + 1000), perturb)
    return model


def attention_kinds():
    """Every registered kind that acts inside attention (input-embedding kinds are NoPE there)."""
    return sorted(k for k, cls in ENCODINGS.items() if not cls.acts_at_input())


def tokens(batch=2, length=12, vocab=16, seed=0):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, vocab, jnp.int32)


def decode_in_pieces(model, tokens, first, max_length):
    """One jit: the full forward, a decode of tokens[:, :first] then the rest (and the cache),
    and the full forward at shifted positions 77 + 3 i."""
    g, state = nnx.split(model)

    @jax.jit
    def run(state, tokens):
        m = nnx.merge(g, state)
        out, cache = parity.decode_in_pieces(m, tokens, (first,), max_length)
        return (m(tokens), out[:, :first], out[:, first:], cache,
                m(tokens, 77 + 3 * jnp.arange(tokens.shape[1])))

    return run(state, tokens)


def grid_points(config, study="compare"):
    """Every point of a study config, validated (ConfigError on a bad one): the engine's expansion."""
    from posenc import studies
    from posenc.studies import engine

    return engine.expand(studies.study(study), config)[1]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def study_command(study, config, workdir):
    """The command line of ``python -m posenc <study> --config <study>:<config>``, with the tests' compile cache."""
    import sys

    import jax

    cache = jax.config.jax_compilation_cache_dir or ""
    return [sys.executable, "-m", "posenc", study, f"--config={study}:{config}", f"--workdir={workdir}",
            f"--jax_cache_dir={cache}"]


def kill_during_a_point(command, rng, *, kill=True, timeout=600):
    """Run ``command``, SIGKILL it a random moment after it starts a random point; what it said.

    Returns ``(killed: bool, stderr lines)``; not killed when it ended before the chosen moment
    (or ``kill`` is False: the run to the end, which must succeed).
    """
    import os
    import re
    import signal
    import subprocess
    import threading
    import time

    proc = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    lines, target, killed = [], None, False
    try:
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"\] \[(\d+)/(\d+)\] ", line)
            if m and target is None:
                target = rng.randint(1, int(m.group(2)))
            if kill and m and int(m.group(1)) >= (target or 0):
                time.sleep(rng.uniform(0.0, 1.5))
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
        proc.wait()
    finally:
        watchdog.cancel()
    if not kill and proc.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({proc.returncode}):\n" + "".join(lines[-30:]))
    return killed, lines


def leftovers(workdir):
    """Temporary files and checkpoint directories a killed writer left under ``workdir``."""
    import os

    from posenc.workdir import files

    found = files.stale_temps(workdir)
    for dirpath, dirnames, _ in os.walk(workdir):
        found += [os.path.join(dirpath, d) for d in dirnames if "orbax-checkpoint-tmp" in d]
    return found
