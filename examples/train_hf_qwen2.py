"""Train a Hugging Face ``Qwen2ForCausalLM`` from random init on synthetic tokens.

A Qwen2-class causal LM as many scripts train one: transformers' model class built from a
config (no download), AdamW, bf16 weights on the GPU, SDPA attention, a 151,936-token
vocabulary (the cross-entropy over it is a large share of the step). Default size: 16 layers,
hidden 1024, 16 query / 4 key-value heads, batch 4 × 2048 tokens, about 90 ms a step on an
H100. Its step times show a slow stretch some steps after the start (steps of 106–124 ms
among 89 ms ones on an H100), which a fixed three-step warm-up does not cover.

    python examples/train_hf_qwen2.py
    kerneltriage profile -- python examples/train_hf_qwen2.py
    python examples/train_hf_qwen2.py --tiny --device cpu        # seconds on a CPU, for tests

On several GPUs, under ``torchrun``: ``--parallel ddp`` wraps the model in
``DistributedDataParallel``; ``--parallel fsdp2`` shards each decoder layer and then the whole
model with ``torch.distributed.fsdp.fully_shard`` (FSDP2). Each rank draws its own tokens.

    torchrun --nproc-per-node 2 examples/train_hf_qwen2.py --parallel ddp
    kerneltriage profile -- torchrun --nproc-per-node 2 examples/train_hf_qwen2.py --parallel fsdp2

``KT_EXAMPLE_STATS=FILE`` appends, at exit, the step times (``stepstats.py``).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # stepstats.py, beside this file
from stepstats import StepStats


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=2816)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--parallel",
        choices=("none", "ddp", "fsdp2"),
        default="none",
        help="data parallelism under torchrun: DistributedDataParallel or FSDP2's fully_shard",
    )
    p.add_argument(
        "--adamw",
        choices=("auto", "fused", "default"),
        default="auto",
        help="auto: fused on a GPU, torch's default under FSDP2 (as many FSDP2 scripts leave it: "
        "a for-loop over its DTensor parameters); fused: fused everywhere; default: torch's default",
    )
    p.add_argument("--tiny", action="store_true", help="a model small enough for a CPU test")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads = 2, 64, 128, 4, 2
        args.vocab, args.seq, args.batch = 256, 32, 2
    return args


def build_model(args, device):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.seq,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    config.use_cache = False  # training: no KV cache
    with device:  # random init on the device itself
        model = Qwen2ForCausalLM(config)
    return model.to(dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)


def start_distributed(args) -> tuple[torch.device, int]:
    """The process group (NCCL on GPUs, gloo on the CPU), this rank's device and its rank."""
    import torch.distributed as dist

    cuda = args.device.startswith("cuda")
    dist.init_process_group("nccl" if cuda else "gloo")
    if not cuda:
        return torch.device("cpu"), dist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    return torch.device("cuda", local), dist.get_rank()


def wrap(model, args, device):
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:  # one all-gather / reduce-scatter group per decoder layer
        fully_shard(layer)
    fully_shard(model)  # the rest: embeddings (tied to the LM head), the final norm
    return model


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device, rank = (torch.device(args.device), 0) if args.parallel == "none" else start_distributed(args)
    model = build_model(args, device)
    model.train()
    if args.parallel != "none":
        model = wrap(model, args, device)
    # Fused AdamW on plain tensors. FSDP2's sharded (DTensor) parameters get torch's default,
    # which for them is a for-loop of small ops per parameter (foreach needs plain tensors);
    # fused AdamW takes DTensors too (--adamw fused).
    if args.adamw == "default" or device.type != "cuda":
        fused = None
    else:
        fused = args.adamw == "fused" or args.parallel != "fsdp2" or None
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=fused)
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1 + rank)
    stats = StepStats(device)
    loss = None
    for _ in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(
            device, non_blocking=True
        )
        loss = model(input_ids=ids, labels=ids).loss  # the model shifts the labels itself
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.step_done()
    print(f"final loss {loss.item():.4f}")
    if args.parallel != "none":
        import torch.distributed as dist

        dist.destroy_process_group()


if __name__ == "__main__":
    main()
