"""Pretraining throughput and MFU on one device: our three models vs transformers at the papers' sizes.

    python bench/gpu_throughput.py                      # on a GPU: bert-base, gpt1, t5-base; seq 128, 512
    python bench/gpu_throughput.py --preset tiny --seq-lens 32 --batch-tokens 256 --steps 2 --compile off

For each architecture (encoder + MLM, decoder + CLM, encoder-decoder + span corruption), sequence length
and compile setting: one training step (forward, backward, AdamW) of ours, timed over `--steps` steps
after `--warmup` with nothing read on the host in between, then the same step of the matching
transformers model (BertForMaskedLM, GPT2LMHeadModel, T5ForConditionalGeneration; SDPA attention) on the
same batch, in this process. Prints one JSON line per configuration: step time, tokens/s, peak device
memory and MFU (the project's FLOPs count of the step, models/flops.py, over the time, against the
device's bf16 peak), ours / reference as `ratio`, and the device by name.

Imports torch, the model code and transformers only, so that it runs on a machine with no pipeline
installed. On the CPU (CI runs the tiny line above) there is no peak to take MFU against, nor device
memory to read: those fields are null. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.config import PRESETS, ModelConfig  # noqa: E402
from models.flops import count_step_flops, peak_flops  # noqa: E402
from models.objectives.base import batch_generator  # noqa: E402
from models.pretraining import PretrainModule, TrainConfig, make_batch  # noqa: E402
from models.specs.architectures import ARCHITECTURES  # noqa: E402
from models.specs.objectives import OBJECTIVES  # noqa: E402

PAPER_PRESET = {"encoder": "bert-base", "decoder": "gpt1", "encoder_decoder": "t5-base"}
REFERENCE_NAMES = {
    "encoder": "BertForMaskedLM",
    "decoder": "GPT2LMHeadModel",
    "encoder_decoder": "T5ForConditionalGeneration",
}
VOCAB = 32000  # a multiple of 64, as tensor cores like it; between BERT's 30522 and GPT-1's 40478
Step = Callable[[], torch.Tensor]


def configs(arch: str, preset: str, seq_len: int, batch_size: int) -> tuple[ModelConfig, TrainConfig]:
    objective = ARCHITECTURES[arch].paper_objective
    size = {**PRESETS[preset], "max_len": max(seq_len, PRESETS[preset]["max_len"])}
    model = ModelConfig(arch=arch, vocab_size=VOCAB, **size)
    train = TrainConfig(
        arch=arch,
        objective=objective,
        # the recipe's settings (BERT's 15 % with 80/10/10, T5's 15 % in spans of 3), as params.yaml
        objective_params=OBJECTIVES[objective].Params(),
        seed=0,
        seq_len=seq_len,
        batch_size=batch_size,
        max_steps=1,
        accumulate=1,
        lr=1e-4,
        warmup_steps=0,
        schedule="constant",
        min_lr_ratio=1.0,
        weight_decay=0.01,
        beta1=0.9,
        beta2=0.98,
        sampling="random",
        val_batches=1,
    )
    return model, train


def batch_on(train: TrainConfig, device: torch.device) -> dict[str, torch.Tensor]:
    generator = batch_generator(0, 0)
    rows = torch.randint(107, VOCAB, (train.batch_size, train.row_length()), generator=generator)
    return {key: value.to(device) for key, value in make_batch(rows, train, generator, VOCAB).items()}


def training_step(
    loss_of: Callable[[], torch.Tensor], parameters, device: torch.device, precision: str
) -> Step:
    """One step of forward (`loss_of`, under autocast), backward and fused AdamW: the same for both sides."""
    optimizer = torch.optim.AdamW(parameters, lr=1e-4, betas=(0.9, 0.98), weight_decay=0.01, fused=True)

    def step() -> torch.Tensor:
        with autocast(device, precision):
            loss = loss_of()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def autocast(device: torch.device, precision: str):
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16-mixed" else nullcontext()


def ours(
    model: ModelConfig, train: TrainConfig, batch: dict, device: torch.device, precision: str, compiled: bool
) -> Step:
    module = PretrainModule(model, train, compile=compiled).to(device)
    module.configure_model()  # as the Trainer does: compiles the model and the loss when asked
    return training_step(lambda: module.training_loss(batch)[0], module.parameters(), device, precision)


def reference_model(model: ModelConfig):
    import transformers as tf

    tf.logging.set_verbosity_error()  # its notes on configs made from scratch

    d, layers, heads, ff = model.d_model, model.n_layers, model.n_heads, model.d_ff
    sdpa = {"attn_implementation": "sdpa"}
    if model.arch == "encoder":
        config = tf.BertConfig(
            vocab_size=VOCAB,
            hidden_size=d,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=ff,
            max_position_embeddings=model.max_len,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        return tf.AutoModelForMaskedLM.from_config(config, **sdpa)
    if model.arch == "decoder":
        config = tf.GPT2Config(
            vocab_size=VOCAB,
            n_embd=d,
            n_layer=layers,
            n_head=heads,
            n_inner=ff,
            n_positions=model.max_len,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=1,
            eos_token_id=2,
        )
        return tf.AutoModelForCausalLM.from_config(config, **sdpa)
    config = tf.T5Config(
        vocab_size=VOCAB,
        d_model=d,
        d_ff=ff,
        num_layers=layers,
        num_decoder_layers=model.decoder_layers,
        num_heads=heads,
        d_kv=d // heads,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=3,
    )
    return tf.AutoModelForSeq2SeqLM.from_config(config, **sdpa)


def reference(
    model: ModelConfig, batch: dict, device: torch.device, precision: str, compiled: bool
) -> tuple[Step, str]:
    net = reference_model(model).to(device).train()
    attention = net.config._attn_implementation
    if compiled:
        net.compile()
    ids = batch["input_ids"]
    if model.arch == "encoder":  # the same selected positions as ours, as -100-padded labels
        labels = torch.full(ids.shape, -100, dtype=torch.long, device=device)
        labels.view(-1)[batch["positions"]] = batch["labels"]
    elif model.arch == "decoder":
        labels = ids  # GPT-2 shifts the labels itself
    else:
        labels = batch["labels"]

    def loss() -> torch.Tensor:
        return net(input_ids=ids, labels=labels).loss

    return training_step(loss, net.parameters(), device, precision), attention


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step: Step, device: torch.device, warmup: int, steps: int, tokens: int, flops: int) -> dict:
    """Step time over `steps` steps queued back to back (read once at the end), tokens/s, peak memory, MFU."""
    for _ in range(warmup):
        step()
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    losses = [step() for _ in range(steps)]
    final = float(losses[-1])  # waits for the device: the clock stops when the last step is done
    seconds = (time.perf_counter() - start) / steps
    peak = peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {
        "step_ms": round(seconds * 1e3, 2),
        "tokens_per_s": round(tokens / seconds),
        "peak_memory_gib": None if memory is None else round(memory, 2),
        "mfu": None if peak is None else round(flops / seconds / peak, 4),
        "loss": round(final, 3),
    }


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    names = (
        [
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        ]
        if cpuinfo.exists()
        else []
    )
    return f"{names[0] if names else platform.machine()}, {torch.get_num_threads()} threads"


def measure(arch: str, preset: str, seq_len: int, compiled: bool, args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    model, train = configs(arch, preset, seq_len, max(1, args.batch_tokens // seq_len))
    batch = batch_on(train, device)
    tokens, flops = batch["input_ids"].numel(), count_step_flops(model, train)
    torch.manual_seed(0)
    step = ours(model, train, batch, device, args.precision, compiled)
    result = timed(step, device, args.warmup, args.steps, tokens, flops)
    del step
    release(device)
    step, attention = reference(model, batch, device, args.precision, compiled)
    reference_result = timed(step, device, args.warmup, args.steps, tokens, flops)
    del step
    release(device)
    return {
        "device": device_name(device),
        "arch": arch,
        "objective": train.objective,
        "preset": preset,
        "seq_len": seq_len,
        "batch_size": train.batch_size,
        "precision": args.precision,
        "compile": compiled,
        "step_flops": flops,
        "ours": result,
        "reference": {"model": REFERENCE_NAMES[arch], "attention": attention, **reference_result},
        "ratio": round(reference_result["step_ms"] / result["step_ms"], 2),
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--archs", nargs="+", default=list(PAPER_PRESET), choices=list(PAPER_PRESET))
    parser.add_argument("--preset", choices=list(PRESETS), help="one size for all (default: the papers')")
    parser.add_argument("--seq-lens", nargs="+", type=int, default=[128, 512])
    parser.add_argument(
        "--batch-tokens", type=int, default=32768, help="tokens per batch: the batch size is this / seq len"
    )
    parser.add_argument("--compile", choices=["both", "on", "off"], default="both")
    parser.add_argument("--precision", choices=["bf16-mixed", "32-true"], default="bf16-mixed")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation included)")
    args = parser.parse_args(argv)
    torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in fp32, as pretrain sets it
    compile_settings = {"both": [False, True], "on": [True], "off": [False]}[args.compile]
    for arch in args.archs:
        for seq_len in args.seq_lens:
            for compiled in compile_settings:
                line = measure(arch, args.preset or PAPER_PRESET[arch], seq_len, compiled, args)
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
