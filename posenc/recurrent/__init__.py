"""Recurrent mixers as pure functions (jax only): the layers that carry order
in a hybrid decoder without a position encoding in attention.

- ``ssd``: Mamba-2's state-space duality scan (chunked and step by step),
  its time step and its gated RMS norm;
- ``gated_delta``: the gated delta rule of Gated DeltaNet / Qwen3-Next
  (chunked and recurrent), its gates and its gated RMS norm;
- ``kda``: Kimi Delta Attention, the gated delta rule with a decay per key
  channel (chunked and recurrent), its gate and its gated RMS norm;
- ``short_conv``: the causal depthwise short convolution before each of them,
  with its cached window, and LFM2's gated convolution block.

Each mixer has a chunked form (training, prefill) and a step form (decoding)
that agree, both returning the final state; a layer's cache is that state
plus the convolution window. Each module is public as ``posenc.<name>``
(see ``posenc/__init__.py``).
"""
