"""Convert a Hugging Face model folder or a GGUF file into perfcounter's layout.

    python scripts/convert_hf_checkpoint.py --model path/to/Llama-2-7b-hf --out_dir ckpt/llama-2-7b
    python scripts/convert_hf_checkpoint.py --model path/to/model.Q4_1.gguf --out_dir ckpt/smollm2

writes `model.safetensors` (gpt-fast names and layout, ModelArgs in its metadata),
`config.json` (the ModelArgs) and the tokenizer (tokenizer.model or tokenizer.json
+ tokenizer_config.json), each file atomically. GGUF weights are dequantized by
transformers. The result loads with `generate.py --model OUT_DIR`.
gpt-fast `model.pth` checkpoints convert too (give --model_name or --config when no
config.json lies beside them). --model names the checkpoint, as in every perfcounter command
(--checkpoint_dir, its old spelling, works for one release, with a note; beside it --model
keeps its old meaning, the preset giving a model.pth's config, now --model_name).
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without install

import torch  # noqa: E402

from perfcounter.cli.flags import Parser, add_deprecated, checkpoint_of  # noqa: E402
from perfcounter.models.loading import CheckpointError, convert_checkpoint  # noqa: E402
from perfcounter.models.args import UnknownModelError  # noqa: E402
from perfcounter.models.tokenizer import TokenizerError  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def main(*, checkpoint_dir: Path, out_dir: Path, dtype: str | None = None,
         model_name: str | None = None, config: Path | None = None,
         trust_remote_code: bool = False) -> Path:
    t0 = time.perf_counter()
    target = convert_checkpoint(checkpoint_dir, out_dir, dtype=DTYPES[dtype] if dtype else None,
                                model_name=model_name, config_path=config,
                                trust_remote_code=trust_remote_code)
    print(f"Wrote {target} and its config / tokenizer in {time.perf_counter() - t0:.1f} s")
    return target


if __name__ == "__main__":
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="Hugging Face model folder, "
                        ".gguf file, or gpt-fast model.pth (required)")
    add_deprecated(parser, "--checkpoint_dir", "--model", type=Path, default=None)
    parser.add_argument("--out_dir", type=Path, required=True, help="folder to write into")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="store the weights in this dtype (default: as read)")
    parser.add_argument("--model_name", default=None,
                        help="preset name giving the config of a model.pth")
    parser.add_argument("--config", type=Path, default=None, help="config.json to use")
    parser.add_argument("--trust_remote_code", action="store_true",
                        help="let transformers run code that comes with a checkpoint (off: refused)")
    args = vars(parser.parse_args())
    try:
        main(checkpoint_dir=checkpoint_of(parser, args, "checkpoint_dir"), **args)
    except (CheckpointError, TokenizerError, UnknownModelError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
