"""The causal LM side: load any ``AutoModelForCausalLM``, build the tiny local default, score and sample.

Nothing here downloads: the default model is a 2-layer Llama configured locally with a character-level
tokenizer, pre-trained briefly on the task's demonstrations and cached as an ordinary Hugging Face
directory (``save_pretrained``), so the trainer loads the default and a real model (``--model NAME``)
through the same ``from_pretrained`` path.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from reference_impl.isreshape.lm import task as task_mod

DTYPES = {"float64": torch.float64, "fp64": torch.float64, "float32": torch.float32, "fp32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
          "fp16": torch.float16, "float16": torch.float16}


def dtype_of(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def char_tokenizer():
    """A character-level ``PreTrainedTokenizerFast`` over the task's characters (built, not downloaded)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(task_mod.SPECIALS + task_mod.CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>")


def tiny_config(vocab_size: int, *, hidden: int, layers: int, heads: int, max_positions: int):
    """A small Llama (RoPE, SwiGLU, RMSNorm): the architecture family of most RL-for-LLM work."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=4 * hidden,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                       max_position_embeddings=max_positions, tie_word_embeddings=True,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)


def load(path: str, *, device: torch.device, dtype: torch.dtype):
    """(model, tokenizer) from a name or a directory; a missing pad token falls back to eos."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    old = tuple(int(v) for v in transformers.__version__.split(".")[:2]) < (4, 56)  # `dtype` was `torch_dtype`
    model = AutoModelForCausalLM.from_pretrained(path, **{"torch_dtype" if old else "dtype": dtype}).to(device)
    return model, tok


def frozen_copy(model, dtype: torch.dtype | None = None):
    """A detached copy (the reference model, or the behaviour model in its sampling dtype)."""
    m = copy.deepcopy(model)
    if dtype is not None:
        m = m.to(dtype)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions count real tokens only, so left padding does not shift them."""
    return (attention_mask.cumsum(-1) - 1).clamp_min(0)


def response_logits(model, prompt_ids, prompt_mask, response_ids) -> torch.Tensor:
    """Logits [N, T, V] that predict each response token, in one forward pass over prompt + response."""
    ids = torch.cat([prompt_ids, response_ids], 1)
    attn = torch.cat([prompt_mask, torch.ones_like(response_ids)], 1)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids(attn)).logits
    p, t = prompt_ids.shape[1], response_ids.shape[1]
    return logits[:, p - 1:p + t - 1]


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log pi(y_t | x, y_<t) in float32 (bf16 logits are upcast before the softmax, as inference engines do)."""
    return torch.log_softmax(logits.float(), -1).gather(-1, tokens[..., None]).squeeze(-1)


@torch.no_grad()
def generate(model, prompt_ids, prompt_mask, *, max_new_tokens: int, eos_id: int, pad_id: int,
             generator: torch.Generator | None, temperature: float = 1.0, greedy: bool = False):
    """Sample ``max_new_tokens`` tokens with a KV cache; all on the model's device, no host sync.

    Returns (response_ids, log_probs, mask), each [N, T]: tokens after the first eos are pad, their
    log-prob 0 and their mask 0; the eos itself is inside the mask. ``log_probs`` are those of the
    (temperature-scaled) sampling distribution in float32: log mu of the behaviour policy.
    """
    n = prompt_ids.shape[0]
    attn = prompt_mask
    out = model(input_ids=prompt_ids, attention_mask=attn, position_ids=position_ids(attn), use_cache=True)
    past, logits = out.past_key_values, out.logits[:, -1]
    pos = position_ids(attn)[:, -1:]
    alive = torch.ones(n, dtype=torch.bool, device=prompt_ids.device)
    tokens, log_probs, masks = [], [], []
    for _ in range(max_new_tokens):
        logp = torch.log_softmax(logits.float() / temperature, -1)
        if greedy:
            tok = logp.argmax(-1)
        else:
            tok = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        lp = logp.gather(-1, tok[:, None]).squeeze(-1)
        tokens.append(torch.where(alive, tok, torch.full_like(tok, pad_id)))
        log_probs.append(torch.where(alive, lp, torch.zeros_like(lp)))
        masks.append(alive)
        alive = alive & (tok != eos_id)
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], 1)
        pos = pos + 1
        out = model(input_ids=tokens[-1][:, None], attention_mask=attn, position_ids=pos, past_key_values=past,
                    use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1]
    return torch.stack(tokens, 1), torch.stack(log_probs, 1), torch.stack(masks, 1)


def pretrain(model, demos: tuple[torch.Tensor, torch.Tensor, torch.Tensor], *, steps: int, lr: float, batch: int,
             generator: torch.Generator) -> list[float]:
    """Brief supervised pre-training on demonstrations (cross-entropy on the answer tokens)."""
    ids, attn, loss_mask = demos
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    model.train()
    for _ in range(steps):
        idx = torch.randint(ids.shape[0], (batch,), generator=generator).to(ids.device)
        x, a, m = ids[idx], attn[idx], loss_mask[idx]
        logits = model(input_ids=x, attention_mask=a, position_ids=position_ids(a)).logits[:, :-1]
        lp = token_log_probs(logits, x[:, 1:])
        mm = m[:, 1:].to(lp.dtype)
        loss = -(lp * mm).sum() / mm.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [float(v) for v in torch.stack(losses).tolist()] if losses else []


def build_default_init(out_dir: Path, *, pairs, max_new_tokens: int, hidden: int, layers: int, heads: int,
                       steps: int, lr: float, batch: int, seed: int) -> Path:
    """Configure, initialise and pre-train the tiny model on CPU, cached in ``out_dir`` (reused when its
    ``pretrain.json`` records the same settings; written to a temporary directory, then renamed)."""
    import shutil

    from transformers import AutoModelForCausalLM

    meta = {"hidden": hidden, "layers": layers, "heads": heads, "steps": steps, "lr": lr, "batch": batch,
            "seed": seed, "problems": len(pairs), "max_new_tokens": max_new_tokens}
    stamp = out_dir / "pretrain.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("config") == meta:
        return out_dir
    torch.manual_seed(seed)
    tok = char_tokenizer()
    cfg = tiny_config(len(tok), hidden=hidden, layers=layers, heads=heads, max_positions=64)
    model = AutoModelForCausalLM.from_config(cfg)
    demos = task_mod.demonstrations(task_mod.encode(tok, pairs, max_new_tokens))
    losses = pretrain(model, demos, steps=steps, lr=lr, batch=batch, generator=torch.Generator().manual_seed(seed))
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    n_params = sum(p.numel() for p in model.parameters())
    (tmp / "pretrain.json").write_text(json.dumps({"config": meta, "parameters": n_params,
                                                   "final_loss": losses[-1] if losses else None}, indent=1))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir
