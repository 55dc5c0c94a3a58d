"""posenc.hf: tiny checkpoints of the HF families load into the Decoder and give transformers' logits.

Fixtures: tests/data/hf_models/<family>/ (config.json, model.safetensors, logits.npz), made by
tests/data/make_hf_fixtures.py with transformers 5.24.0 (random weights, eager float32 attention,
inputs past every sliding window and chunk). Both the full forward pass and cached decoding one
token per call (from an empty cache) must give HF's logits within 1e-4.
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("safetensors")
from posenc import hf  # noqa: E402
from posenc.model import ModelSpec  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data", "hf_models")
# Fixtures whose loaders are still to come: out of FAMILIES (and the loading tests) until their family
# module is registered.
UNLOADED: set[str] = set()
FAMILIES = sorted(set(os.listdir(DATA)) - UNLOADED)
TOL = 1e-4
# Phi-3's LongRoPE switches to its long factors once the sequence passes 16 tokens (the fixture's
# original length). posenc's cache then rotates every cached key with the long factors; HF keeps the
# keys (and later layers' hidden states) made before the switch. The two cached decodings agree up
# to the switch; past it the full forward pass is the reference (tested above it).
CACHED_UPTO = {"phi3": 16}


def _fixture(family):
    z = np.load(os.path.join(DATA, family, "logits.npz"))
    return {k: z[k] for k in z.files}


def _full_and_cached(model, tokens):
    """One jit: the full forward, and cached decoding one token per step (a scan) from empty."""
    g, state = nnx.split(model)

    @jax.jit
    def run(state, tokens):
        m = nnx.merge(g, state)

        def step(cache, tok):
            out, cache = m.decode(tok[:, None], cache)
            return cache, out[:, 0]

        _, steps = jax.lax.scan(step, m.init_cache(tokens.shape[0], tokens.shape[1]), tokens.T)
        return m(tokens), jnp.swapaxes(steps, 0, 1)

    return run(state, jnp.asarray(tokens))


def test_fixtures_cover_the_families():
    """One fixture per registered model_type: a family module (posenc.hf.families) comes with its fixture."""
    types = []
    for f in FAMILIES:
        with open(os.path.join(DATA, f, "config.json")) as config:
            types.append(json.load(config)["model_type"])
    assert sorted(set(types)) == sorted(hf.registry.FAMILIES)  # every family the loader has (folders may share one)
    assert UNLOADED <= set(os.listdir(DATA))  # the fixtures still waiting for their loaders exist
    assert {"llama", "gemma3_text", "llama4_text", "qwen3_next", "deepseek_v3", "bloom"} <= set(types)


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoint_gives_hf_logits_full_and_cached(family):
    z = _fixture(family)
    model = hf.load(os.path.join(DATA, family))
    full, cached = _full_and_cached(model, z["tokens"])
    err = float(np.abs(np.asarray(full) - z["logits"]).max())
    assert err < TOL, (family, err)
    upto = CACHED_UPTO.get(family, z["tokens"].shape[1])
    err = float(np.abs(np.asarray(cached)[:, :upto] - z["cached_logits"][:, :upto]).max())
    assert err < TOL, (family, err)
    # The reference is not flat: the logits differ across positions and from the HF cached tail.
    assert float(np.abs(z["logits"]).max()) > 1.0


def test_phi3_longrope_switch_is_in_the_fixture():
    """Past the original length the full forward pass uses the long factors (HF's prefix logits
    change there), and posenc's cached step from then on equals HF's prefix forward pass."""
    z = _fixture("phi3")
    assert float(np.abs(z["logits"] - z["prefix_logits"])[:, :16].max()) > 1e-2
    model = hf.load(os.path.join(DATA, "phi3"))
    cache = model.init_cache(2, 20)
    _, cache = model.decode(jnp.asarray(z["tokens"][:, :17]), cache)  # one pass past the switch
    out, _ = model.decode(jnp.asarray(z["tokens"][:, 17:18]), cache)
    # keys of the first pass are already long-rotated, as HF's full pass of 18 tokens
    np.testing.assert_allclose(np.asarray(out[:, 0]), z["prefix_logits"][:, 17], atol=TOL, rtol=0)


@pytest.mark.parametrize("family,overrides", [
    ("gemma3", {"model.attention_impl": "blocked", "model.attention_block": 8}),
    ("llama4", {"model.attention_impl": "blocked", "model.attention_block": 8}),
    ("cohere2", {"model.attention_impl": "blocked", "model.attention_block": 8}),
])
def test_blocked_attention_with_windows_and_chunks(family, overrides):
    z = _fixture(family)
    model = hf.load(os.path.join(DATA, family), overrides=overrides)
    got = np.asarray(jax.jit(lambda t: model(t))(jnp.asarray(z["tokens"])))
    assert float(np.abs(got - z["logits"]).max()) < TOL


def test_config_of_gemma3_and_llama4():
    g = hf.config(os.path.join(DATA, "gemma3"))
    assert (g.attention_span, g.attention_window, g.global_every) == ("window", 8, 6)
    assert g.position.rope.base == 10000.0 and g.norm.kind == "rms_offset"
    assert g.position.layers == ({"layers": (5,), "rope.base": 1e6, "rope.scaling": "linear",
                                  "rope.factor": 8.0},)
    assert g.attention_scale == pytest.approx(16 ** -0.5) and g.norm.qk_norm == "rms"
    spec = ModelSpec.from_config(g)
    assert [o["base"] for o in spec.position.layer_options] == [1e4] * 5 + [1e6]
    l4 = hf.config(os.path.join(DATA, "llama4"))
    assert l4.position.layers == ({"layers": (3,), "kind": "nope"},)
    assert (l4.attention_span, l4.attention_chunk, l4.global_every) == ("chunk", 8, 4)
    assert (l4.norm.qk_norm, l4.norm.qk_norm_layers, l4.norm.qk_norm_after_rope) == (
        "rms_plain", "positional", True)
    assert (l4.logit_scale.kind, l4.logit_scale.floor_scale) == ("temperature", 4.0)
    assert l4.position.rope.layout == "interleaved" and l4.position.rope.base == 500000.0


def test_config_of_the_families_with_layer_patterns():
    """Each family's layer pattern as posenc fields: windows, NoPE layers, per-layer RoPE, norms."""
    o2 = hf.config(os.path.join(DATA, "olmo2"))
    assert (o2.norm.placement, o2.norm.qk_norm, o2.position.rope.base) == ("reordered", "rms_full", 5e5)
    o3 = hf.config(os.path.join(DATA, "olmo3"))  # 3 window layers : 1 global with YaRN
    assert (o3.attention_span, o3.attention_window, o3.global_every) == ("window", 8, 4)
    assert o3.position.rope.scaling == "default"
    assert o3.position.layers == ({"layers": (3,), "rope.scaling": "yarn", "rope.factor": 4.0,
                                   "rope.original_length": 16},)
    s3 = hf.config(os.path.join(DATA, "smollm3"))
    assert s3.position.layers == ({"layers": (3,), "kind": "nope"},) and s3.attention_span == "full"
    q3 = hf.config(os.path.join(DATA, "qwen3"))
    assert (q3.norm.qk_norm, q3.layer_spans, q3.bias) == ("rms", ("full", "window"), "none")
    e4 = hf.config(os.path.join(DATA, "exaone4"))  # the global layers of a windowed EXAONE are NoPE
    assert e4.position.layers == ({"layers": (3,), "kind": "nope"},) and e4.global_every == 4
    assert (e4.norm.placement, e4.norm.qk_norm, e4.position.rope.scaling) == ("reordered", "rms", "llama3")
    g4 = hf.config(os.path.join(DATA, "glm4"))
    assert (g4.norm.placement, g4.bias, g4.position.rope.layout, g4.position.rope.rotary_fraction) == (
        "sandwich", "qkv", "interleaved", 0.5)
    qn = hf.config(os.path.join(DATA, "qwen3_next"))  # full-attention layers only, dense MLPs
    assert (qn.attention_gate, qn.norm.kind, qn.norm.qk_norm, qn.attention_span) == (
        "elementwise", "rms_offset", "rms", "full")
    assert (qn.position.rope.rotary_fraction, qn.position.rope.base, qn.bias) == (0.25, 1e6, "none")
    ds = hf.config(os.path.join(DATA, "deepseek_v3"))  # dense layers: MLA, YaRN on the rotary parts
    assert dict(ds.mla) == {"kv_lora_rank": 8, "q_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                            "v_head_dim": 6, "absorb": True}
    assert (ds.position.rope.layout, ds.position.rope.scaling, ds.position.rope.mscale_all_dim) == (
        "interleaved", "yarn", 0.8)
    # transformers' yarn_apply_mscale: 12^-1/2 times (0.1 * 0.8 * ln 4 + 1)^2
    assert ds.attention_scale == pytest.approx(12 ** -0.5 * (0.08 * np.log(4.0) + 1.0) ** 2)
    c2 = hf.config(os.path.join(DATA, "cohere2"))
    assert c2.position.layers == ({"layers": (3,), "kind": "nope"},)
    assert (c2.norm.kind, c2.parallel_residual, c2.logits_multiplier, c2.tie_embeddings) == (
        "layer_nobias", True, 0.5, True)


def test_config_of_the_hybrids():
    """Each hybrid's mixers per layer (model.layer_types) and the options that tell the families apart."""
    want = {"qwen3_next_linear": ("gated_deltanet", "attention", "gated_deltanet"),
            "qwen3_5": ("gated_deltanet", "attention", "gated_deltanet"),
            "granitemoehybrid": ("mamba2", "attention", "mamba2"), "bamba": ("mamba2", "attention", "mamba2"),
            "nemotron_h": ("mamba2", "attention"), "falcon_h1": ("parallel_mamba2",) * 2,
            "lfm2": ("short_conv", "attention", "short_conv"), "kimi_linear": ("kda", "attention")}
    c = {f: hf.config(os.path.join(DATA, f)) for f in want}
    assert {f: tuple(m.layer_types) for f, m in c.items()} == want
    assert c["qwen3_next_linear"].recurrent.gated_deltanet.projections == "qkvz"
    assert c["qwen3_5"].recurrent.gated_deltanet.projections == "split"
    assert (c["nemotron_h"].recurrent.mamba2.norm, c["nemotron_h"].mlp) == ("grouped", "relu2")
    assert c["falcon_h1"].recurrent.mamba2.norm == "none"
    assert c["falcon_h1"].recurrent.parallel_mamba2.ssm_multipliers == (0.5, 0.8, 1.2, 1.5, 0.7)
    g = c["granitemoehybrid"]
    assert (g.embedding_multiplier, g.residual_multiplier, g.attention_scale, g.logits_multiplier) == (
        2.0, 0.5, 0.2, 0.5)
    assert (c["kimi_linear"].position.kind, c["kimi_linear"].mla.kv_lora_rank) == ("nope", 8)


def test_every_familys_preset_is_a_valid_model_on_its_own():
    import ml_collections

    from posenc.config import overrides
    from posenc.model import model_config, presets

    for name in sorted({f.preset for f in hf.registry.FAMILIES.values()}):
        c = ml_collections.ConfigDict({"model": model_config()})
        overrides.apply(c, presets.get(name), where=name)
        spec = ModelSpec.from_config(c.model, train_length=16)
        assert spec.num_layers >= (1 if name == "falcon_h1" else 2), name  # Falcon-H1's period: one layer


def _copy(family, tmp_path, edit):
    out = tmp_path / family
    shutil.copytree(os.path.join(DATA, family), out)
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_an_override_of_the_scaling_resets_the_checkpoints_scaling_options():
    llama = os.path.join(DATA, "llama")  # Llama 3 scaling: factor 8, original_length 16
    rope = hf.config(llama).position.rope
    assert (rope.scaling, rope.factor, rope.original_length, rope.high_freq_factor) == ("llama3", 8.0, 16, 4.0)
    ntk = hf.config(llama, overrides={"model.position.rope.scaling": "ntk",
                                      "model.position.rope.factor": 4.0}).position.rope
    assert (ntk.scaling, ntk.factor, ntk.original_length, ntk.high_freq_factor) == ("ntk", 4.0, 0, 4.0)
    assert ntk.low_freq_factor == 1.0 and ntk.base == rope.base  # defaults; the checkpoint's base stays
    yarn = hf.config(llama, overrides={"model.position.rope.scaling": "yarn", "model.position.rope.factor": 4.0,
                                       "model.position.rope.original_length": 16}).position.rope
    assert (yarn.scaling, yarn.original_length) == ("yarn", 16)
    for model in (ntk, yarn):
        hf.load(llama, overrides={f"model.position.rope.{k}": v for k, v in model.items()
                                  if k in ("scaling", "factor", "original_length")})


def test_transformers_4_config_format_reads_the_same(tmp_path):
    """rope_theta / rope_scaling at the top level (4.x, most hub configs) = rope_parameters (5.x)."""
    def old_style(cfg):
        p = cfg.pop("rope_parameters")
        cfg["rope_theta"] = p.pop("rope_theta")
        cfg["rope_scaling"] = p

    for family in ("llama", "phi3"):
        old = hf.config(_copy(family, tmp_path, old_style))
        assert old.to_dict() == hf.config(os.path.join(DATA, family)).to_dict()

    def gemma3_old(cfg):
        p = cfg.pop("rope_parameters")
        cfg.update(rope_theta=p["full_attention"]["rope_theta"],
                   rope_local_base_freq=p["sliding_attention"]["rope_theta"],
                   rope_scaling={"rope_type": "linear", "factor": 8.0})
        del cfg["layer_types"]  # the old sliding_window_pattern (6) gives the same layers

    old = hf.config(_copy("gemma3", tmp_path, gemma3_old))
    assert old.to_dict() == hf.config(os.path.join(DATA, "gemma3")).to_dict()

    def olmo3_old(cfg):  # one rope_theta; rope_scaling is the global layers'
        p = cfg.pop("rope_parameters")
        cfg.update(rope_theta=p["sliding_attention"]["rope_theta"],
                   rope_scaling={k: v for k, v in p["full_attention"].items() if k != "rope_theta"})

    old = hf.config(_copy("olmo3", tmp_path, olmo3_old))
    assert old.to_dict() == hf.config(os.path.join(DATA, "olmo3")).to_dict()

    def qwen3_next_old(cfg):  # the hub's form: rope_theta and partial_rotary_factor at the top
        p = cfg.pop("rope_parameters")
        cfg.update(rope_theta=p["rope_theta"], partial_rotary_factor=p["partial_rotary_factor"])

    old = hf.config(_copy("qwen3_next", tmp_path, qwen3_next_old))
    assert old.to_dict() == hf.config(os.path.join(DATA, "qwen3_next")).to_dict()


@pytest.mark.parametrize("family,edit,message", [
    ("llama", lambda c: c.update(model_type="mamba"), r"unsupported architecture model_type='mamba'"),
    ("llama", lambda c: c.update(model_type="deepseek_v4"),
     r"unsupported architecture model_type='deepseek_v4': its compressed attention .* hash routing"),
    ("llama4", lambda c: c.update(model_type="llama4"),
     r"unsupported architecture model_type='llama4': .*vision tower"),
    ("llama", lambda c: c.update(hidden_act="relu"), r"unsupported field hidden_act='relu'"),
    ("llama", lambda c: c["rope_parameters"].update(rope_type="su"), r"unsupported field rope_type='su'"),
    ("smollm3", lambda c: c.update(layer_types=["sliding_attention"] * 4, sliding_window=8),
     r"unsupported field use_sliding_window=False"),
    ("cohere2", lambda c: c.update(sliding_window=None), r"unsupported field sliding_window=None"),
    ("qwen3_next", lambda c: c.update(layer_types=["linear_attention", "sliding_attention"]),
     r"unsupported field layer_types=.*layer type 'sliding_attention'"),
    ("qwen3_next_linear", lambda c: c.update(hidden_act="gelu"), r"unsupported field hidden_act='gelu'"),
    ("granitemoehybrid", lambda c: c.update(position_embedding_type="alibi"),
     r"unsupported field position_embedding_type='alibi'"),
    ("nemotron_h", lambda c: c.update(layers_block_type=["linear_attention", "full_attention", "mlp", "mlp"]),
     r"unsupported field layers_block_type=.*block 3 \('mlp'\) follows no mixer block"),
    ("nemotron_h", lambda c: c.update(layers_block_type=["linear_attention", "moe"]),
     r"unsupported field layers_block_type=.*blocks \[1\] are mixture-of-experts"),
    ("falcon_h1", lambda c: c.update(projectors_bias=True), r"unsupported field projectors_bias=True"),
    ("lfm2", lambda c: c.update(layer_types=["conv", "sliding_attention", "conv"]),
     r"unsupported field layer_types=.*layer type 'sliding_attention'"),
    ("kimi_linear", lambda c: c.update(mlp_layer_types=["dense", "sparse"]),
     r"unsupported field mlp_layer_types=.*layers \[1\] are mixture-of-experts"),
    ("deepseek_v3_moe", lambda c: c.update(scoring_func="softmax"), r"unsupported field scoring_func='softmax'"),
    ("deepseek_v3_moe", lambda c: c.update(moe_layer_freq=2), r"unsupported field moe_layer_freq=2"),
    ("gpt_oss_mxfp4", lambda c: c["quantization_config"].update(quant_method="fp8"),
     r"unsupported field quantization_config=.*MXFP4"),
    ("olmoe", lambda c: c.update(clip_qkv=8.0), r"unsupported field clip_qkv=8.0"),
    ("deepseek_v3", lambda c: c.update(attention_bias=True), r"unsupported field attention_bias=True"),
    ("deepseek_v3", lambda c: c.update(num_key_value_heads=2), r"unsupported field num_key_value_heads=2"),
])
def test_unsupported_architecture_or_field_is_one_line(tmp_path, family, edit, message):
    with pytest.raises(ValueError, match=message) as err:
        hf.load(_copy(family, tmp_path, edit))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("family,layer", [("deepseek_v3_moe", 3), ("glm4_moe", 2)])
def test_multi_token_prediction_weights_are_refused_in_one_line(tmp_path, family, layer):
    """The layer past num_hidden_layers that num_nextn_predict_layers describes has no place in the decoder."""
    from safetensors.numpy import load_file, save_file

    out = _copy(family, tmp_path, lambda c: None)
    tensors = load_file(str(out / "model.safetensors"))
    tensors[f"model.layers.{layer}.eh_proj.weight"] = np.ones((4, 8), np.float32)
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"unsupported field num_nextn_predict_layers=1 .*layer\(s\) {layer},"
                       ) as err:
        hf.load(out)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("family,default", [("qwen3_moe", False), ("olmoe", False), ("qwen3_next_moe", True)])
