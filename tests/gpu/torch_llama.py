"""quantshadow GPU verification 3 and 4: a small Llama-architecture model from `transformers`.

    python3 tests/gpu/torch_llama.py OUT.json [--decode-steps 32] [--timing]

Built from a config with seeded random weights (no downloads), bf16 on the GPU. Runs a
prefill of a fixed random prompt and greedy decode steps; writes the generated tokens (so a
run under the shim can be compared with one without it) and, with --timing, tokens/s of the
prefill and of eager decode, measured apart (CUDA-synchronised wall time, median of trials).
Writes the names map for the report when QUANTSHADOW_NAMES is set.
"""
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import quantshadow_names  # noqa: E402


def build_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    return model


def greedy(model, prompt, steps):
    """Prefill + `steps` greedy steps with the KV cache; returns (tokens, prefill s, decode s)."""
    with torch.no_grad():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=prompt, use_cache=True)
        past = out.past_key_values
        nxt = out.logits[:, -1, :].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        tokens = [nxt]
        for _ in range(steps - 1):
            out = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past = out.past_key_values
            nxt = out.logits[:, -1, :].argmax(-1, keepdim=True)
            tokens.append(nxt)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
    return torch.cat(tokens, dim=1), t1 - t0, t2 - t1


def main():
    out_path = sys.argv[1]
    steps = int(sys.argv[sys.argv.index("--decode-steps") + 1]) if "--decode-steps" in sys.argv else 32
    timing = "--timing" in sys.argv
    model = build_model()
    quantshadow_names.write(model)
    g = torch.Generator(device="cuda").manual_seed(7)
    prompt = torch.randint(0, model.config.vocab_size, (1, 128), device="cuda", generator=g)
    tokens, _, _ = greedy(model, prompt, steps)
    result = {"tokens": tokens.flatten().tolist()}
    if timing:
        prefill, decode = [], []
        for _ in range(11):
            _, tp, td = greedy(model, prompt, steps)
            prefill.append(prompt.shape[1] / tp)
            decode.append((steps - 1) / td)
        result["prefill_tok_s"] = statistics.median(prefill)
        result["decode_tok_s"] = statistics.median(decode)
    with open(out_path, "w") as f:
        json.dump(result, f)
    print(json.dumps({k: v for k, v in result.items() if k != "tokens"} | {"n_tokens": len(result["tokens"])}))


if __name__ == "__main__":
    main()
