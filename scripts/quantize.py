"""Write a weight-only quantized checkpoint of perfcounter's model, as gpt-fast's quantize.py does.

    python scripts/quantize.py --model ckpt/llama-2-7b --mode int8
    python scripts/quantize.py --model ckpt/llama-2-7b --mode int4 --groupsize 32
    python generate.py --model ckpt/llama-2-7b/model_int4.g32.pth

reads any checkpoint generate.py reads (our folder or model.safetensors, a gpt-fast
model.pth, a Hugging Face folder, a GGUF file), quantizes every linear — the output layer
included, as gpt-fast does — and writes `model_int8.pth` or `model_int4.gG.pth` (gpt-fast's
names) beside it, or at --out. int8: an int8 weight and a scale per output channel (in the
checkpoint's dtype); int4: two 4-bit weights a byte ([N, K/2] uint8, the even column in the
low nibble) and bfloat16 scales and zeros per group ([K/G, N, 2]); perfcounter/quant/quantize.py
has the layouts. When no config.json lies beside the output, ours is written there, so
that the file loads on its own. A checkpoint that is already quantized is refused.
--model names the checkpoint, as in every perfcounter command (--checkpoint_path, its old
spelling, works for one release, with a note; beside it --model keeps its old meaning, the
preset giving a model.pth's config, now --model_name).
"""
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without install

import torch  # noqa: E402

from perfcounter.quant import quantize as quantization  # noqa: E402
from perfcounter._util import atomic_write  # noqa: E402
from perfcounter.cli.flags import Parser, add_deprecated, checkpoint_of  # noqa: E402
from perfcounter.models.loading import CheckpointError, build_model, read_checkpoint  # noqa: E402
from perfcounter.models.args import UnknownModelError  # noqa: E402
from perfcounter.models.tokenizer import TokenizerError  # noqa: E402

MODES = ("int8", "int4")


def output_path(checkpoint_path: Path, scheme: quantization.WeightScheme) -> Path:
    """gpt-fast's file name beside the checkpoint: model_int8.pth, model_int4.g32.pth."""
    folder = checkpoint_path if checkpoint_path.is_dir() else checkpoint_path.parent
    name = "model_int8.pth" if scheme.kind == "int8" else f"model_int4.g{scheme.group_size}.pth"
    return folder / name


def quantized_state(checkpoint_path, scheme, *, model_name=None, config=None,
                    trust_remote_code: bool = False):
    """(ModelArgs, the quantized state dict) of a float checkpoint."""
    args, state, _, source = read_checkpoint(checkpoint_path, model_name=model_name,
                                             config_path=config,
                                             trust_remote_code=trust_remote_code)
    have = quantization.scheme_of_state(state, source)
    if have is not None:
        raise quantization.QuantizeError(
            f"{source}: already quantized ({have.name}); --mode {scheme.name} needs a float "
            "checkpoint (valid: a bf16, fp16 or fp32 one)")
    model = build_model(args, state, source)
    quantization.quantize_model(model, scheme, tile=False)  # int4 kept in the stored layout
    return args, {k: v.contiguous() for k, v in model.state_dict().items()}


def main(*, checkpoint_path: Path, mode: str = "int8", groupsize: int | None = None,
         out: Path | None = None, model_name: str | None = None, config: Path | None = None,
         trust_remote_code: bool = False) -> Path:
    """Quantize `checkpoint_path` with `mode` (int8, int4 with `groupsize`); returns the file."""
    if mode not in MODES:
        raise quantization.QuantizeError(f"unknown --mode {mode!r}; valid: {', '.join(MODES)}")
    scheme = quantization.weight_scheme(mode, groupsize)
    t0 = time.perf_counter()
    args, state = quantized_state(checkpoint_path, scheme, model_name=model_name, config=config,
                                  trust_remote_code=trust_remote_code)
    target = Path(out) if out is not None else output_path(Path(checkpoint_path), scheme)
    atomic_write(target, writer=lambda tmp: torch.save(state, tmp), mkdir=True)
    if not (target.parent / "config.json").is_file():
        atomic_write(target.parent / "config.json",
                     json.dumps(dataclasses.asdict(args), indent=2) + "\n")
    size = sum(v.numel() * v.element_size() for v in state.values())
    print(f"Wrote {target} ({scheme.name}, {size / 1e9:.3f} GB of tensors) in "
          f"{time.perf_counter() - t0:.1f} s")
    return target


if __name__ == "__main__":
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None,
                        help="float checkpoint: our folder, model.safetensors, model.pth, a "
                             "Hugging Face folder or a .gguf file (required)")
    add_deprecated(parser, "--checkpoint_path", "--model", type=Path, default=None)
    parser.add_argument("--mode", default="int8", help="int8 or int4")
    parser.add_argument("--groupsize", type=int, default=None,
                        help="int4 group size: 32, 64, 128 (default) or 256")
    parser.add_argument("--out", type=Path, default=None,
                        help="file to write (default: model_int8.pth / model_int4.gG.pth beside "
                             "the checkpoint)")
    parser.add_argument("--model_name", default=None,
                        help="preset name giving the config of a model.pth")
    parser.add_argument("--config", type=Path, default=None, help="config.json to use")
    parser.add_argument("--trust_remote_code", action="store_true",
                        help="let transformers run code that comes with a checkpoint (off: refused)")
    cli = vars(parser.parse_args())
    try:
        main(checkpoint_path=checkpoint_of(parser, cli, "checkpoint_path"), **cli)
    except (quantization.QuantizeError, CheckpointError, TokenizerError, UnknownModelError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
