"""quantshadow GPU verification 3 and 4: a small Llama-architecture model from `transformers`.

    python3 tests/gpu/torch_llama.py OUT.json [--decode-steps 32] [--timing] [--graph] [--size small|8b-width]
        [--prompt TOKENS] [--trials N]

Built from a config with seeded random weights (no downloads), bf16 on the GPU. Runs a
prefill of a fixed random prompt and greedy decode steps; writes the generated tokens (so a
run under the shim can be compared with one without it) and, with --timing, tokens/s of the
prefill and of eager decode, measured apart (CUDA-synchronised wall time, median of trials).

--graph also decodes with a static KV cache (transformers' StaticCache), the decode step
captured once in a CUDA graph and replayed per token, as serving engines do: writes
`graph_tokens` and, with --timing, `decode_graph_tok_s`. The static cache keeps its position
on the device, so every replay advances by itself; the first decode step runs eagerly on a side
stream before the capture (PyTorch's warm-up recipe).

--size small (default): hidden 1024, 4 layers. --size 8b-width: Llama-8B's layer widths (hidden
4096, intermediate 14336, 32 heads, 8 KV heads) with 4 layers, so per-GEMM costs are those of a
real 8B decode step.
--graph-only times only the graph decode (no eager passes: faster A/B runs).
--prompt sets the prompt length (default 128), --trials the timing trials (default 11).
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

SIZES = {
    "small": dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=4),
    "8b-width": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8),
}


def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def build_model(size):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32000,
        num_hidden_layers=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        **SIZES[size],
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = LlamaForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()
    return model


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def greedy(model, prompt, steps):
    """Prefill + `steps` greedy steps with the KV cache; returns (tokens, prefill s, decode s)."""
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        out = model(input_ids=prompt, use_cache=True)
        past = out.past_key_values
        nxt = out.logits[:, -1, :].argmax(-1, keepdim=True)
        sync()
        t1 = time.perf_counter()
        tokens = [nxt]
        for _ in range(steps - 1):
            out = model(input_ids=nxt, past_key_values=past, use_cache=True)
            past = out.past_key_values
            nxt = out.logits[:, -1, :].argmax(-1, keepdim=True)
            tokens.append(nxt)
        sync()
        t2 = time.perf_counter()
    return torch.cat(tokens, dim=1), t1 - t0, t2 - t1


class GraphDecoder:
    """Greedy decode on a static KV cache with the step captured in a CUDA graph (or, with
    capture=False, the same static-cache steps run eagerly: the CPU check of this code path)."""

    def __init__(self, model, prompt, steps, capture=True):
        from transformers import StaticCache

        self.model, self.prompt, self.steps = model, prompt, steps
        self.cache = StaticCache(config=model.config, max_cache_len=prompt.shape[1] + steps + 8)
        self.ids = torch.zeros((1, 1), dtype=torch.long, device=prompt.device)
        self.graph = None
        with torch.no_grad():
            self.prefill()
            if capture:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    self.step()
                torch.cuda.current_stream().wait_stream(side)
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    self.step()
                sync()

    def prefill(self):
        self.cache.reset()
        out = self.model(input_ids=self.prompt, past_key_values=self.cache, use_cache=True)
        self.ids.copy_(out.logits[:, -1, :].argmax(-1, keepdim=True))

    def step(self):
        out = self.model(input_ids=self.ids, past_key_values=self.cache, use_cache=True)
        self.ids.copy_(out.logits[:, -1, :].argmax(-1, keepdim=True))

    def run(self):
        """Returns (tokens, prefill s, decode s)."""
        with torch.no_grad():
            sync()
            t0 = time.perf_counter()
            self.prefill()
            tokens = [self.ids.clone()]
            sync()
            t1 = time.perf_counter()
            for _ in range(self.steps - 1):
                if self.graph is not None:
                    self.graph.replay()
                else:
                    self.step()
                tokens.append(self.ids.clone())
            sync()
            t2 = time.perf_counter()
        return torch.cat(tokens, dim=1), t1 - t0, t2 - t1


def main():
    out_path = sys.argv[1]
    steps = int(arg("--decode-steps", 32))
    size = arg("--size", "small")
    timing = "--timing" in sys.argv
    model = build_model(size)
    quantshadow_names.write(model)
    device = model.device
    g = torch.Generator(device=device).manual_seed(7)
    prompt = torch.randint(0, model.config.vocab_size, (1, int(arg("--prompt", 128))), device=device, generator=g)
    tokens, _, _ = greedy(model, prompt, steps)
    result = {"size": size, "tokens": tokens.flatten().tolist()}
    decoder = None
    if "--graph" in sys.argv:
        decoder = GraphDecoder(model, prompt, steps, capture=torch.cuda.is_available())
        result["graph_tokens"] = decoder.run()[0].flatten().tolist()
    if timing:
        prefill, decode, decode_graph = [], [], []
        for _ in range(int(arg("--trials", 11))):
            if "--graph-only" not in sys.argv:
                _, tp, td = greedy(model, prompt, steps)
                prefill.append(prompt.shape[1] / tp)
                decode.append((steps - 1) / td)
            if decoder is not None:
                decode_graph.append((steps - 1) / decoder.run()[2])
        if prefill:
            result["prefill_tok_s"] = statistics.median(prefill)
            result["decode_tok_s"] = statistics.median(decode)
        if decode_graph:
            result["decode_graph_tok_s"] = statistics.median(decode_graph)
    with open(out_path, "w") as f:
        json.dump(result, f)
    quiet = {k: v for k, v in result.items() if not k.endswith("tokens")}
    print(json.dumps(quiet | {"n_tokens": len(result["tokens"])}))


if __name__ == "__main__":
    main()
