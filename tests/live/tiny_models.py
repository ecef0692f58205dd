"""Tiny hybrid checkpoints for the live CPU server, written at test time.

Each model folder holds a ``config.json`` that both transformers' and SGLang's own config
classes load (SGLang's ``Qwen3NextConfig`` derives its layer pattern from
``full_attention_interval``; its ``NemotronHConfig`` reads ``hybrid_override_pattern`` with
SGLang's layer names), a byte-level tokenizer built with ``tokenizers`` (256 byte tokens
plus the chat special tokens, no merges) and a chat template. ``write_tiny_model`` writes
no weights (the server runs with ``--load-format dummy``); ``write_tiny_weights`` adds
seeded random fp32 weights for the real-forward exactness tests. Nothing is downloaded.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 512  # 256 bytes + specials, padded (the embedding is larger than the tokenizer)
EOS_ID = 256  # <|endoftext|>

# One chat turn per message, Qwen's format; the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

CONFIGS = {
    # Qwen3-Next: 3 GDN layers then one gated full-attention layer, a small MoE.
    "qwen3_next": {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 4, "full_attention_interval": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
        "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32, "decoder_sparse_step": 1,
        "norm_topk_prob": True, "mlp_only_layers": [], "partial_rotary_factor": 0.25,
        "rope_theta": 10000.0, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "bos_token_id": EOS_ID, "eos_token_id": EOS_ID,
        "torch_dtype": "float32",
    },
    # Nemotron-H: Mamba2 / MLP / attention / MLP / Mamba2 / MLP.
    "nemotron_h": {
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
        "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 6, "hybrid_override_pattern": "M-*-M-",
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "attention_head_dim": 16, "mamba_num_heads": 4, "mamba_head_dim": 16,
        # SGLang's MambaMixer2 sizes in_proj from ``mamba_n_groups`` (default 8) while its
        # state shape reads ``n_groups``; transformers reads either: give both, and the
        # other mamba_* names SGLang reads, so both sides build the same layers
        "ssm_state_size": 16, "n_groups": 1, "mamba_n_groups": 1, "conv_kernel": 4,
        "mamba_d_conv": 4, "expand": 1, "mamba_expand": 1, "chunk_size": 64,
        "mlp_hidden_act": "relu2", "layer_norm_epsilon": 1e-5,
        "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "bos_token_id": EOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID,
        "torch_dtype": "float32",
    },
}


def byte_tokenizer() -> Tokenizer:
    """A byte-level BPE with no merges: one token per UTF-8 byte, ids 0-255."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = sorted(alphabet, key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(byte_to_char)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


def _byte_of(ch: str) -> int:
    """GPT-2's byte -> printable character map, inverted."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    extra = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + i): b for i, b in enumerate(extra)})
    return table[ch]


def write_tiny_model(folder: Path, arch: str) -> Path:
    """Write ``arch``'s tiny checkpoint (config + tokenizer) into ``folder``; return it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIGS[arch], indent=1))
    tok = byte_tokenizer()
    assert tok.token_to_id(SPECIALS[0]) == EOS_ID
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": SPECIALS[0],
        "bos_token": None, "pad_token": SPECIALS[0], "chat_template": CHAT_TEMPLATE,
        "model_max_length": 32768, "add_bos_token": False}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS_ID}))
    return folder


# Mamba2 layers whose state is remembered over the live exactness stream's distances:
# transformers' init (A = -1 .. -heads, dt ~ 0.01) forgets a state within ~100 tokens, so
# a state resumed at 256 moved the logprobs of the 8 tokens generated 134 tokens later by
# less than the tolerance (docs/exactness.md, "Live"). arch -> (|A| from, |A| to, dt_bias
# shift): A_log spans log|A| evenly over the heads, dt_bias moves dt to about 0.08.
SLOW_SSM_DECAY = {"nemotron_h": (0.004, 0.02, 2.0)}


def _slow_ssm_decay(model, a_from: float, a_to: float, dt_shift: float) -> None:
    import torch  # heavy: only the real-forward tests write weights

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mixer.A_log"):
                param.copy_(torch.linspace(a_from, a_to, param.numel()).log())
            elif name.endswith("mixer.dt_bias"):
                param.add_(dt_shift)


def write_tiny_weights(folder: Path, arch: str, seed: int = 0, std: float = 0.1) -> Path:
    """Seeded random fp32 weights for ``arch`` in ``folder`` (``model.safetensors``, HF
    names): transformers' own model class initialised with ``initializer_range=std``
    (norms, ``A_log`` and ``dt_bias`` by its own rules, then ``SLOW_SSM_DECAY``). SGLang's
    dummy loader draws U(-1e-3, 1e-3): every logprob is then about -ln V and a wrong
    state moves nothing; at 0.02 the GDN states are so small that a 1% state error stays
    below 1e-6 in the logits (docs/exactness.md), hence 0.1."""
    import torch  # heavy: only the real-forward tests write weights
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = write_tiny_model(folder, arch)
    config = AutoConfig.from_pretrained(folder)
    config.initializer_range = std
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if arch in SLOW_SSM_DECAY:
        _slow_ssm_decay(model, *SLOW_SSM_DECAY[arch])
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "config.json").write_text(json.dumps(CONFIGS[arch], indent=1))
    return folder
