"""A tiny random-init Qwen2 and its tokenizer, built locally: nothing is downloaded.

The tokenizer is a byte-level BPE (``tokenizers``) with Qwen's ChatML special tokens and chat
template, because verl's Continuous Token builder for ``model_type=qwen2`` requires ``<|im_end|>``
and a one-token newline. The model is ``Qwen2ForCausalLM`` from a small config with eager
attention (no flash-attn on CPU).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass(frozen=True)
class TinyModelSpec:
    vocab_size: int = 320  # 256 bytes + 3 specials + a few merges
    hidden_size: int = 48
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 256
    seed: int = 0


def _corpus() -> list[str]:
    from .toy_task import corpus_for_tokenizer

    return corpus_for_tokenizer()


def build_tokenizer(out_dir: str, vocab_size: int = 320):
    """Train a byte-level BPE on the toy task's text and save it as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHATML_TEMPLATE,
        model_max_length=4096,
    )
    hf_tok.save_pretrained(out_dir)
    return hf_tok


def build_tiny_model(out_dir: str, spec: TinyModelSpec = TinyModelSpec(), overwrite: bool = False) -> str:
    """Write tokenizer + random-init Qwen2 to ``out_dir`` (idempotent unless ``overwrite``)."""
    marker = os.path.join(out_dir, "tiny_model_spec.json")
    if not overwrite and os.path.exists(marker):
        with open(marker) as f:
            if json.load(f) == asdict(spec):
                return out_dir
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    os.makedirs(out_dir, exist_ok=True)
    tok = build_tokenizer(out_dir, spec.vocab_size)
    eos_ids = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=eos_ids[1],
        eos_token_id=eos_ids[0],
        pad_token_id=eos_ids[1],
        attn_implementation="eager",
        dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out_dir)
    GenerationConfig(eos_token_id=eos_ids, pad_token_id=eos_ids[1], bos_token_id=eos_ids[1]).save_pretrained(out_dir)
    with open(marker, "w") as f:
        json.dump(asdict(spec), f)
    return out_dir


def count_parameters(model_dir: str) -> int:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return sum(p.numel() for p in model.parameters())
