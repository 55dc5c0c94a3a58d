"""Mixture-of-experts layers as pure functions: the routers of the open
checkpoints, the experts as a grouped matmul, the router losses, and MXFP4
dequantization.

- ``routing``: router logits and the four routers of transformers 5.x:
  softmax then top-k (Mixtral, Qwen3-MoE, OLMoE, Qwen3-Next), top-k then
  softmax (gpt-oss), sigmoid with a selection bias and group-limited top-k
  (DeepSeek-V3, GLM-4.5, Kimi K2), top-k then sigmoid (Llama 4);
- ``experts``: the expert MLPs (SwiGLU, gpt-oss's clamped SwiGLU with
  biases), the routed experts as ``jax.lax.ragged_dot`` over tokens sorted by
  expert (and a dense reference), shared experts with an optional sigmoid
  gate, and ``moe``, router plus experts;
- ``expert_blocks``: the routed experts as one batched matmul over blocks of
  rows sorted by expert (what the model runs by default: XLA:CPU lowers
  ``ragged_dot`` densely, every expert on every row);
- ``router_losses``: the Switch / Mixtral load-balancing loss, the ST-MoE
  router z-loss and DeepSeek-V3's auxiliary-loss-free bias update;
- ``mxfp4``: MXFP4 (E2M1 with a shared E8M0 scale per 32 values)
  dequantization in NumPy, for loading gpt-oss checkpoints on the host.

``routing``, ``experts``, ``expert_blocks`` and ``router_losses`` import only jax and numpy;
``mxfp4`` imports only numpy. Each module is public as ``posenc.<name>``
(see ``posenc/__init__.py``).
"""
