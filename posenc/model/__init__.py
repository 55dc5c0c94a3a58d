"""Flax NNX decoder composing the pure position and norm functions.

    from posenc.model import Decoder, model_config
    model = Decoder(model_config(), rngs=nnx.Rngs(0))

Encodings are units (:class:`Encoding` subclasses) registered by name with
:func:`register_encoding`; built-ins live in ``posenc.model.encodings``, one
module each, and plugins register the same way from anywhere.
:class:`ModelSpec` is the validated form of ``config.model``;
:func:`check_encoding` runs a unit through the conformance checks of
``posenc.model.conformance``.
"""

from posenc.model import encodings as _builtins  # noqa: F401  (registers the built-in units)
from posenc.model.config import model_config
from posenc.model.conformance import EncodingCheckError, check_encoding
from posenc.model.decoder import Decoder
from posenc.model.encoding import Encoding
from posenc.model.options import Option
from posenc.model.registry import ENCODINGS, register_encoding
from posenc.model.spec import ModelSpec


def validate_config(config, *, max_length=None) -> ModelSpec:
    """The :class:`ModelSpec` of ``config.model``; ValueError naming any bad field.

    ``max_length``: the longest sequence the caller will run, checked against
    what the encodings can represent (e.g. a learned table's rows).
    """
    spec = ModelSpec.from_config(config)
    if max_length is not None:
        from posenc.model import registry

        for kind in spec.position.kinds:
            limit = registry.get(kind).longest_sequence(spec.position.options[kind])
            if limit is not None and max_length > limit:
                raise ValueError(f"length {max_length} exceeds what {kind} can represent "
                                 f"({limit} positions, model.position.{kind})")
    return spec


__all__ = ["Decoder", "ENCODINGS", "Encoding", "EncodingCheckError", "ModelSpec", "Option",
           "check_encoding", "model_config", "register_encoding", "validate_config"]