def test_a_config_without_norm_topk_prob_takes_transformers_default(tmp_path, family, default):
    assert hf.config(os.path.join(DATA, family)).moe.norm_topk_prob == _fixture_config(family)["norm_topk_prob"]
    cfg = hf.config(_copy(family, tmp_path, lambda c: c.pop("norm_topk_prob")))
    assert cfg.moe.norm_topk_prob is default


def _fixture_config(family):
    with open(os.path.join(DATA, family, "config.json")) as f:
        return json.load(f)


def test_assign_sets_the_correction_bias_of_a_built_model():
    """params + assign on a Decoder built from the config: DeepSeek-V3's e_score_correction_bias (a
    variable, not a Param) is set with the parameters, and the logits are transformers'."""
    from posenc.model import Decoder, ModelSpec

    path = os.path.join(DATA, "deepseek_v3_moe")
    spec = ModelSpec.from_config(hf.config(path))
    model = hf.assign(Decoder(spec, rngs=nnx.Rngs(0)), hf.params(path, spec))
    z = _fixture("deepseek_v3_moe")
    assert float(np.abs(np.asarray(model.blocks[1].mlp.e_score_correction_bias[...])).max()) > 0
    assert float(np.abs(np.asarray(jax.jit(model)(jnp.asarray(z["tokens"]))) - z["logits"]).max()) < TOL


