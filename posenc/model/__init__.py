"""Flax NNX decoder composing the pure position and norm functions.

``Decoder(config.model, rngs=nnx.Rngs(seed))`` and ``validate_config``;
the model config fields are in ``posenc.model.config``.
"""

from posenc.model.decoder import Decoder
from posenc.model.encodings import REGISTRY
from posenc.model.validate import validate_config

__all__ = ["Decoder", "REGISTRY", "validate_config"]
