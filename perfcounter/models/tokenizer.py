"""Tokenizers behind one small interface: encode(text) -> ids, decode(ids) -> text.

Three kinds, found next to a checkpoint by `load_tokenizer(path)`:
- SentencePiece `tokenizer.model` (Llama-2, Mistral): BOS prepended, as gpt-fast does;
- Hugging Face `tokenizer.json` (Llama-3, Qwen2, SmolLM2) through the `tokenizers`
  library: special tokens added by the file's own post-processor; BOS / EOS names
  read from `tokenizer_config.json` when it is there;
- the tokenizer inside a GGUF file, through transformers' AutoTokenizer (never running a
  file's own code unless trust_remote_code=True).
`encode_prompt(tokenizer, text, vocab_size)` encodes a prompt for a model, refusing an
empty one and ids the model's embedding does not have.
"""
from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Optional, Sequence


class TokenizerError(ValueError):
    """A tokenizer file that is missing, unreadable or of an unknown kind."""


def offline_transformers():
    """transformers, never reaching the network (everything here is local files)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers  # deferred: heavy (seconds to import), off the import path
    return transformers


def cache_keyword(model) -> str:
    """The keyword a transformers model's forward takes its KV cache by, and its output
    returns it as: `cache` (transformers >= 5.2x), else `cache_params` (state-space
    models), else `past_key_values` (older releases)."""
    parameters = inspect.signature(model.forward).parameters
    return next((key for key in ("cache", "cache_params") if key in parameters),
                "past_key_values")


class Tokenizer:
    bos_id: Optional[int] = None
    eos_id: Optional[int] = None
    source: str = ""

    @property
    def vocab_size(self) -> Optional[int]:
        """Tokens the tokenizer knows (ids 0 .. vocab_size - 1), None when unknown."""
        return None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source!r})"


class SentencePieceTokenizer(Tokenizer):
    def __init__(self, path: str | os.PathLike):
        import sentencepiece as spm  # deferred: loaded only for a tokenizer of that kind
        self.source = str(path)
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.load(self.source)
        except (OSError, RuntimeError) as e:
            raise TokenizerError(f"{path}: not a readable SentencePiece model ({e})") from e
        self.bos_id = self.sp.bos_id() if self.sp.bos_id() >= 0 else None
        self.eos_id = self.sp.eos_id() if self.sp.eos_id() >= 0 else None

    @property
    def vocab_size(self) -> int:
        return self.sp.vocab_size()

    def encode(self, text: str) -> list[int]:
        ids = self.sp.encode(text)
        return ([self.bos_id] if self.bos_id is not None else []) + ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.sp.decode(list(ids))


class HFTokenizer(Tokenizer):
    def __init__(self, path: str | os.PathLike):
        from tokenizers import Tokenizer as _Tokenizer  # deferred: only for that tokenizer kind
        self.source = str(path)
        try:
            self.tok = _Tokenizer.from_file(self.source)
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise TokenizerError(f"{path}: not a readable Hugging Face tokenizer.json ({e})") from e
        special = _special_tokens(Path(path).with_name("tokenizer_config.json"))
        self.bos_id = self._id(special.get("bos_token"))
        self.eos_id = self._id(special.get("eos_token"))

    def _id(self, token) -> Optional[int]:
        if isinstance(token, dict):  # {"content": "<s>", ...} in older configs
            token = token.get("content")
        return self.tok.token_to_id(token) if isinstance(token, str) else None

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=True).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)


class TransformersTokenizer(Tokenizer):
    """Any tokenizer transformers can load; here for the one inside a GGUF file."""

    def __init__(self, tokenizer, source: str):
        self.tok, self.source = tokenizer, source
        self.bos_id, self.eos_id = tokenizer.bos_token_id, tokenizer.eos_token_id

    @property
    def vocab_size(self) -> int:
        return len(self.tok)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike,
                  trust_remote_code: bool = False) -> "TransformersTokenizer":
        path = Path(path)
        transformers = offline_transformers()
        try:
            tok = transformers.AutoTokenizer.from_pretrained(
                str(path.parent), gguf_file=path.name, local_files_only=True,
                trust_remote_code=trust_remote_code)
        except Exception as e:
            raise TokenizerError(f"{path}: could not read the GGUF file's tokenizer ({e})") from e
        return cls(tok, str(path))

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def save(self, out_dir: str | os.PathLike) -> None:
        self.tok.save_pretrained(str(out_dir))


def _special_tokens(config_path: Path) -> dict:
    if not config_path.is_file():
        return {}
    try:
        data = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{config_path}: not readable JSON ({e})") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{config_path}: expected a JSON object (bos_token, eos_token, ...), "
                             f"got {type(data).__name__}")
    return data


TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json")


def find_tokenizer(path: str | os.PathLike) -> Optional[Path]:
    """The tokenizer file at `path` or in the folder of a checkpoint file; None if none."""
    path = Path(path)
    if path.is_file() and path.name in TOKENIZER_FILES:
        return path
    folder = path if path.is_dir() else path.parent
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            return folder / name
    return None


def load_tokenizer(path: str | os.PathLike, *, trust_remote_code: bool = False) -> Tokenizer:
    """A tokenizer from a file (tokenizer.model, tokenizer.json, *.gguf) or a folder holding one."""
    path = Path(path)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise TokenizerError(f"{path}: no such GGUF file")
        return TransformersTokenizer.from_gguf(path, trust_remote_code=trust_remote_code)
    found = find_tokenizer(path)
    if found is None:
        raise TokenizerError(f"{path}: no tokenizer found; expected one of "
                             f"{', '.join(TOKENIZER_FILES)} there or next to the checkpoint")
    if found.name == "tokenizer.model":
        return SentencePieceTokenizer(found)
    return HFTokenizer(found)


def encode_prompt(tokenizer: Tokenizer, text: str, vocab_size: int) -> list[int]:
    """`text` as token ids for a model of `vocab_size` tokens; a TokenizerError for an empty
    prompt and for ids the model has no embedding for (a tokenizer that does not fit it)."""
    if not text:
        raise TokenizerError("the prompt is empty; give some text, or --prompt_length N for a "
                             "synthetic prompt")
    ids = tokenizer.encode(text)
    if not ids:
        raise TokenizerError(f"the prompt {text!r} encodes to no tokens with {tokenizer!r}")
    if max(ids) >= vocab_size:
        size = tokenizer.vocab_size
        raise TokenizerError(
            f"{tokenizer.source}: the prompt encodes to token id {max(ids)}, but the model has "
            f"vocab_size={vocab_size} (ids 0..{vocab_size - 1}); this tokenizer"
            f"{f' of {size} tokens' if size else ''} does not fit the checkpoint")
    return ids