def test_qwen3_next_with_every_layer_in_mlp_only_layers_loads_dense(tmp_path):
    """Experts in the config but none in a layer (mlp_only_layers): the dense checkpoint's logits."""
    z = _fixture("qwen3_next")
    out = _copy("qwen3_next", tmp_path, lambda c: c.update(num_experts=8, mlp_only_layers=[0, 1]))
    got = np.asarray(jax.jit(hf.load(out))(jnp.asarray(z["tokens"])))
    assert float(np.abs(got - z["logits"]).max()) < TOL


def test_missing_or_extra_tensors_are_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    out = _copy("mistral", tmp_path, lambda c: None)
    tensors = load_file(str(out / "model.safetensors"))
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)  # ignored
    tensors["model.extra.weight"] = np.ones(3, np.float32)
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match=r"no place for: \['model.extra.weight'\]"):
        hf.load(out)
    del tensors["model.extra.weight"], tensors["model.norm.weight"]
    save_file(tensors, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match=r"no tensor 'model.norm.weight'"):
        hf.load(out)


def test_tokenize_writes_the_tokenizers_ids(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    lines = ["the quick brown fox jumps over the lazy dog", "positional encodings extend context",
             "rotary embeddings rotate queries and keys", "the dog sleeps; the fox runs"] * 3
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300, special_tokens=["[UNK]"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    text = "\n".join(lines) + "\n"
    (tmp_path / "corpus.txt").write_text(text)
    n = hf.tokenize(tmp_path / "corpus.txt", tmp_path / "tokenizer.json", tmp_path / "train.bin",
                    chunk_bytes=50)
    ids = np.fromfile(tmp_path / "train.bin", np.uint16)
    assert n == ids.size > 20
    want = tok.encode(text, add_special_tokens=False).ids
    assert ids.tolist() == want  # pieces end at newlines: the same ids as one pass here
    assert tok.decode(ids.tolist()) == text
    assert (hf.token_dtype(65536), hf.token_dtype(65537)) == ("uint16", "uint32")
    from posenc import tasks
    task = tasks.make("text", tokens=str(tmp_path / "train.bin"), eval_fraction=0.2)
    assert task.vocab_size == max(want) + 1
    big = np.array([7, 70000, 151643] * 40, np.uint32)  # a Qwen-sized vocabulary needs uint32
    big.tofile(tmp_path / "big.bin")
    task = tasks.make("text", tokens=str(tmp_path / "big.bin"), token_dtype="uint32",
                      eval_fraction=0.2)
    assert task.vocab_size == 151644
    with pytest.raises(ValueError, match="is not a file"):
        hf.tokenize(tmp_path / "missing.txt", tmp_path / "tokenizer.json", tmp_path / "x.bin")
